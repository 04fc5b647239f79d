"""Pagination for list endpoints."""

from rest_framework.pagination import PageNumberPagination


class DefaultPagination(PageNumberPagination):
    """`?page=N&page_size=M` (page_size at most 500)."""

    page_size_query_param = "page_size"
    max_page_size = 500

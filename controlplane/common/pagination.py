"""Pagination for list endpoints."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request


class DefaultPagination(PageNumberPagination):
    """`?page=N&page_size=M`: M is a whole number >= 1, and a larger one than 500 gets 500. A
    `page_size` that is not such a number is a 400 naming it (not silently the default size); a
    page past the last is a 404."""

    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if size < 1 or not raw.strip().lstrip("+").isdigit():
            message = f"must be a whole number from 1 (larger than {self.max_page_size} gets {self.max_page_size})"
            raise exceptions.ValidationError({self.page_size_query_param: [message]})
        return min(size, self.max_page_size)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"]["minimum"] = 1
                parameter["description"] = (f"Number of results per page, from 1; more than "
                                            f"{self.max_page_size} gets {self.max_page_size}.")
            elif parameter["name"] == self.page_query_param:
                parameter["schema"]["minimum"] = 1
        return parameters

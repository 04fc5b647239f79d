"""A path under /api/ that no route matches is answered in the API's error shape (JSON), like every
other API error, instead of Django's HTML "Not Found" page: a client reading `detail` gets it there
too, and the answer matches the schema's documented 404 body."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

API_PREFIX = "/api/"


class ApiNotFoundMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (response.status_code == 404 and request.path.startswith(API_PREFIX)
                and not response.get("Content-Type", "").startswith("application/json")):
            message = f"no API route {request.path!r}"
            return JsonResponse({"detail": message, "errors": {}}, status=404)
        return response

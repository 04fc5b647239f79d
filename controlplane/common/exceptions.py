"""API error format: `{"detail": "...", "errors": {"field": ["message", ...]}}`."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from controlplane.common.errors import DomainError


def _flatten(detail: Any) -> Any:
    if isinstance(detail, dict):
        return {key: _flatten(value) for key, value in detail.items()}
    if isinstance(detail, list):
        return [_flatten(v) for v in detail]
    return str(detail)


def _summary(errors: dict[str, Any]) -> str:
    parts = []
    for field, messages in errors.items():
        first = messages[0] if isinstance(messages, list) and messages else messages
        if isinstance(first, dict):
            first = "invalid nested value"
        parts.append(f"{field}: {first}")
    return "; ".join(parts)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler that always names the offending field in `detail`."""
    if isinstance(exc, DomainError):
        errors = {exc.field: [exc.message]} if exc.field else {}
        return Response({"detail": exc.message, "errors": errors}, status=exc.status_code)
    if isinstance(exc, ObjectDoesNotExist):
        # A row the request refers to went away after the request was authorised (e.g. an instance
        # deleted while its agent polls): that is "not found", not a server error.
        return Response({"detail": f"{exc}", "errors": {}}, status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "message_dict"):
            exc = exceptions.ValidationError(exc.message_dict)
        else:
            exc = exceptions.ValidationError({"non_field_errors": exc.messages})
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        data = exc.detail
        errors = _flatten(data) if isinstance(data, dict) else {"non_field_errors": _flatten(data)}
        response.data = {"detail": _summary(errors) or "invalid input", "errors": errors}
        response.status_code = status.HTTP_400_BAD_REQUEST
    elif isinstance(response.data, dict) and "detail" in response.data:
        response.data = {"detail": str(response.data["detail"]), "errors": {}}
    return response

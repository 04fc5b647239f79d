"""The OpenAPI schema's shared rules, one owner each: every operation documents the error answers
the API can give it (the body shape of `common/exceptions.py`), and a body is documented as JSON
unless the view takes files (a view that sets its own `parser_classes`).

`ApiAutoSchema` is `REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]`. A view's own `extend_schema(responses=)`
still wins for its description of a code; this class only fills in the codes it leaves out and
gives every error answer its body schema."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers
from rest_framework.settings import api_settings

from controlplane.common.fields import CharField


class ApiErrorSerializer(serializers.Serializer):
    """Every 4xx answer: a one-line summary and the messages per field (flattened paths such as
    `samples[3].loss`; empty when no one field is at fault)."""

    detail = CharField()
    errors = serializers.DictField(child=serializers.ListField(child=CharField()))


# Answers any operation may give, with what they mean here.
ERROR_RESPONSES: dict[str, str] = {
    "400": "A bad parameter or body field, named in `errors`.",
    "401": "No credentials, or a bad, revoked or expired token.",
    "403": "The credentials do not allow this (the role, or an agent token on a user route).",
    "404": "No such object among your teams' (another team's is not found either), or a page past the last.",
    "429": "Too many requests from this principal; `Retry-After` says when to try again.",
}
# Answers of operations that change state: the object's current state forbids the change.
WRITE_ERROR_RESPONSES: dict[str, str] = {
    "409": "The object's current state forbids this (named in `detail`).",
    "415": "A body in a content type the operation does not take.",
}
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON = "application/json"


class ApiAutoSchema(AutoSchema):
    def _error_codes(self) -> dict[str, str]:
        codes = dict(ERROR_RESPONSES)
        if self.method in WRITE_METHODS:
            codes.update(WRITE_ERROR_RESPONSES)
        return codes

    def _get_response_bodies(self, direction: str = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        error_body = self._get_response_for_code(ApiErrorSerializer, "400", direction=direction)["content"]
        for code, description in self._error_codes().items():
            answer = responses.setdefault(code, {"description": description})
            if not answer.get("content"):
                answer["content"] = error_body
        for code, answer in responses.items():
            if code.startswith("4") and not answer.get("content"):
                answer["content"] = error_body
        return responses

    def _map_serializer_field(self, field: Any, direction: str, bypass_extensions: bool = False) -> dict[str, Any]:
        """drf-spectacular leaves out that a list or dict may not be empty (`allow_empty=False`) and a
        nested list serializer's bounds; the server refuses what breaks them, so the schema says so."""
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if schema.get("type") == "array":
            if getattr(field, "allow_empty", True) is False:
                schema["minItems"] = max(schema.get("minItems", 0), 1)
            if isinstance(field, serializers.ListSerializer):
                if field.min_length is not None:
                    schema["minItems"] = max(schema.get("minItems", 0), field.min_length)
                if field.max_length is not None:
                    schema["maxItems"] = field.max_length
        elif (schema.get("type") == "object" and isinstance(field, serializers.DictField)
              and getattr(field, "allow_empty", True) is False):
            schema["minProperties"] = 1
        return schema

    def map_parsers(self) -> list[Any]:
        """JSON for the API's own default parsers (they also read forms, which cannot carry a null
        or a nested object, so a form is not a documented way to call it); a view that sets its own
        parsers (the file uploads) documents those."""
        if type(self.view).parser_classes is api_settings.DEFAULT_PARSER_CLASSES:
            return [JSON]
        return super().map_parsers()

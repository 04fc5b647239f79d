"""Shared API building blocks that know no app: error flattening, validated input and query
parameters, named choices and JSON-object fields (the lists' query filters are django-filter
FilterSets: common/filters.py). Who may see what (teams, agents) is accounts' (`accounts.api.access`).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent, build_choice_field
from drf_spectacular.utils import extend_schema_field
from rest_framework import exceptions, serializers
from rest_framework.request import Request


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Turn DRF's nested error structure into `{"samples[3].loss": ["..."]}` so every message
    names the exact field, however deep it sits."""
    flat: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            if isinstance(key, int):  # DRF reports a ListSerializer's errors by item index
                name = f"{prefix}[{key}]"
            elif not prefix:
                name = str(key)
            else:
                name = prefix if key == "non_field_errors" else f"{prefix}.{key}"
            for sub, messages in flatten_errors(value, name).items():
                flat.setdefault(sub, []).extend(messages)
    elif isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            if detail:
                flat[prefix or "non_field_errors"] = [str(item) for item in detail]
        else:
            for index, item in enumerate(detail):
                for sub, messages in flatten_errors(item, f"{prefix}[{index}]").items():
                    flat.setdefault(sub, []).extend(messages)
    else:
        flat[prefix or "non_field_errors"] = [str(detail)]
    return flat


def validate_or_400(serializer: serializers.BaseSerializer) -> Any:
    """Validate and return `validated_data`, raising a 400 whose field names are flattened paths."""
    if not serializer.is_valid():
        raise exceptions.ValidationError(flatten_errors(serializer.errors))
    return serializer.validated_data


def validated_query(serializer_class: type[serializers.Serializer], request: Request) -> Any:
    """The query parameters of a report or computation (not a list's filters: those are FilterSets,
    common/filters.py) validated by `serializer_class`; parameters it does not know are ignored."""
    known = set(serializer_class().fields)
    return validate_or_400(serializer_class(data={k: request.query_params.get(k) for k in request.query_params
                                                  if k in known}))


class NamedChoiceField(serializers.ChoiceField):
    """A ChoiceField documented as its own named enum component (`enum_name`). drf-spectacular
    otherwise names enums after the field, and two models with a `kind` field of different choices
    collide (a schema warning)."""

    def __init__(self, *args: Any, enum_name: str, **kwargs: Any) -> None:
        self.enum_name = enum_name
        super().__init__(*args, **kwargs)


class NamedChoiceFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "controlplane.common.api.NamedChoiceField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict:
        field = self.target
        schema = build_choice_field(field)
        schema.pop("x-spec-enum-id", None)  # keeps the enum post-processing hook away from it
        if None in schema["enum"]:
            schema["enum"].remove(None)  # nullability is the field's, added around the reference
        component = ResolvedComponent(
            name=field.enum_name, type=ResolvedComponent.SCHEMA, object=field.enum_name, schema=schema
        )
        auto_schema.registry.register_on_missing(component)
        return component.ref


@extend_schema_field({"type": "object", "additionalProperties": {}})
class JSONObjectField(serializers.JSONField):
    """A JSON object (not null, a list or a scalar), documented as one."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        return value

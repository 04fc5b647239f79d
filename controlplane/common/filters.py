"""Query-parameter filters of the API's lists: django-filter FilterSets, and the few filter types
they share.

Each list view names its FilterSet (`filterset_class`; `filterset_classes` maps nested list
actions such as `/jobs/{id}/metrics/` to theirs) and uses `FilterBackend`. A value a filter cannot
take (`?status=bogus`, `?team=2**70`, `?active=sometimes`) answers 400 whose `errors` name the
parameter (DjangoFilterBackend raises a ValidationError, common/exceptions.py shapes it), never a
silently empty list. An empty value (`?status=`) filters nothing, as django-filter does everywhere.
Team scoping is never a filter: it is each view's queryset (common/api.py), which the filters only
narrow. drf-spectacular documents every filter from the FilterSet.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

import django_filters
from django import forms
from django.db.models import Q, QuerySet
from django.utils import timezone
from django_filters import rest_framework as filters
from django_filters.constants import EMPTY_VALUES
from drf_spectacular.utils import extend_schema_field
from rest_framework.fields import BooleanField as DrfBooleanField

from controlplane.common.limits import MAX_COUNT, MAX_ID


class FilterBackend(filters.DjangoFilterBackend):
    """DjangoFilterBackend whose FilterSet is chosen per action: `view.filterset_classes[action]`
    for nested lists, else `view.filterset_class` on the plain list action only (a detail route's
    queryset is never filtered by the list's parameters)."""

    def get_filterset_class(self, view: Any, queryset: QuerySet | None = None) -> type[filters.FilterSet] | None:
        action = getattr(view, "action", None)
        per_action = getattr(view, "filterset_classes", {})
        if action in per_action:
            return per_action[action]
        if action not in (None, "list"):
            return None
        return super().get_filterset_class(view, queryset)


class StrictBooleanField(forms.Field):
    """A boolean query parameter: the spellings DRF's BooleanField accepts (true/false, 1/0, yes/no,
    on/off, ...); anything else is an error (Django's NullBooleanField would read it as "no filter")."""

    default_error_messages = {"invalid": "Must be a valid boolean."}

    def to_python(self, value: Any) -> bool | None:
        if value in EMPTY_VALUES:
            return None
        text = str(value).strip().lower()  # DRF lowercases too
        if text in DrfBooleanField.TRUE_VALUES:
            return True
        if text in DrfBooleanField.FALSE_VALUES:
            return False
        raise forms.ValidationError(self.error_messages["invalid"], code="invalid")


class BooleanFilter(django_filters.BooleanFilter):
    # django_filters.rest_framework's BooleanFilter reads any spelling but true/false as no value.
    field_class = StrictBooleanField


class UtcDateTimeFilter(filters.IsoDateTimeFilter):
    """An ISO 8601 date-time compared in UTC. Python parses offsets PostgreSQL refuses (beyond
    +-15:59, such as `-17:47`: a 500 there), so the value is normalised to UTC before the query;
    one that leaves the calendar in UTC (past year 9999, before year 1) bounds everything or nothing."""

    def filter(self, qs: QuerySet, value: Any) -> QuerySet:
        if value is not None and value.tzinfo is not None:
            try:
                value = value.astimezone(UTC)
            except OverflowError:  # past year 9999 (a negative offset) or before year 1 (a positive one)
                after_the_end = value.utcoffset().total_seconds() < 0
                lower_bound = self.lookup_expr in ("gte", "gt")
                return qs.none() if after_the_end == lower_bound else qs
        return super().filter(qs, value)


class _IntegerFilter(filters.NumberFilter):
    field_class = forms.IntegerField  # NumberFilter's DecimalField would take 1.5 and filter on 1


def integer_filter(field_name: str, *, min_value: int = 0, max_value: int = MAX_COUNT,
                   help_text: str | None = None, **kwargs: Any) -> filters.NumberFilter:
    """An integer parameter in [min_value, max_value], documented with its bounds."""
    schema: dict[str, Any] = {"type": "integer", "minimum": min_value, "maximum": max_value}
    if max_value > MAX_COUNT:
        schema["format"] = "int64"
    if help_text:
        schema["description"] = help_text
    field = _IntegerFilter(field_name=field_name, min_value=min_value, max_value=max_value,
                           help_text=help_text, **kwargs)
    return extend_schema_field(schema)(field)


def id_filter(field_name: str, help_text: str | None = None) -> filters.NumberFilter:
    """A primary key parameter (`?team=`, `?job=`): 1..MAX_ID, a 400 outside."""
    return integer_filter(field_name, min_value=1, max_value=MAX_ID, help_text=help_text)


def char_filter(field_name: str | None = None, *, max_length: int, help_text: str | None = None,
                **kwargs: Any) -> filters.CharFilter:
    """A string parameter of at most `max_length` characters (longer: 400), documented with it."""
    schema: dict[str, Any] = {"type": "string", "maxLength": max_length}
    if help_text:
        schema["description"] = help_text
    field = filters.CharFilter(field_name=field_name, max_length=max_length, help_text=help_text, **kwargs)
    return extend_schema_field(schema)(field)


def search_filter(*fields: str) -> filters.CharFilter:
    """`?search=`: a case-insensitive substring of any of `fields`."""

    def search(queryset: QuerySet, name: str, value: str) -> QuerySet:
        query = Q()
        for field in fields:
            query |= Q(**{f"{field}__icontains": value})
        return queryset.filter(query)

    return char_filter(method=search, max_length=100, help_text=f"Case-insensitive match on {', '.join(fields)}.")


class OrderingFilter(filters.OrderingFilter):
    """`?ordering=`: django-filter's (one or more listed keys, comma-separated, `-` for descending),
    then the id in the last key's direction, so pages of equal keys never overlap."""

    def __init__(self, *fields: str, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "Sort keys, comma-separated; prefix '-' for descending.")
        super().__init__(fields=fields, **kwargs)

    def filter(self, qs: QuerySet, value: Any) -> QuerySet:
        if value in EMPTY_VALUES:
            return qs
        ordering = [self.get_ordering_value(param) for param in value]
        return qs.order_by(*ordering, "-id" if ordering[-1].startswith("-") else "id")


def live_filter(help_text: str = "true: neither revoked nor expired; false: the rest.") -> BooleanFilter:
    """`?active=` on rows with `revoked_at` and `expires_at` (tokens, webhook credentials)."""

    def active(queryset: QuerySet, name: str, value: bool) -> QuerySet:  # `bool`: the schema's type
        live = Q(revoked_at__isnull=True) & (Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
        return queryset.filter(live) if value else queryset.exclude(live)

    return BooleanFilter(method=active, help_text=help_text)

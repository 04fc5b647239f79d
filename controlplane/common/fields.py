"""The API's string fields: DRF's, except that a string field takes only a JSON string.

DRF's CharField turns a number into its text (`{"name": 0}` becomes the name "0"); a client that
sends a number where the schema says string has a bug we should tell it about, not a value we
should store. Every serializer takes its string fields from here (ruff's TID251 bans DRF's own in
the project), and `ModelSerializer` maps model text columns to them."""

from __future__ import annotations

from typing import Any

from django.db import models
from rest_framework import serializers


class StrictString:
    """Refuse anything but a str with the field's `invalid` message ("Not a valid string.", or the
    slug's and the e-mail address's own)."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class CharField(StrictString, serializers.CharField):  # noqa: TID251 (the one subclass)
    pass


class SlugField(StrictString, serializers.SlugField):  # noqa: TID251
    pass


class EmailField(StrictString, serializers.EmailField):  # noqa: TID251
    pass


class URLField(StrictString, serializers.URLField):  # noqa: TID251
    pass


class IPAddressField(StrictString, serializers.IPAddressField):  # noqa: TID251
    pass


class ModelSerializer(serializers.ModelSerializer):  # noqa: TID251
    """DRF's ModelSerializer with model text columns mapped to the strict fields above."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,  # noqa: TID251
        models.CharField: CharField,
        models.TextField: CharField,
        models.SlugField: SlugField,
        models.EmailField: EmailField,
        models.URLField: URLField,
        models.GenericIPAddressField: IPAddressField,
    }

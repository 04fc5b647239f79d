"""The API's string fields take only JSON strings (controlplane/common/fields.py): a number, a
boolean or a list where a string belongs is a 400 naming the field, never stored as its text.
The bad-input tables of the token, job and team endpoints carry cases of their own."""

from __future__ import annotations

import pytest
from django.urls import get_resolver
from rest_framework import serializers

from controlplane.common.fields import (
    CharField,
    EmailField,
    IPAddressField,
    ModelSerializer,
    SlugField,
    StrictString,
    URLField,
)
from controlplane.fleet.models import Instance
from controlplane.webhooks.models import AlertEndpoint
from tests.controlplane.api_helpers import make_team_world

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("field", [CharField(), SlugField(), EmailField(), URLField(), IPAddressField()],
                         ids=["char", "slug", "email", "url", "ip"])
@pytest.mark.parametrize("value", [0, 1.5, True, ["a"], {"a": "b"}])
def test_a_string_field_refuses_what_is_not_a_string(field, value):
    with pytest.raises(serializers.ValidationError):
        field.run_validation(value)


def test_model_serializers_map_text_columns_to_the_strict_fields():
    class Endpoint(ModelSerializer):
        class Meta:
            model = AlertEndpoint
            fields = ["url", "signing_secret"]  # a URLField and a CharField column

    assert all(isinstance(f, StrictString) for f in Endpoint().fields.values())


def _api_serializers() -> list[type[serializers.BaseSerializer]]:
    get_resolver().url_patterns  # noqa: B018 (loads every view module, and so every serializer)
    found, todo = [], [serializers.BaseSerializer]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith(("controlplane.", "frontend.")) and sub is not ModelSerializer:
                found.append(sub)
    return found


def _writable_string_fields(serializer: serializers.BaseSerializer, path: str):
    if isinstance(serializer, serializers.ListSerializer):
        yield from _writable_string_fields(serializer.child, path + "[]")
        return
    for name, field in serializer.fields.items():
        here = f"{path}.{name}"
        while isinstance(field, serializers.ListField | serializers.DictField):
            field, here = field.child, here + "[]"
        if isinstance(field, serializers.BaseSerializer):
            yield from _writable_string_fields(field, here)
        elif isinstance(field, serializers.CharField) and not field.read_only:  # noqa: TID251 (what to find)
            yield here, field


def test_every_string_field_of_every_api_serializer_is_strict():
    classes = _api_serializers()
    assert len(classes) > 40  # the walk found the API's serializers
    loose = [path for cls in classes for path, field in _writable_string_fields(cls(), cls.__qualname__)
             if not isinstance(field, StrictString)]
    assert loose == []


@pytest.fixture
def world():
    return make_team_world()


def test_a_number_as_an_alert_url_is_400(world):
    response = world.admin_client.post("/api/v1/alert-endpoints/", {"url": 443}, format="json")
    assert response.status_code == 400 and "url" in response.json()["errors"], response.content
    assert not AlertEndpoint.objects.exists()


def test_a_number_as_a_member_name_is_400(world):
    response = world.admin_client.post(f"/api/v1/teams/{world.team.pk}/members/", {"username": 42}, format="json")
    assert response.status_code == 400 and "username" in response.json()["errors"], response.content


def test_a_number_as_a_termination_reason_is_400_and_ends_nothing(world):
    response = world.admin_client.post(f"/api/v1/instances/{world.instance.pk}/terminate/", {"reason": 7},
                                       format="json")
    assert response.status_code == 400 and "reason" in response.json()["errors"], response.content
    assert Instance.objects.get(pk=world.instance.pk).state == world.instance.state

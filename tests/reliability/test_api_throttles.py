"""API throttles (issue 21: "the API has no throttles (/plans/, /agents/enroll/)"): DRF's throttles
on the shared cache, per principal (a user, one agent, an anonymous IP), rates from tunables, 429
with Retry-After, and a cache outage lets requests through instead of failing them."""

from __future__ import annotations

import logging

import pytest
from django.core.cache import cache

from controlplane.common import throttles
from tests.reliability.world import make_world

pytestmark = pytest.mark.django_db


def _forget(*idents: str) -> None:
    """Counts live in a cache shared across runs: start each principal from zero."""
    for scope in ("api", "plans"):
        for ident in idents:
            cache.delete(throttles.ApiRateThrottle.cache_format % {"scope": scope, "ident": ident})


def test_plans_are_throttled_per_user_with_retry_after(settings):
    settings.SPOTPIPE_THROTTLE_PLANS = "3/minute"
    world = make_world()
    _forget(f"user-{world.member_a.pk}", f"user-{world.member_b.pk}")
    member_a = world.api_client("member_a")
    answers = [member_a.post("/api/v1/plans/", {}, content_type="application/json").status_code for _ in range(4)]
    assert answers == [400, 400, 400, 429]  # refused inputs still ran the view, so they count
    refused = member_a.post("/api/v1/plans/", {}, content_type="application/json")
    assert refused.status_code == 429 and 0 < int(refused["Retry-After"]) <= 60
    assert "throttled" in refused.json()["detail"].lower()
    # Another user has a budget of their own, and the plans rate does not touch other endpoints.
    assert world.api_client("member_b").post("/api/v1/plans/", {}, content_type="application/json").status_code == 400
    assert member_a.get("/api/v1/jobs/").status_code == 200


def test_each_agent_has_its_own_budget(settings):
    """A team's fleet of agents shares one team, never one budget: the key is the instance."""
    settings.SPOTPIPE_THROTTLE_API = "4/minute"
    world = make_world()
    _forget(f"agent-{world.instance.pk}", f"agent-{world.other_instance.pk}")
    own = world.api_client("agent_own")
    path = f"/api/v1/instances/{world.instance.pk}/"
    assert [own.get(path).status_code for _ in range(5)] == [200, 200, 200, 200, 429]
    other = world.api_client("agent_other")
    assert other.get(f"/api/v1/instances/{world.other_instance.pk}/").status_code == 200


def test_a_rate_of_zero_turns_a_throttle_off(settings):
    settings.SPOTPIPE_THROTTLE_PLANS = "0"
    settings.SPOTPIPE_THROTTLE_API = "0"
    world = make_world()
    member_a = world.api_client("member_a")
    assert {member_a.post("/api/v1/plans/", {}, content_type="application/json").status_code
            for _ in range(5)} == {400}


def test_an_unreachable_cache_lets_api_requests_through_and_says_so(settings, monkeypatch, caplog):
    settings.SPOTPIPE_THROTTLE_API = "1/minute"
    world = make_world()

    def down(*args, **kwargs):
        raise ConnectionError("cache server restarting")

    monkeypatch.setattr(throttles.ApiRateThrottle, "cache", type("Down", (), {"get": down, "set": down})())
    member_a = world.api_client("member_a")
    with caplog.at_level(logging.WARNING, logger="controlplane.common.throttles"):
        assert [member_a.get("/api/v1/jobs/").status_code for _ in range(3)] == [200, 200, 200]
    assert "cache unreachable" in caplog.text

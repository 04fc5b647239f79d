# ruff: noqa: F811 - pytest fixtures shared with test_webhooks_aws.py are parameters here
"""SNS replay (issue 21): a correctly signed message is refused (401 naming `Timestamp`) when its
Timestamp is older than SPOTPIPE_SNS_MAX_AGE_S or ahead of our clock by more than the skew
allowed, so a captured message cannot be sent again later. The signature covers the Timestamp, so
it cannot be refreshed without SNS's key."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from controlplane.fleet.models import InterruptionNotice
from controlplane.webhooks import sns
from tests.controlplane.test_webhooks_aws import (  # noqa: F401 - fixtures
    _isolated,
    local_aws,
    post_sns,
    samples,
    signing_key,
    sns_message,
    sns_topic,
    team,
)

pytestmark = pytest.mark.django_db


def _iso(delta_s: float) -> str:
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=delta_s)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _post(client, local_aws, signing_key, samples, timestamp: str, type_: str = "Notification"):
    fields = {"Message": json.dumps(samples["warning"])} if type_ == "Notification" else {}
    message = sns_message(local_aws, signing_key[0], type_, Timestamp=timestamp, **fields)
    return post_sns(client, message)


def test_an_old_signed_notification_is_refused(client, samples, local_aws, signing_key, sns_topic):
    response = _post(client, local_aws, signing_key, samples, _iso(-2 * 3600))
    assert response.status_code == 401, response.content
    assert "Timestamp" in response.json()["errors"]
    assert "replay window" in response.json()["detail"]
    assert InterruptionNotice.objects.count() == 0


def test_an_old_subscription_confirmation_is_not_confirmed(client, samples, local_aws, signing_key, sns_topic):
    response = _post(client, local_aws, signing_key, samples, _iso(-2 * 3600), type_="SubscriptionConfirmation")
    assert response.status_code == 401
    assert not [path for path in local_aws.gets if "ConfirmSubscription" in path]


def test_a_timestamp_from_the_future_is_refused(client, samples, local_aws, signing_key, sns_topic):
    response = _post(client, local_aws, signing_key, samples, _iso(3600))
    assert response.status_code == 401 and "future" in response.json()["detail"]


def test_a_fresh_message_and_one_inside_the_window_are_accepted(client, samples, local_aws, signing_key, sns_topic):
    assert _post(client, local_aws, signing_key, samples, _iso(-50 * 60)).status_code == 202
    # A little clock skew is fine (the same event again: 200, a duplicate, not a refusal).
    assert _post(client, local_aws, signing_key, samples, _iso(60)).status_code == 200


def test_the_window_is_a_setting(client, samples, local_aws, signing_key, sns_topic, settings):
    settings.SPOTPIPE_SNS_MAX_AGE_S = 60
    response = _post(client, local_aws, signing_key, samples, _iso(-120))
    assert response.status_code == 401 and "60 s" in response.json()["detail"]


@pytest.mark.parametrize("value", ["", "yesterday", "2026-11-20T14:02:01", 17])
def test_a_malformed_timestamp_is_refused(value):
    with pytest.raises(sns.SnsError) as refused:
        sns.check_timestamp(value)
    assert refused.value.field == "Timestamp"

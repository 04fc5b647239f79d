"""The enrolment key of an acquisition's nodes: derived from its request token, never stored."""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

from controlplane.orchestration.models import Acquisition


def _key_mac(request_token: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), f"enroll:{request_token}".encode(), hashlib.sha256).hexdigest()[:40]


def acquisition_enroll_key(*, acquisition: Acquisition) -> str:
    """The key a node of this acquisition enrols with: derived (HMAC of the request token), never
    stored, so a retried launch renders the same user-data."""
    return f"{acquisition.pk}.{_key_mac(acquisition.request_token)}"


def acquisition_from_enroll_key(*, key: str) -> Acquisition | None:
    acq_id, _, mac = key.partition(".")
    # ASCII only: "²".isdigit() is true but int() refuses it, and compare_digest refuses a str
    # with non-ASCII characters; either would be a 500 for a made-up key.
    if not (key.isascii() and acq_id.isdigit() and mac):
        return None
    acquisition = Acquisition.objects.select_related("job").filter(pk=int(acq_id)).first()
    if acquisition is None or not hmac.compare_digest(mac, _key_mac(acquisition.request_token)):
        return None
    return acquisition

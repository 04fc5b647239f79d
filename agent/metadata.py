"""Watchers of the VM's metadata endpoint for interruption notices, one per cloud, each speaking
the cloud's real protocol:

- AWS IMDSv2: a session token from `PUT /latest/api/token`, then `GET
  /latest/meta-data/spot/instance-action` (404 until a notice; then `{"action", "time"}`) and
  `GET /latest/meta-data/events/recommendations/rebalance` (`{"noticeTime"}`).
- GCP: `GET /computeMetadata/v1/instance/preempted?wait_for_change=true` with
  `Metadata-Flavor: Google` returns `TRUE` when the VM is being preempted (30 s before it goes).
- Azure: `GET /metadata/scheduledevents?api-version=2020-07-01` with `Metadata: true`; a `Preempt`
  event with its `NotBefore` time.

`poll()` returns the notices seen since the last call (each once).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

import requests

AWS_TOKEN_TTL_S = 21600


@dataclass(frozen=True, slots=True)
class Notice:
    """A notice as the agent forwards it to the control plane."""

    kind: str  # interruption | rebalance
    action: str
    deadline: datetime | None
    cloud: str
    raw: dict = field(default_factory=dict)
    seen_monotonic: float = 0.0

    def deadline_iso(self) -> str | None:
        return self.deadline.isoformat() if self.deadline else None


def _parse_iso(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None


class MetadataWatcher:
    """Base: `instance_id()` and `poll()`; a notice is reported once."""

    cloud = ""

    def __init__(self, base_url: str, *, timeout_s: float = 2.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self._seen: set[str] = set()

    def instance_id(self) -> str:
        raise NotImplementedError

    def _check(self) -> list[Notice]:
        raise NotImplementedError

    def poll(self) -> list[Notice]:
        fresh = []
        for notice in self._check():
            key = f"{notice.kind}:{notice.action}:{notice.deadline_iso()}"
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(notice)
        return fresh


class AwsImdsWatcher(MetadataWatcher):
    cloud = "aws"

    def __init__(self, base_url: str, **kwargs) -> None:
        super().__init__(base_url, **kwargs)
        self._token = ""
        self._token_expires = 0.0

    def _token_header(self) -> dict[str, str]:
        if not self._token or time.monotonic() > self._token_expires - 60:
            response = self.session.put(f"{self.base_url}/latest/api/token", timeout=self.timeout_s,
                                        headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)})
            response.raise_for_status()
            self._token = response.text
            self._token_expires = time.monotonic() + AWS_TOKEN_TTL_S
        return {"X-aws-ec2-metadata-token": self._token}

    def _get(self, leaf: str) -> requests.Response:
        response = self.session.get(f"{self.base_url}/latest/meta-data/{leaf}", headers=self._token_header(),
                                    timeout=self.timeout_s)
        if response.status_code == 401:  # token expired or the endpoint restarted
            self._token = ""
            response = self.session.get(f"{self.base_url}/latest/meta-data/{leaf}", headers=self._token_header(),
                                        timeout=self.timeout_s)
        return response

    def instance_id(self) -> str:
        response = self._get("instance-id")
        response.raise_for_status()
        return response.text.strip()

    def identity(self) -> tuple[str, str]:
        """The instance identity document (exact text) and its base64 RSA-SHA256 signature
        (`/latest/dynamic/instance-identity/signature`), which enrolment sends as proof that this
        is the launched instance. ("", "") when the endpoint serves none (a local node without a
        signing key); a connection error raises (the caller retries)."""
        texts = []
        for leaf in ("document", "signature"):
            url = f"{self.base_url}/latest/dynamic/instance-identity/{leaf}"
            response = self.session.get(url, headers=self._token_header(), timeout=self.timeout_s)
            if response.status_code == 401:
                self._token = ""
                response = self.session.get(url, headers=self._token_header(), timeout=self.timeout_s)
            if response.status_code == 404:
                return "", ""
            response.raise_for_status()
            texts.append(response.text)
        return texts[0], texts[1]

    def _check(self) -> list[Notice]:
        notices = []
        now = time.monotonic()
        action = self._get("spot/instance-action")
        if action.status_code == 200:
            body = action.json()
            notices.append(Notice(kind="interruption", action=body.get("action", ""), cloud="aws", raw=body,
                                  deadline=_parse_iso(body.get("time", "")), seen_monotonic=now))
        rebalance = self._get("events/recommendations/rebalance")
        if rebalance.status_code == 200:
            body = rebalance.json()
            notices.append(Notice(kind="rebalance", action="", cloud="aws", raw=body, deadline=None,
                                  seen_monotonic=now))
        return notices


class GcpWatcher(MetadataWatcher):
    cloud = "gcp"
    HEADERS = {"Metadata-Flavor": "Google"}
    NOTICE_S = 30

    def __init__(self, base_url: str, *, wait_s: float = 5.0, **kwargs) -> None:
        super().__init__(base_url, **kwargs)
        self.wait_s = wait_s
        self._first = True

    def instance_id(self) -> str:
        response = self.session.get(f"{self.base_url}/computeMetadata/v1/instance/id", headers=self.HEADERS,
                                    timeout=self.timeout_s)
        response.raise_for_status()
        return response.text.strip()

    def _check(self) -> list[Notice]:
        url = f"{self.base_url}/computeMetadata/v1/instance/preempted"
        if self._first:
            # A plain read first: wait_for_change would block if it is already TRUE.
            response = self.session.get(url, headers=self.HEADERS, timeout=self.timeout_s)
            self._first = False
        else:
            response = self.session.get(url, headers=self.HEADERS, timeout=self.wait_s + self.timeout_s,
                                        params={"wait_for_change": "true", "timeout_sec": int(self.wait_s)})
        response.raise_for_status()
        if response.text.strip().upper() == "TRUE":
            deadline = (datetime.now(UTC) + timedelta(seconds=self.NOTICE_S)).replace(microsecond=0)
            return [Notice(kind="interruption", action="preempt", cloud="gcp", raw={"preempted": "TRUE"},
                           deadline=deadline, seen_monotonic=time.monotonic())]
        return []

    def poll(self) -> list[Notice]:
        # The answer carries no deadline or id: one preemption, reported once.
        if "preempted" in self._seen:
            return []
        notices = self._check()
        if notices:
            self._seen.add("preempted")
        return notices


class AzureWatcher(MetadataWatcher):
    cloud = "azure"
    HEADERS = {"Metadata": "true"}
    API_VERSION = "2020-07-01"

    def instance_id(self) -> str:
        response = self.session.get(f"{self.base_url}/metadata/instance/compute/vmId", headers=self.HEADERS,
                                    params={"api-version": "2021-02-01", "format": "text"}, timeout=self.timeout_s)
        response.raise_for_status()
        return response.text.strip()

    def _check(self) -> list[Notice]:
        response = self.session.get(f"{self.base_url}/metadata/scheduledevents", headers=self.HEADERS,
                                    params={"api-version": self.API_VERSION}, timeout=self.timeout_s)
        response.raise_for_status()
        notices = []
        for event in response.json().get("Events", []):
            if event.get("EventType") != "Preempt":
                continue
            try:
                deadline = parsedate_to_datetime(event.get("NotBefore", ""))
            except (TypeError, ValueError):
                deadline = None
            notices.append(Notice(kind="interruption", action="preempt", cloud="azure", deadline=deadline,
                                  raw=json.loads(json.dumps(event)), seen_monotonic=time.monotonic()))
        return notices


WATCHERS: dict[str, type[MetadataWatcher]] = {"aws": AwsImdsWatcher, "gcp": GcpWatcher, "azure": AzureWatcher}
DEFAULT_URLS = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal",
                "azure": "http://169.254.169.254"}


def make_watcher(cloud: str, base_url: str | None = None) -> MetadataWatcher:
    if cloud not in WATCHERS:
        raise ValueError(f"unknown cloud {cloud!r}; expected one of {sorted(WATCHERS)}")
    return WATCHERS[cloud](base_url or DEFAULT_URLS[cloud])

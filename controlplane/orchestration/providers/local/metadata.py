"""A node's metadata endpoint, speaking the real formats of the three clouds, for local nodes and
tests. It imports nothing from Django: a local node runs it in-process beside its agent.

- AWS IMDSv2: `PUT /latest/api/token` (needs `X-aws-ec2-metadata-token-ttl-seconds`), then
  `GET /latest/meta-data/...` with `X-aws-ec2-metadata-token`; `spot/instance-action` is 404 until
  a notice exists, then `{"action": "terminate", "time": "...Z"}`; `events/recommendations/rebalance`
  likewise with `{"noticeTime": "...Z"}`. With an `IdentitySigner`, `GET
  /latest/dynamic/instance-identity/document` serves an instance identity document (AWS's fields)
  and `.../signature` its base64 RSA PKCS#1 v1.5 SHA-256 signature, made with a locally generated
  key instead of AWS's (404 without a signer).
- GCP: `GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google` answers `FALSE`
  or `TRUE`; `?wait_for_change=true` blocks until the value changes (or `timeout_sec`).
- Azure: `GET /metadata/scheduledevents?api-version=2020-07-01` with `Metadata: true` answers
  `{"DocumentIncarnation": n, "Events": [...]}` with a `Preempt` event once a notice exists.

`POST /_spotpipe/notice {"kind": "interruption"|"rebalance", "notice_s": 2.0, "action": "terminate"}`
is the provider's control hook (not part of any cloud's API).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def _iso_z(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class IdentitySigner:
    """Signs this node's instance identity document, as AWS does, with a local RSA private key."""

    private_key_pem: bytes
    account_id: str = "000000000000"
    region: str = "local"

    def document(self, *, instance_id: str, instance_type: str, zone: str) -> str:
        fields = {
            "accountId": self.account_id, "architecture": "x86_64", "availabilityZone": zone,
            "billingProducts": None, "devpayProductCodes": None, "marketplaceProductCodes": None,
            "imageId": "ami-00000000000000000", "instanceId": instance_id, "instanceType": instance_type,
            "kernelId": None, "pendingTime": _iso_z(datetime.now(UTC)), "privateIp": "127.0.0.1",
            "ramdiskId": None, "region": self.region, "version": "2017-09-30",
        }
        return json.dumps(fields, indent=2)

    def sign(self, document: str) -> str:
        """Base64 of the RSA PKCS#1 v1.5 SHA-256 signature, in 64-character lines."""
        import base64

        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import padding

        key = serialization.load_pem_private_key(self.private_key_pem, password=None)
        text = base64.b64encode(key.sign(document.encode(), padding.PKCS1v15(), hashes.SHA256())).decode()
        return "\n".join(text[i:i + 64] for i in range(0, len(text), 64))


@dataclass
class MetadataState:
    """What the node's metadata currently says. Guarded by `changed` (a Condition)."""

    instance_id: str
    instance_type: str = "local.node"
    zone: str = "local"
    interruption: dict | None = None
    rebalance: dict | None = None
    azure_events: list[dict] = field(default_factory=list)
    incarnation: int = 0
    preempted: bool = False
    tokens: dict[str, float] = field(default_factory=dict)
    identity: tuple[str, str] | None = None  # (document, signature) when the node has a signer
    changed: threading.Condition = field(default_factory=threading.Condition)


class MetadataServer:
    """A threaded HTTP server with the state above. `on_notice(deadline_monotonic)` is called when
    an interruption is posted (the local node uses it to kill itself at the deadline)."""

    def __init__(
        self, *, instance_id: str, instance_type: str = "local.node", zone: str = "local",
        host: str = "127.0.0.1", port: int = 0, on_notice: Callable[[float], None] | None = None,
        identity: IdentitySigner | None = None,
    ) -> None:
        self.state = MetadataState(instance_id=instance_id, instance_type=instance_type, zone=zone)
        if identity is not None:
            document = identity.document(instance_id=instance_id, instance_type=instance_type, zone=zone)
            self.state.identity = (document, identity.sign(document))
        self.on_notice = on_notice
        handler = type("Handler", (_Handler,), {"server_ref": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> MetadataServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metadata", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.state.changed:
            self.state.changed.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    # --- notices -------------------------------------------------------------------------------------
    def post_notice(self, *, kind: str = "interruption", notice_s: float = 120.0, action: str = "terminate") -> dict:
        """Publish a notice in all three formats. Returns what the AWS endpoint now serves."""
        now = datetime.now(UTC)
        deadline = now + timedelta(seconds=notice_s)
        st = self.state
        with st.changed:
            if kind == "rebalance":
                st.rebalance = {"noticeTime": _iso_z(now)}
                body = st.rebalance
            else:
                st.interruption = {"action": action, "time": _iso_z(deadline)}
                st.preempted = True
                st.incarnation += 1
                st.azure_events = [{
                    "EventId": str(uuid.uuid4()).upper(), "EventType": "Preempt", "ResourceType": "VirtualMachine",
                    "Resources": [st.instance_id], "EventStatus": "Scheduled",
                    "NotBefore": format_datetime(deadline, usegmt=True), "Description": "",
                    "EventSource": "Platform", "DurationInSeconds": -1,
                }]
                body = st.interruption
            st.changed.notify_all()
        if kind != "rebalance" and self.on_notice is not None:
            self.on_notice(time.monotonic() + notice_s)
        return body


class _Handler(BaseHTTPRequestHandler):
    server_ref: MetadataServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def _send(self, status: int, body: str | bytes = b"", content_type: str = "text/plain",
              headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload), "application/json", headers)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {}

    # --- AWS IMDSv2 -------------------------------------------------------------------------------
    def do_PUT(self) -> None:
        if urlparse(self.path).path != "/latest/api/token":
            return self._send(HTTPStatus.NOT_FOUND, "Not Found")
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        if not ttl or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            return self._send(HTTPStatus.BAD_REQUEST, "Bad Request")
        token = secrets.token_urlsafe(32)
        self.server_ref.state.tokens[token] = time.monotonic() + int(ttl)
        return self._send(HTTPStatus.OK, token, headers={"X-aws-ec2-metadata-token-ttl-seconds": ttl})

    def _aws_get(self, path: str) -> None:
        st = self.server_ref.state
        token = self.headers.get("X-aws-ec2-metadata-token", "")
        if st.tokens.get(token, 0) < time.monotonic():
            return self._send(HTTPStatus.UNAUTHORIZED, "Unauthorized")
        if path.startswith("/latest/dynamic/instance-identity/"):
            leaf = path.removeprefix("/latest/dynamic/instance-identity/")
            if st.identity is None or leaf not in ("document", "signature"):
                return self._send(HTTPStatus.NOT_FOUND, "Not Found")
            return self._send(HTTPStatus.OK, st.identity[0] if leaf == "document" else st.identity[1])
        leaf = path.removeprefix("/latest/meta-data/")
        simple = {"instance-id": st.instance_id, "instance-type": st.instance_type,
                  "placement/availability-zone": st.zone, "instance-life-cycle": "spot"}
        if leaf in simple:
            return self._send(HTTPStatus.OK, simple[leaf])
        if leaf == "spot/instance-action":
            return self._json(HTTPStatus.OK, st.interruption) if st.interruption else self._send(404, "Not Found")
        if leaf == "events/recommendations/rebalance":
            return self._json(HTTPStatus.OK, st.rebalance) if st.rebalance else self._send(404, "Not Found")
        return self._send(HTTPStatus.NOT_FOUND, "Not Found")

    # --- GCP ---------------------------------------------------------------------------------------
    def _gcp_get(self, path: str, query: dict[str, list[str]]) -> None:
        st = self.server_ref.state
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(HTTPStatus.FORBIDDEN, "Missing Metadata-Flavor:Google header.")
        headers = {"Metadata-Flavor": "Google"}
        leaf = path.removeprefix("/computeMetadata/v1/instance/")
        if leaf in ("id", "name"):
            return self._send(HTTPStatus.OK, st.instance_id, headers=headers)
        if leaf == "zone":
            return self._send(HTTPStatus.OK, f"projects/0/zones/{st.zone}", headers=headers)
        if leaf != "preempted":
            return self._send(HTTPStatus.NOT_FOUND, "Not Found", headers=headers)
        if query.get("wait_for_change", ["false"])[0].lower() == "true":
            timeout = float(query.get("timeout_sec", ["60"])[0])
            start = st.preempted
            with st.changed:
                st.changed.wait_for(lambda: st.preempted != start, timeout=timeout)
        return self._send(HTTPStatus.OK, "TRUE" if st.preempted else "FALSE", headers=headers)

    # --- Azure -------------------------------------------------------------------------------------
    def _azure(self, path: str, query: dict[str, list[str]], method: str) -> None:
        st = self.server_ref.state
        if self.headers.get("Metadata", "").lower() != "true":
            return self._json(HTTPStatus.BAD_REQUEST, {"error": "Bad request. Required metadata header not specified"})
        if "api-version" not in query:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": "Bad request. api-version was not specified"})
        if path == "/metadata/scheduledevents":
            if method == "POST":
                started = {r.get("EventId") for r in self._body().get("StartRequests", [])}
                st.azure_events = [e for e in st.azure_events if e["EventId"] not in started]
                return self._send(HTTPStatus.OK)
            return self._json(HTTPStatus.OK, {"DocumentIncarnation": st.incarnation, "Events": st.azure_events})
        if path == "/metadata/instance/compute/vmId":
            return self._send(HTTPStatus.OK, st.instance_id)
        return self._json(HTTPStatus.NOT_FOUND, {"error": "Not found"})

    # --- dispatch ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        parsed = urlparse(self.path)
        query = parse_qs(parsed.query)
        if parsed.path.startswith(("/latest/meta-data/", "/latest/dynamic/")):
            return self._aws_get(parsed.path)
        if parsed.path.startswith("/computeMetadata/v1/"):
            return self._gcp_get(parsed.path, query)
        if parsed.path.startswith("/metadata/"):
            return self._azure(parsed.path, query, "GET")
        if parsed.path == "/_spotpipe/state":
            st = self.server_ref.state
            return self._json(HTTPStatus.OK, {"instance_id": st.instance_id, "interruption": st.interruption,
                                              "rebalance": st.rebalance})
        return self._send(HTTPStatus.NOT_FOUND, "Not Found")

    def do_POST(self) -> None:
        parsed = urlparse(self.path)
        if parsed.path.startswith("/metadata/"):
            return self._azure(parsed.path, parse_qs(parsed.query), "POST")
        if parsed.path == "/_spotpipe/notice":
            body = self._body()
            served = self.server_ref.post_notice(
                kind=str(body.get("kind", "interruption")), notice_s=float(body.get("notice_s", 120)),
                action=str(body.get("action", "terminate")),
            )
            return self._json(HTTPStatus.OK, served)
        return self._send(HTTPStatus.NOT_FOUND, "Not Found")

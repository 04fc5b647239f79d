"""Outbound alerts cannot be aimed inside the control plane's network (SSRF, issue 21): a URL whose
host is or resolves to loopback, a private range, link-local (the metadata service), CGNAT or any
other non-public address is refused when saved (400 naming `url`) and again at delivery, after
DNS, on the address actually connected to. SPOTPIPE_ALERT_ALLOWED_NETWORKS lets an operator allow
an internal target."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from controlplane.common.errors import DomainError
from controlplane.webhooks import alerts, egress
from controlplane.webhooks.models import AlertDelivery, DeliveryStatus
from tests.controlplane.api_helpers import make_team_world
from tests.controlplane.factories import make_team

pytestmark = pytest.mark.django_db

INTERNAL_URLS = [
    "http://127.0.0.1/hook",
    "http://127.9.9.9:8080/hook",
    "http://localhost:8000/admin/",
    "http://api.localhost/x",
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://10.0.0.5/hook",
    "http://172.16.3.4/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",  # carrier-grade NAT
    "http://0.0.0.0:8000/",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",  # IPv4-mapped loopback
    "http://[::ffff:169.254.169.254]/",
    "http://[fd00::1]/hook",
    "http://[fe80::1]/hook",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
    "http://[::127.0.0.1]/hook",  # IPv4-compatible loopback (deprecated, "global" to ipaddress)
    "http://[::ffff:0:7f00:1]/hook",  # SIIT loopback
    "http://[fec0::1]/hook",  # site-local
    "http://2130706433/hook",  # 127.0.0.1 written as one number
    "http://0x7f.1/hook",  # 127.0.0.1 in inet_aton's shorthand
    "http://224.0.0.1/hook",  # multicast
]


@pytest.mark.parametrize("url", INTERNAL_URLS)
def test_internal_urls_are_refused_when_saved(url):
    with pytest.raises(DomainError) as refused:
        alerts.alert_endpoint_create(team=make_team(), url=url)
    assert refused.value.field == "url"
    assert "public address" in str(refused.value)


def test_the_api_answers_400_naming_the_field():
    world = make_team_world()
    for url in ("http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:8000/admin/"):
        response = world.admin_client.post("/api/v1/alert-endpoints/", {"url": url}, format="json")
        assert response.status_code == 400, response.content
        assert "public address" in " ".join(response.json()["errors"]["url"])
    endpoint = alerts.alert_endpoint_create(team=world.team, url="https://8.8.8.8/hook")
    moved = world.admin_client.patch(f"/api/v1/alert-endpoints/{endpoint.pk}/", {"url": "http://10.1.2.3/"},
                                     format="json")
    assert moved.status_code == 400 and "url" in moved.json()["errors"]


def test_a_name_that_resolves_inside_is_refused_when_saved(monkeypatch):
    monkeypatch.setattr(egress, "resolve", lambda host, port=None: ["8.8.8.8", "10.20.30.40"])
    with pytest.raises(DomainError, match=r"10\.20\.30\.40"):
        alerts.alert_endpoint_create(team=make_team(), url="https://hooks.internal.example/x")


def test_public_addresses_are_accepted():
    team = make_team()
    for url in ("https://8.8.8.8/hook", "https://[2001:4860:4860::8888]/hook"):
        assert alerts.alert_endpoint_create(team=team, url=url).url == url


def test_a_name_that_does_not_resolve_yet_is_accepted_and_checked_at_delivery(monkeypatch):
    def unresolved(host, port=None):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(egress, "resolve", unresolved)
    endpoint = alerts.alert_endpoint_create(team=make_team(), url="https://hooks.later.example/x")
    assert endpoint.pk


def _delivery(team, url: str) -> AlertDelivery:
    deliveries = alerts.alert_emit(team_id=team.pk, event="job.failed", text="t", data={})
    assert [d.endpoint.url for d in deliveries] == [url]
    return deliveries[0]


def test_delivery_refuses_a_name_that_now_resolves_to_the_metadata_service(monkeypatch):
    """Saved while the name resolved to a public address; at delivery it points at 169.254.169.254
    (DNS rebinding): nothing is sent, and the delivery fails for good."""
    team = make_team()
    monkeypatch.setattr(egress, "resolve", lambda host, port=None: ["93.184.216.34"])
    alerts.alert_endpoint_create(team=team, url="https://rebind.example/hook")
    delivery = _delivery(team, "https://rebind.example/hook")
    monkeypatch.setattr(egress, "resolve", lambda host, port=None: ["169.254.169.254"])
    sent = []
    outcome = alerts.alert_deliver(delivery_id=delivery.pk, post=lambda url, **kw: sent.append(url) or 200)
    assert outcome == "failed" and sent == []
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED and "169.254.169.254" in delivery.last_error
    assert "rebind.example" not in delivery.last_error  # the URL may hold a secret


@pytest.fixture
def loopback_server():
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def test_the_connection_itself_refuses_a_non_public_peer(loopback_server):
    """The last line: whatever a name resolved to during the check, the socket's peer is checked
    once connected, so a rebinding between the check and the connect is refused too."""
    with egress.checked_session() as session, pytest.raises(requests.ConnectionError, match="not a public"):
        session.post(loopback_server, data=b"{}", timeout=5)


def test_operators_may_allow_an_internal_network(settings, loopback_server):
    settings.SPOTPIPE_ALERT_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    team = make_team()
    alerts.alert_endpoint_create(team=team, url=loopback_server)
    delivery = _delivery(team, loopback_server)
    assert alerts.alert_deliver(delivery_id=delivery.pk) == "delivered"
    # Only the listed networks: the metadata address stays refused.
    with pytest.raises(DomainError):
        alerts.alert_endpoint_create(team=team, url="http://169.254.169.254/")


def test_the_allowed_networks_setting_reads_a_comma_separated_string(settings):
    settings.SPOTPIPE_ALERT_ALLOWED_NETWORKS = "10.0.0.0/8, fd00::/8"
    egress.check_address("10.1.2.3")
    egress.check_address("fd00::5")
    with pytest.raises(egress.EgressRefused):
        egress.check_address("192.168.0.1")

"""Where outbound requests to team-given URLs (alerts) may go: only public internet addresses.

A team's alert URL is a request the control plane makes from inside its own network, so a URL
pointing at loopback, a private range, link-local (the cloud metadata service at 169.254.169.254)
or any other non-global address would let a team probe or attack what sits next to the control
plane (SSRF). The check runs when the URL is saved (IP literals, and names that resolve now) and
again on every delivery, on the address the socket actually connected to (a name that resolves
elsewhere later, DNS rebinding, is caught there).

Operators who do need an internal target (a relay on a private network, a test server) list its
networks in SPOTPIPE_ALERT_ALLOWED_NETWORKS (CIDRs, comma-separated in the environment)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from controlplane.tunables import tunable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# IPv6 prefixes that carry an IPv4 address in their last 32 bits (NAT64): judged by that address.
# The same for the deprecated IPv4-compatible (::a.b.c.d) and SIIT (::ffff:0:a.b.c.d) forms, which
# ipaddress counts as global.
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"),
          ipaddress.ip_network("::/96"), ipaddress.ip_network("::ffff:0:0/96"))


class EgressRefused(OSError):
    """The destination is not a public address (an OSError, so an HTTP client treats a refusal at
    connect time as a failed connection)."""


def allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The operator's explicit exceptions (setting SPOTPIPE_ALERT_ALLOWED_NETWORKS)."""
    value = tunable("SPOTPIPE_ALERT_ALLOWED_NETWORKS") or []
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    return [ipaddress.ip_network(str(cidr).strip(), strict=False) for cidr in value]


def _embedded_v4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in net for net in _NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_is_public(address: IPAddress) -> bool:
    """A global unicast address (not loopback, private, link-local, CGNAT, reserved, multicast...),
    also for the IPv4 address inside an IPv4-mapped, 6to4 or NAT64 IPv6 address."""
    inner = _embedded_v4(address)
    if inner is not None:
        return address_is_public(inner)
    # Reserved and site-local IPv6 (fec0::/10) are global to ipaddress, but never a public host.
    site_local = isinstance(address, ipaddress.IPv6Address) and address.is_site_local
    return address.is_global and not (address.is_multicast or address.is_reserved or site_local)


def check_address(address: str) -> None:
    """Raise EgressRefused unless `address` (an IP) is public or in the allowed networks."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    if address_is_public(ip) or any(ip in net for net in allowed_networks() if net.version == ip.version):
        return
    raise EgressRefused(f"{ip} is not a public address (loopback, private, link-local or reserved); "
                        "list its network in SPOTPIPE_ALERT_ALLOWED_NETWORKS to allow it")


def resolve(host: str, port: int | None = None) -> list[str]:
    """Every address `host` resolves to (an IP literal resolves to itself)."""
    try:
        return [str(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def check_host(host: str, port: int | None = None, *, addresses: Iterable[str] | None = None) -> None:
    """Raise EgressRefused if any address of `host` is refused; socket.gaierror if it does not
    resolve."""
    for address in addresses if addresses is not None else resolve(host, port):
        check_address(address)


class _CheckedConnectionMixin:
    """Checks the peer of every new socket: the address actually connected to, after DNS."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        try:
            check_address(sock.getpeername()[0])
        except EgressRefused:
            sock.close()
            raise
        return sock


class _CheckedHTTPConnection(_CheckedConnectionMixin, HTTPConnection):
    pass


class _CheckedHTTPSConnection(_CheckedConnectionMixin, HTTPSConnection):
    pass


class _CheckedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _CheckedHTTPConnection


class _CheckedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _CheckedHTTPSConnection


class _CheckedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: object, **kwargs: object) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _CheckedHTTPPool, "https": _CheckedHTTPSPool}


def checked_session() -> requests.Session:
    """A requests session whose connections may reach public addresses only. It ignores proxy
    variables: a proxy would be the peer checked, not the target."""
    session = requests.Session()
    session.trust_env = False
    adapter = _CheckedAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session

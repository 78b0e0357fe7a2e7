"""SSRF guard: callbacks may only reach public addresses. ``NetworkPolicy`` says which
addresses a callback may reach, and refuses a task's URL early when its host is an IP literal
or a name that is not public.

Checks run on the address actually dialled, so DNS rebinding cannot slip past: the service's
own client checks every resolved address (timewheel/delivery/wire.py), aiohttp and httpx
through the adapters of timewheel/delivery/guarded_clients.py. Those clients wrap the refusal
in their connect error: ``blocked_cause(exc)`` digs it out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import socket
import unicodedata
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

import yarl

from timewheel.errors import TimeWheelError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class BlockedAddress(OSError):
    """A non-public destination. An OSError so aiohttp wraps it like any connect
    failure (``ClientConnectorError.os_error``) instead of letting it escape."""

    def __init__(self, address: str, reason: str = "refused", *, host: str | None = None) -> None:
        msg = f"{address} is {reason}, not a public address"
        if host is not None and host != address:
            msg += f" (from {host!r})"
        super().__init__(msg)
        self.strerror = msg  # aiohttp's ClientConnectorError prints strerror
        self.address, self.reason, self.host = address, reason, host


def _table(rows: str) -> tuple[tuple[IPNetwork, str], ...]:
    pairs = (line.split(" ", 1) for line in rows.strip().splitlines())
    return tuple((ipaddress.ip_network(net), why) for net, why in pairs)


# IANA special-purpose registries, explicitly: on Python 3.11 `is_global` alone
# passes multicast, fec0::/10, 3fff::/20, 64:ff9b:1::/48, ::127.0.0.1...
_V4_BLOCKED = _table("""
0.0.0.0/8 unspecified ('this network')
10.0.0.0/8 private
100.64.0.0/10 shared address space (CGNAT)
127.0.0.0/8 loopback
169.254.0.0/16 link-local (cloud metadata)
172.16.0.0/12 private
192.0.0.0/24 IETF protocol assignments
192.0.2.0/24 documentation
192.88.99.0/24 6to4 relay anycast
192.168.0.0/16 private
198.18.0.0/15 benchmarking
198.51.100.0/24 documentation
203.0.113.0/24 documentation
224.0.0.0/4 multicast
255.255.255.255/32 broadcast
240.0.0.0/4 reserved
""")
_V6_BLOCKED = _table("""
::/128 unspecified
::1/128 loopback
64:ff9b:1::/48 local-use NAT64
100::/64 discard-only
2001::/23 IETF protocol assignments (Teredo, ORCHID...)
2001:db8::/32 documentation
3fff::/20 documentation
5f00::/16 SRv6 segment identifiers
fc00::/7 unique-local (private)
fe80::/10 link-local
fec0::/10 site-local
ff00::/8 multicast
""")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 address stands for, if any: that is what gets reached."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    n = int(ip)
    if n >> 32 == 0 and n > 1:  # ::a.b.c.d (but :: and ::1 are themselves)
        return ipaddress.IPv4Address(n), "IPv4-compatible"
    if ip in _NAT64:
        return ipaddress.IPv4Address(n & 0xFFFFFFFF), "NAT64"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    return None


def _why_not_public(ip: IPAddress) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            why = _why_not_public(embedded[0])
            return None if why is None else f"{why} (via {embedded[1]} {embedded[0]})"
    for net, why in _V4_BLOCKED if ip.version == 4 else _V6_BLOCKED:
        if ip in net:
            return why
    if ip.is_multicast:
        return "multicast"
    if not ip.is_global:  # whatever this Python knows beyond our tables
        return "not globally routable"
    return None


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address `host` denotes in any spelling a resolver takes (``127.1``,
    ``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``[::1]``...), else None. Generous
    on purpose (escapes, full-width digits, trailing junk): it only over-blocks."""
    h = unicodedata.normalize("NFKC", unquote(host)).strip().lower()
    h = h.replace("\u3002", ".").replace("\uff61", ".")  # IDNA dot variants
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if ":" not in h:
        h = h.rstrip(".")
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    if not h or ":" in h:
        return None
    try:  # glibc's legacy parser, the one getaddrinfo uses for numeric hosts
        return ipaddress.IPv4Address(socket.inet_aton(h))
    except (OSError, ValueError, UnicodeError):
        return None


# What check_url_host answered for a URL or a host: None (it passes) or a builder of the very
# exception it raised, made anew for each refusal (a raised exception keeps its traceback).
Refusal = Callable[[], Exception]


def _UNCHECKED() -> Exception:  # a sentinel: no answer kept yet
    raise AssertionError("never called")


_REMEMBERED = 2048  # URLs a policy keeps the answer for (then starts over)


@dataclasses.dataclass(frozen=True)
class NetworkPolicy:
    allow_private: bool = False
    # Operator-configured CIDRs allowed even though not public.
    allowed_networks: tuple[IPNetwork, ...] = ()
    # check_url_host's answers by URL: a pure function of this (frozen) policy and the text,
    # and a batch of tasks often names one URL.
    _url_answers: dict[str, Refusal | None] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)

    def check_ip(self, ip: str | IPAddress, *, host: str | None = None) -> None:
        """Raise BlockedAddress unless `ip` is public (or allowed). `host` only
        adds "(from 'name')" to the message."""
        addr = parse_ip_literal(ip) if isinstance(ip, str) else ip
        if addr is None:  # fail closed
            raise BlockedAddress(str(ip), "not an IP address", host=host)
        if self.allow_private:
            return
        why = _why_not_public(addr)
        if why is None:
            return
        candidates: list[IPAddress] = [addr]
        if isinstance(addr, ipaddress.IPv6Address) and (emb := _embedded_ipv4(addr)):
            candidates.append(emb[0])
        if any(a in net for net in self.allowed_networks for a in candidates):
            return
        raise BlockedAddress(str(addr), why, host=host if host is not None else str(ip))

    def check_url_host(self, url: str) -> None:
        """Early check at task creation: refuse IP literals that are not public and
        the names ``localhost``/``*.localhost``. Other names pass: they are checked
        against what they resolve to at connect time. The answer for a URL is
        remembered: a batch of 1000 tasks to one URL parses it once. Pays for itself:
        without it the service spent 7 % more CPU per task on `python -m bench.batch
        --tasks 50000 --concurrency 2`, which runs with private networks allowed (under
        the default policy an unremembered URL costs 5.0 us, not 1.4); bench/README.md,
        "What each mechanism pays for"."""
        answer = self._url_answers.get(url, _UNCHECKED) if type(url) is str else _UNCHECKED
        if answer is _UNCHECKED:
            answer = self._url_answer(url)
            if type(url) is str:
                _remember(self._url_answers, url, answer)
        if answer is not None:
            raise answer()

    def _url_answer(self, url: str) -> Refusal | None:
        hosts: set[str] = set()
        # Both parsers, in case they disagree on a tricky URL.
        with contextlib.suppress(ValueError, TypeError):
            hosts.add(urlsplit(url).hostname or "")
        with contextlib.suppress(ValueError, TypeError):
            hosts.add(yarl.URL(url).raw_host or "")
        hosts.discard("")
        if not hosts:
            return functools.partial(ValueError, f"no host in URL {url!r}")
        if self.allow_private:
            return None
        for host in hosts:
            answer = self._host_answer(host)
            if answer is not None:
                return answer
        return None

    def _host_answer(self, host: str) -> Refusal | None:
        name = unicodedata.normalize("NFKC", unquote(host)).lower().rstrip(".")
        if name == "localhost" or name.endswith(".localhost"):
            # Always loopback (RFC 6761), so refused early, unless loopback is an allowed
            # network (the refusal's hint offers that: operations/tasks.py). Both of its
            # addresses: a name that resolves to 127.0.0.1 and ::1 (Debian's /etc/hosts) is
            # refused whole at connect time when one of them is not allowed.
            if not all(any(ip in net for net in self.allowed_networks) for ip in _LOOPBACK):
                return functools.partial(BlockedAddress, host,
                                         "a loopback name (127.0.0.1 and ::1)")
            return None
        ip = parse_ip_literal(host)
        if ip is not None:
            try:
                self.check_ip(ip, host=host)
            except BlockedAddress as exc:
                return functools.partial(BlockedAddress, exc.address, exc.reason, host=exc.host)
        return None


_LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def _remember(answers: dict[str, Refusal | None], key: str, answer: Refusal | None) -> None:
    if len(answers) >= _REMEMBERED:
        answers.clear()
    answers[key] = answer


def blocked_cause(exc: BaseException | None) -> BlockedAddress | None:
    """The BlockedAddress behind an aiohttp/httpx error (via ``os_error`` or
    ``__cause__``; not ``__context__``, which may be unrelated), else None.
    aiohttp: ClientConnectorError; httpx: ConnectError caused by BlockedConnectError."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, BlockedAddress):
            return exc
        os_error = getattr(exc, "os_error", None)  # aiohttp.ClientConnectorError
        if isinstance(os_error, BlockedAddress):
            return os_error
        exc = exc.__cause__
    return None


class NotWritten(TimeWheelError):
    """The request was not written: when its connection was ready, the attempt's last check
    said no (its lease had run short while it waited: a stalled process; or a rated flow's
    attempt came too late for the start its flow logged: timewheel/engine/dispatcher.py
    ``LastCheck``). Raised by the service's own client (wire.py) and by the aiohttp and httpx
    senders (senders.py, guarded_clients.py)."""


NOT_WRITTEN = "the attempt's last check before the write said no (its lease, or its flow's rate)"

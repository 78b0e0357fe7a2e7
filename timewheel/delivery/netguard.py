"""SSRF guard: callbacks may only reach public addresses.

Checks run on the address actually dialled, so DNS rebinding cannot slip past:
aiohttp via ``guarded_connector()`` (resolver answers, IP literals and every
socket's sockaddr), httpx via ``guarded_httpx_transport()`` (resolves, checks,
dials the checked IP; TLS still verifies the name). Both clients wrap the
refusal in their connect error: ``blocked_cause(exc)`` digs it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import socket
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import aiohttp
import httpcore
import httpx
import yarl
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, AbstractStreamWriter, ResolveResult
from aiohttp.connector import Connection
from aiohttp.resolver import DefaultResolver
from aiohttp.tracing import Trace

from timewheel.errors import TimeWheelError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
SocketFactory = Callable[[AddrInfoType], socket.socket]


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
            return functools.partial(BlockedAddress, host, "a loopback name")
        ip = parse_ip_literal(host)
        if ip is not None:
            try:
                self.check_ip(ip, host=host)
            except BlockedAddress as exc:
                return functools.partial(BlockedAddress, exc.address, exc.reason, host=exc.host)
        return None


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


# ---------------------------------------------------------------- aiohttp


class GuardedResolver(AbstractResolver):
    """Resolves with `resolver` (aiohttp's default if None) and refuses the whole
    answer if ANY address is blocked: never silently use the remaining ones."""

    def __init__(self, policy: NetworkPolicy, resolver: AbstractResolver | None = None) -> None:
        self.policy = policy
        self._resolver = resolver if resolver is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._resolver.resolve(host, port, family)
        for answer in answers:
            self.policy.check_ip(answer["host"], host=host)
        return answers

    async def close(self) -> None:
        await self._resolver.close()


def guarded_socket_factory(
    policy: NetworkPolicy, inner: SocketFactory | None = None
) -> SocketFactory:
    """aiohttp `socket_factory`: checks the sockaddr about to be dialled."""

    def factory(addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        policy.check_ip(str(sockaddr[0]))
        return inner(addr_info) if inner is not None else socket.socket(family, type_, proto)

    return factory


class NotWritten(TimeWheelError):
    """The request was not written: when its connection was ready, ``may_write`` said no
    (the attempt's lease had run short while it waited: a stalled process; or a rated flow's
    attempt came too late for the start its flow logged: timewheel/engine/dispatcher.py
    ``LastCheck``)."""


# Set by the sender around one request: asked once the connection is ready, just before the
# request is written (timewheel/delivery/senders.py). A context variable reaches the
# connector's public connect() without threading an argument through aiohttp.
may_write: ContextVar[Callable[[], bool] | None] = ContextVar("timewheel_may_write",
                                                               default=None)


NOT_WRITTEN = "the attempt's last check before the write said no (its lease, or its flow's rate)"


def _ask_may_write() -> None:
    check = may_write.get()
    if check is not None and not check():
        raise NotWritten(NOT_WRITTEN)


class LastCheckRequest(aiohttp.ClientRequest):
    """aiohttp writes a request with a body (headers and body together) in a task of its own,
    on the next loop iteration: this request asks ``may_write`` in that task just before the
    first write, the last moment before the bytes leave the process.

    It hooks the StreamWriter's ``_on_chunk_sent``, the callback aiohttp sets only for trace
    signals (tests/test_library_internals.py checks it is still there). A TraceConfig did the
    same through the public API, but any trace makes aiohttp emit every signal for every
    request (a URL rebuilt for request_start, connection and end events): ~5 us of CPU per
    callback, 2-3 % of a burst (py-spy, bench/README.md "Getting the burst back")."""

    async def write_bytes(self, writer: AbstractStreamWriter, conn: Connection,
                          content_length: int | None = None) -> None:
        hooked = cast(Any, writer)

        async def before_first_write(chunk: bytes) -> None:
            hooked._on_chunk_sent = None  # once: a body half-written is never broken off
            _ask_may_write()

        hooked._on_chunk_sent = before_first_write
        await super().write_bytes(writer, conn, content_length)


def not_written_cause(exc: BaseException | None) -> NotWritten | None:
    """The NotWritten behind an aiohttp error (aiohttp wraps what its body writer raises in a
    ClientConnectionError caused by it), else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotWritten):
            return exc
        exc = exc.__cause__
    return None


class GuardedConnector(aiohttp.TCPConnector):
    """TCPConnector that checks every connection; build it with guarded_connector().
    Its DNS cache only ever holds validated GuardedResolver answers (and the
    socket factory re-checks every dial), so the cache needs no special care."""

    def __init__(self, policy: NetworkPolicy, **kwargs: Any) -> None:
        resolver: AbstractResolver | None = kwargs.pop("resolver", None)
        factory: SocketFactory | None = kwargs.pop("socket_factory", None)
        super().__init__(
            resolver=GuardedResolver(policy, resolver),
            socket_factory=guarded_socket_factory(policy, factory),
            **kwargs,
        )
        # TCPConnector's private flag: closing the connector closes the (default) resolver
        # made here; tests/test_library_internals.py checks that aiohttp still honours it.
        self._resolver_owner = resolver is None
        self._netguard_policy = policy

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        """A connection from the pool or a new one; refused (given back unused) when the
        request's ``may_write`` says no once it is ready: a process stopped while it waited
        for the connection must not send after its attempt's lease ran short."""
        conn = await super().connect(req, traces, timeout)
        try:
            _ask_may_write()
        except NotWritten:
            conn.release()
            raise
        return conn

    async def _resolve_host(
        self, host: str, port: int, traces: Sequence[Trace] | None = None
    ) -> list[ResolveResult]:
        # aiohttp answers IP literals itself, never asking the resolver (and
        # refuses 127.1-style spellings with InvalidUrlClientError): check them
        # here so every refusal looks alike. The socket factory is the backstop.
        # The public API (resolver, socket_factory) alone already keeps every dial
        # public; without this private hook 127.1, 2130706433, 0177.0.0.1 and 0 fail
        # as InvalidUrlClientError instead of "blocked" (retried, not failed at once).
        # It runs once per new connection: no measurable cost on `python -m bench.run
        # --workload burst --submit batch --tasks 5000` (bench/README.md). aiohttp is
        # pinned <4 and tests/test_library_internals.py checks the signature.
        ip = parse_ip_literal(host)
        if ip is not None:
            self._netguard_policy.check_ip(ip, host=host)
        return await super()._resolve_host(host, port, traces=traces)


def guarded_connector(policy: NetworkPolicy, **connector_kwargs: Any) -> aiohttp.TCPConnector:
    """TCPConnector kwargs as usual; a `resolver`/`socket_factory` given is wrapped.
    No HTTP proxy: it would resolve and dial the target unchecked."""
    return GuardedConnector(policy, **connector_kwargs)


# ---------------------------------------------------------------- httpx


class BlockedConnectError(httpcore.ConnectError):
    """httpcore's pool re-raises `from None`, dropping __cause__: carry the
    BlockedAddress as ``os_error`` (like aiohttp) so blocked_cause() finds it."""

    def __init__(self, blocked: BlockedAddress) -> None:
        super().__init__(str(blocked))
        self.os_error = blocked


class GuardedNetworkBackend(httpcore.AsyncNetworkBackend):
    """Resolves, validates every address, then dials the validated IP through
    `backend`. httpcore calls ``start_tls(server_hostname=<origin host>)`` on the
    returned stream, so certificates are still checked against the name."""

    def __init__(
        self, policy: NetworkPolicy, backend: httpcore.AsyncNetworkBackend | None = None
    ) -> None:
        self.policy = policy
        self._backend = backend if backend is not None else httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async with asyncio.timeout(timeout):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host!r} timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        ips = list(dict.fromkeys(str(info[4][0]) for info in infos))
        try:
            for ip in ips:  # all of them first: fail closed
                self.policy.check_ip(ip, host=host)
        except BlockedAddress as exc:
            raise BlockedConnectError(exc) from exc
        last: httpcore.ConnectError | None = None
        for ip in ips:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                return await self._backend.connect_tcp(
                    ip, port, left, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                last = exc
        assert last is not None  # getaddrinfo never answers an empty list
        raise last

    async def connect_unix_socket(self, path: str, *args: Any, **kwargs: Any) -> Any:
        raise BlockedConnectError(BlockedAddress(path, "a Unix socket"))  # unchecked: refuse

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def guarded_httpx_transport(policy: NetworkPolicy, **kwargs: Any) -> httpx.AsyncHTTPTransport:
    """An AsyncHTTPTransport (same kwargs: limits, verify, http2...) whose pool
    dials through GuardedNetworkBackend. Proxies and `uds` are refused: the
    guard could not see the real destination."""
    if kwargs.get("proxy") is not None or kwargs.get("uds") is not None:
        raise ValueError("the network guard cannot check connections via a proxy or uds")
    transport = httpx.AsyncHTTPTransport(**kwargs)
    pool = transport._pool
    # Swap the backend in place: keeps the ssl context, limits, retries... httpx
    # built. These are httpcore internals, so fail loudly if they ever change.
    # No public way: httpx's transport takes no network backend, and building the
    # httpcore pool ourselves would copy httpx's private exception and stream
    # adapters. httpx and httpcore are pinned (pyproject.toml) and
    # tests/test_library_internals.py checks these attributes.
    backend = getattr(pool, "_network_backend", None)
    if type(pool) is not httpcore.AsyncConnectionPool or not isinstance(
        backend, httpcore.AsyncNetworkBackend
    ):
        raise RuntimeError("unexpected httpx/httpcore internals: cannot install the guard")
    pool._network_backend = GuardedNetworkBackend(policy, backend)
    return transport

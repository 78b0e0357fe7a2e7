"""The SSRF guard and the last check before the write, fitted into aiohttp and httpx
(``TIMEWHEEL_HTTP_CLIENT=aiohttp`` or ``httpx``; timewheel/delivery/senders.py).

aiohttp via ``guarded_connector()``: resolver answers, IP literals and every socket's sockaddr
are checked by the policy (timewheel/delivery/netguard.py), and ``LastCheckRequest`` asks
``may_write`` just before the first byte is written. httpx via ``guarded_httpx_transport()``:
it resolves, checks, and dials the checked IP (TLS still verifies the name); its
connections' timeouts let an answer already in the socket win (``GraceStream``). Both hook
private parts of those libraries, pinned in pyproject.toml and checked by
tests/test_library_internals.py.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from typing import Any, cast

import aiohttp
import httpcore
import httpx
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, AbstractStreamWriter, ResolveResult
from aiohttp.connector import Connection
from aiohttp.resolver import DefaultResolver
from aiohttp.tracing import Trace

from timewheel.delivery.grace import timeout_after_a_poll
from timewheel.delivery.netguard import (
    NOT_WRITTEN,
    BlockedAddress,
    NetworkPolicy,
    NotWritten,
    parse_ip_literal,
)

SocketFactory = Callable[[AddrInfoType], socket.socket]


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


# Set by the sender around one request: asked once the connection is ready, just before the
# request is written (timewheel/delivery/senders.py). A context variable reaches the
# connector's public connect() without threading an argument through aiohttp.
may_write: ContextVar[Callable[[], bool] | None] = ContextVar("timewheel_may_write",
                                                               default=None)


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


class ExchangeEnd:
    """When one whole exchange (HttpxSender.send) is up. httpx's timeouts are per operation,
    so a receiver dripping its answer would hold the attempt past its lease.
    - Until its first write, nothing is read and nothing can be lost: HttpxSender.send's
      timer ends the exchange at its end (``written`` False), the pool's wait included,
      which httpcore starts again, a whole pool timeout long, when the idle connection it
      was handed is taken (tests/test_sender_pool_wait.py).
    - From then on only the connection's reads and writes (GraceStream), its connect and
      its TLS handshake time out, each waiting no longer than the exchange has left, never
      the steps between them: httpcore yields to the loop at its locks after the answer is
      read, and a timer cancelling there would beat an answer that came while the process
      was stopped (the grace covers one poll, not those steps; tests/test_sender_stall.py)."""

    LATE_OPERATIONS = 4  # past the end: reads and writes that find their bytes at once

    def __init__(self, timeout: float) -> None:
        self.at = asyncio.get_running_loop().time() + timeout
        self._late = 0
        self._wrote = False

    def written(self) -> bool:
        """A write of the exchange has begun."""
        return self._wrote

    def bound(self, timeout: float | None, writing: bool = False) -> float | None:
        """`timeout`, cut to what the exchange has left (``writing``: for a write). Past the
        end, an operation gets one poll (timeout 0, grace.py), and the exchange only
        LATE_OPERATIONS of them: a receiver dripping fast would otherwise find each one
        answered."""
        self._wrote = self._wrote or writing
        left = self.at - asyncio.get_running_loop().time()
        if left > 0:
            return left if timeout is None else min(timeout, left)
        self._late += 1
        if self._late > self.LATE_OPERATIONS:
            raise TimeoutError("the exchange's time is up")
        return 0.0


exchange_end: ContextVar[ExchangeEnd | None] = ContextVar("timewheel_exchange_end",
                                                          default=None)


def _bounded(timeout: float | None, writing: bool = False) -> float | None:
    end = exchange_end.get()
    if end is None:
        return timeout
    return end.bound(timeout, writing)


def _bounded_connect(timeout: float | None) -> float | None:
    """``_bounded`` for a connect or a TLS handshake: past the exchange's end, a connect
    timeout (as httpcore raises for its own)."""
    try:
        return _bounded(timeout)
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout(str(exc)) from exc


class GraceStream(httpcore.AsyncNetworkStream):
    """httpcore's connection, whose reads and writes time out as httpcore's own do (each
    operation on its own, ReadTimeout or WriteTimeout, within the exchange's end), but only
    once the loop has polled its sockets after the time is up (grace.py): httpcore's own
    timer (anyio.fail_after) cancels a read as soon as it runs, and after a stop of the
    process past the timeout it runs before the answer already in the socket is read
    (tests/test_sender_stall.py). The stream beneath is asked for no timeout."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with timeout_after_a_poll(_bounded(timeout)):
                return await self._stream.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            async with timeout_after_a_poll(_bounded(timeout, writing=True)):
                await self._stream.write(buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        timeout = _bounded_connect(timeout)
        return GraceStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class GuardedNetworkBackend(httpcore.AsyncNetworkBackend):
    """Resolves, validates every address, then dials the validated IP through
    `backend`. httpcore calls ``start_tls(server_hostname=<origin host>)`` on the
    returned stream, so certificates are still checked against the name. The stream is
    a GraceStream, whose timeouts let an answer that came win."""

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
        timeout = _bounded_connect(timeout)
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
                return GraceStream(await self._backend.connect_tcp(
                    ip, port, left, local_address, socket_options
                ))
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

"""The callbacks' own HTTP/1.1 client: one request per keep-alive connection at a time, the
response parsed by httptools (llhttp, the parser uvicorn uses), the connections pooled here.

Why not aiohttp: a callback is one small request with a known body, no redirects, no cookies,
no proxies, no compression and no streaming, and aiohttp's general machinery (its request and
response classes, connector, payload registry, timers and stream readers) cost the service
~90 us of CPU per callback, about half of all it spends on one (py-spy on the burst and the
sustained benches; bench/README.md "The callbacks' own HTTP client" has the before and after).
What a callback needs fits in this file (the pool and the dialling) and http1.py (one exchange:
the request's bytes and the answer's parsing), and two guarantees get simpler than through
aiohttp's private hooks (timewheel/delivery/guarded_clients.py):

- **The SSRF guard** is applied to every address a name resolves to before any is dialled
  (the whole answer is refused if one is not public, as GuardedResolver does), and to IP
  literals in any spelling (``parse_ip_literal``): the socket dials exactly the address
  checked, so DNS rebinding has no second look-up to exploit.
- **The lease's last check** (``ready``) is asked right before the request's bytes are handed
  to the transport, in the same step of the event loop: nothing can pause in between.

What it does not do, on purpose: follow redirects (the contract), use proxies or the
environment, decompress (no ``Accept-Encoding`` is sent), pipeline, or retry a request on a
connection the server closed meanwhile (the attempt is retried with backoff instead; aiohttp
re-sends an idempotent request once after a disconnect, which may deliver it twice).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import aiohappyeyeballs

from timewheel.delivery.grace import GRACE_S
from timewheel.delivery.http1 import Connection, Exchange, Origin, origin_of, request_bytes
from timewheel.delivery.netguard import (
    NOT_WRITTEN,
    BlockedAddress,
    NetworkPolicy,
    NotWritten,
    parse_ip_literal,
)
from timewheel.delivery.senders import (
    MAX_RESPONSE_BYTES,
    RESULT_BODY_BYTES,
    Answer,
    SendError,
    kept_headers,
)

log = logging.getLogger(__name__)

IDLE_SECONDS = 15.0  # an idle connection is closed after this long (aiohttp's keep-alive)
DNS_TTL_SECONDS = 10.0  # resolved (and checked) addresses are reused this long (aiohttp's)
HAPPY_EYEBALLS_DELAY = 0.25  # seconds before the next address is tried (aiohttp's)


AddrInfo = tuple[Any, ...]  # (family, type, proto, canonname, sockaddr), as getaddrinfo gives
Resolve = Callable[[str, int], Awaitable[list[AddrInfo]]]
SocketFactory = Callable[[AddrInfo], socket.socket]


class WireSender:
    """The Sender the dispatcher uses by default (``TIMEWHEEL_HTTP_CLIENT=wire``).

    ``resolve`` (the event loop's getaddrinfo by default) and ``socket_factory`` are there for
    tests: whatever they answer, every address is checked by ``policy`` before it is dialled."""

    def __init__(self, policy: NetworkPolicy, *, max_connections: int,
                 keep_body: int = 1024, result_body: int = RESULT_BODY_BYTES,
                 ssl_context: ssl.SSLContext | None = None, resolve: Resolve | None = None,
                 socket_factory: SocketFactory | None = None,
                 dns_ttl: float = DNS_TTL_SECONDS) -> None:
        self.keep_body = keep_body
        self.result_body = result_body
        self._policy = policy
        self._slots = asyncio.Semaphore(max_connections)
        self._max_idle = max_connections
        self._idle: dict[tuple[bool, str, int], deque[Connection]] = {}
        self._idle_count = 0
        self._open: set[Connection] = set()
        self._resolved: dict[tuple[str, int], tuple[float, list[Any]]] = {}
        self._ssl = ssl_context
        self._resolve = resolve
        self._socket_factory = socket_factory
        self._dns_ttl = dns_ttl
        self._next_sweep = 0.0
        self._closed = False

    async def send(self, method: str, url: str, headers: list[tuple[str, str]],
                   body: bytes | None, timeout: float,
                   ready: Callable[[], bool] | None = None,
                   keep_body: int | None = None,
                   written: Callable[[], None] | None = None) -> Answer:
        keep = self.keep_body if keep_body is None else keep_body
        try:
            origin = origin_of(url)
            request = request_bytes(method, origin, headers, body)
        except ValueError as exc:  # UnicodeEncodeError included
            raise SendError("error", str(exc)) from exc
        if ready is not None and not ready():  # late already: not worth a connection
            raise NotWritten(NOT_WRITTEN)
        loop = asyncio.get_running_loop()
        # The timeout covers the wait for a connection slot and the dial too (as aiohttp's
        # total did). asyncio.timeout guards only those waits, which are rare: around every
        # request it cost ~7 us, ~15 % of the sender's CPU per callback (bench/README.md);
        # the exchange itself has a plain timer (_exchange).
        expires = loop.time() + timeout
        try:
            if self._slots.locked():  # every connection is busy: wait for one
                async with asyncio.timeout_at(expires):
                    await self._slots.acquire()
            else:
                await self._slots.acquire()  # (returns at once)
            try:
                exchange = await self._exchange(
                    origin, request, MAX_RESPONSE_BYTES if keep_body is None else keep, ready,
                    expires, written)
            finally:
                self._slots.release()
        except TimeoutError as exc:
            if exc.errno == errno.ETIMEDOUT:  # the connect's own (an OSError), not the deadline
                raise SendError("connect", f"{type(exc).__name__}: {exc}") from exc
            raise SendError("timeout", f"no answer within {timeout:g}s") from exc
        except BlockedAddress as exc:
            raise SendError("blocked", str(exc)) from exc
        except (OSError, ssl.SSLError) as exc:
            raise SendError("connect", f"{type(exc).__name__}: {exc}") from exc
        data = b"".join(exchange.body)
        retry_after = None
        for name, value in exchange.headers:
            if len(name) == 11 and name.lower() == "retry-after":
                retry_after = value
                break
        return Answer(exchange.status, retry_after, kept_headers(exchange.headers), data[:keep],
                      exchange.cut or len(data) > keep)

    async def _exchange(self, origin: Origin, request: bytes, limit: int,
                        ready: Callable[[], bool] | None, expires: float,
                        written: Callable[[], None] | None = None) -> Exchange:
        """Write the request on a pooled or new connection and read the answer (its body up to
        ``limit`` bytes) by ``expires`` (loop time; TimeoutError after it). The lease's last
        check and the write are in one step of the loop; ``written`` is called right after
        the write."""
        loop = asyncio.get_running_loop()
        conn = self._pooled(origin, loop)
        if conn is None:
            async with asyncio.timeout_at(expires):
                conn = await self._dial(origin, loop)
        # Everything the write needs is made before the last check, so that as little as
        # possible runs between the two: a process stopped there (SIGSTOP, a CPU it does not
        # get) writes when it runs again, whatever its lease says (the soak's aimed stops hit
        # that window once in a burst: bench/README.md, "What the soak found").
        exchange = Exchange(limit, loop.create_future())
        transport = conn.transport
        assert transport is not None
        if ready is not None and not ready():
            self._put_back(origin, conn, loop)  # nothing was written on it
            raise NotWritten(NOT_WRITTEN)
        conn.begin(exchange)
        transport.write(request)
        if written is not None:
            try:
                written()
            except Exception:  # only a report: the request is out, its answer still counts
                log.exception("the sender's report of a write failed")
        timer = loop.call_at(expires, _time_out, exchange.done)
        try:
            await exchange.done
        except BaseException:
            conn.close()  # half an answer, a timeout or a cancel: not reusable
            raise
        finally:
            timer.cancel()
            reusable = conn.finish()
        # An early answer may come while part of the request is still unsent.
        if reusable and not exchange.cut and not transport.get_write_buffer_size():
            self._put_back(origin, conn, loop)
        else:
            conn.close()
        return exchange

    # -- connections

    def _pooled(self, origin: Origin, loop: asyncio.AbstractEventLoop) -> Connection | None:
        """An idle connection to ``origin`` that is still open, or None."""
        idle = self._idle.get(origin.key)
        now = loop.time()
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest to be alive
            self._idle_count -= 1
            if (not conn.closed and now - conn.idle_since < IDLE_SECONDS
                    and conn.transport is not None and not conn.transport.is_closing()):
                return conn
            conn.close()
            self._open.discard(conn)
        return None

    def _put_back(self, origin: Origin, conn: Connection,
                  loop: asyncio.AbstractEventLoop) -> None:
        if self._closed or conn.closed:
            conn.close()
            self._open.discard(conn)
            return
        now = conn.idle_since = loop.time()
        self._idle.setdefault(origin.key, deque()).append(conn)
        self._idle_count += 1
        if self._idle_count > self._max_idle:
            self._close_oldest_idle()
        if now >= self._next_sweep:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Drop idle connections that closed or idled too long, of every origin (a pool is
        otherwise looked at only when its origin is called again)."""
        self._next_sweep = now + IDLE_SECONDS
        for key, idle in list(self._idle.items()):
            fresh = deque(c for c in idle if not c.closed and now - c.idle_since < IDLE_SECONDS)
            for conn in idle:
                if conn.closed or now - conn.idle_since >= IDLE_SECONDS:
                    conn.close()
            self._idle_count -= len(idle) - len(fresh)
            if fresh:
                self._idle[key] = fresh
            else:
                del self._idle[key]

    def _close_oldest_idle(self) -> None:
        oldest: deque[Connection] | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest[0].idle_since):
                oldest = idle
        if oldest is not None:
            conn = oldest.popleft()
            self._idle_count -= 1
            conn.close()
            self._open.discard(conn)

    async def _dial(self, origin: Origin, loop: asyncio.AbstractEventLoop) -> Connection:
        if self._closed:
            raise OSError("the sender is closed")
        addresses = await self._addresses(origin, loop)
        # Happy eyeballs over the checked addresses (as aiohttp does, with the same library):
        # the next one is tried after 0.25 s, so one address that drops packets (a broken
        # IPv6 route, a dead node among several A records) does not eat the whole timeout.
        sock = await aiohappyeyeballs.start_connection(
            addresses, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY, interleave=1,
            socket_factory=self._guarded_socket)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _, conn = await loop.create_connection(
                lambda: Connection(self._open), sock=sock,
                ssl=self._tls() if origin.tls else None,
                # The name without a trailing dot: certificates never carry one.
                server_hostname=origin.host.rstrip(".") if origin.tls else None)
        except BaseException:  # a TLS failure, the timeout, a cancel: the socket goes too
            sock.close()
            raise
        self._open.add(conn)
        return conn

    def _guarded_socket(self, info: AddrInfo) -> socket.socket:
        """Every socket is for an address the policy was asked about just now (the
        backstop: ``_addresses`` checked the whole answer already)."""
        self._policy.check_ip(str(info[4][0]))
        if self._socket_factory is not None:
            return self._socket_factory(info)
        return socket.socket(info[0], info[1], info[2])

    async def _addresses(self, origin: Origin, loop: asyncio.AbstractEventLoop) -> list[Any]:
        """Where ``origin`` may be dialled: every address checked by the SSRF policy (one
        refused refuses the whole answer), remembered for DNS_TTL_SECONDS."""
        key = (origin.host, origin.port)
        now = loop.time()
        known = self._resolved.get(key)
        if known is not None and now - known[0] < self._dns_ttl:
            return known[1]
        literal = parse_ip_literal(origin.host)
        if literal is not None:
            self._policy.check_ip(literal, host=origin.host)
            family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
            addresses: list[Any] = [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                                     (str(literal), origin.port))]
        else:
            if self._resolve is not None:
                addresses = await self._resolve(origin.host, origin.port)
            else:
                addresses = await loop.getaddrinfo(origin.host, origin.port,
                                                   type=socket.SOCK_STREAM)
            if not addresses:
                raise OSError(f"{origin.host} resolves to no address")
            addresses = [_checked(self._policy, info, origin.host) for info in addresses]
        if len(self._resolved) >= 4096:
            self._resolved.clear()
        self._resolved[key] = (now, addresses)
        return addresses

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
        self._idle_count = 0


def _time_out(done: asyncio.Future[None]) -> None:
    """The exchange's time is up, but what has come is read first: a process that ran again
    after a stop (SIGSTOP, a CPU it did not get) has its event loop run its expired timers
    before it reads its sockets (libuv, after its wait for them returned EINTR), and the
    answer may be waiting there (tests/test_sender_stall.py). A timer 1 ms on lets the loop
    poll them once; a ``call_soon`` would run before that poll."""
    if not done.done():
        done.get_loop().call_later(GRACE_S, _give_up, done)


def _give_up(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_exception(TimeoutError())


def _checked(policy: NetworkPolicy, info: AddrInfo, host: str) -> AddrInfo:
    """A resolved address, checked, with the address as the checked IP's own text (so the
    socket dials exactly what was checked, never a spelling it might look up again)."""
    family, type_, proto, canonname, sockaddr = info
    text = str(sockaddr[0])
    ip = parse_ip_literal(text.split("%", 1)[0])
    if ip is None:
        raise BlockedAddress(text, "not an IP address", host=host)
    policy.check_ip(ip, host=host)
    scope = "%" + text.split("%", 1)[1] if "%" in text else ""
    return (family, type_, proto, canonname, (str(ip) + scope, *sockaddr[1:]))

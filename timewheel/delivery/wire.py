"""The callbacks' own HTTP/1.1 client: one request per keep-alive connection at a time, the
response parsed by httptools (llhttp, the parser uvicorn uses), the connections pooled here.

Why not aiohttp: a callback is one small request with a known body, no redirects, no cookies,
no proxies, no compression and no streaming, and aiohttp's general machinery (its request and
response classes, connector, payload registry, timers and stream readers) cost the service
~90 us of CPU per callback, about half of all it spends on one (py-spy on the burst and the
sustained benches; bench/README.md "The callbacks' own HTTP client" has the before and after).
What a callback needs fits in this file, and two guarantees get simpler than through
aiohttp's private hooks (timewheel/delivery/netguard.py):

- **The SSRF guard** is applied to every address a name resolves to before any is dialled
  (the whole answer is refused if one is not public, as GuardedResolver does), and to IP
  literals in any spelling (``parse_ip_literal``): the socket dials exactly the address
  checked, so DNS rebinding has no second look-up to exploit.
- **The lease's last check** (``ready``) is asked right before the request's bytes are handed
  to the transport, in the same step of the event loop: nothing can pause in between.

What it does not do, on purpose: follow redirects (the contract), use proxies or the
environment, decompress (no ``Accept-Encoding`` is sent), pipeline, or retry a request on a
connection the server closed meanwhile (the attempt is retried with backoff, as with aiohttp).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import re
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import aiohappyeyeballs
import httptools
import yarl

from timewheel.delivery.netguard import BlockedAddress, NetworkPolicy, NotWritten, parse_ip_literal
from timewheel.delivery.senders import (
    MAX_RESPONSE_BYTES,
    RESULT_BODY_BYTES,
    Answer,
    SendError,
    kept_headers,
)

IDLE_SECONDS = 15.0  # an idle connection is closed after this long (aiohttp's keep-alive)
DNS_TTL_SECONDS = 10.0  # resolved (and checked) addresses are reused this long (aiohttp's)
MAX_HEAD_BYTES = 64 * 1024  # a response whose status line and headers are longer: an error
_NO_BODY_STATUS = frozenset({204, 304})
HAPPY_EYEBALLS_DELAY = 0.25  # seconds before the next address is tried (aiohttp's)
_SAFE_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
_UNSAFE_VALUE = re.compile(r"[\r\n\0]")


class _Origin:
    """What a callback URL says about where and what to send (parsed once per URL)."""

    __slots__ = ("authorization", "head", "host", "key", "port", "tls")

    def __init__(self, url: str) -> None:
        parsed = yarl.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.raw_host:
            raise ValueError(f"not an absolute http(s) URL: {url!r}")
        self.tls = parsed.scheme == "https"
        self.host = parsed.raw_host  # IDNA-encoded; an IPv6 literal without brackets
        port = parsed.port
        assert port is not None  # yarl gives the scheme's default
        self.port = port
        self.key = (self.tls, self.host, port)
        target = parsed.raw_path_qs or "/"
        host = f"[{self.host}]" if ":" in self.host else self.host
        if not parsed.is_default_port():
            host = f"{host}:{port}"
        # The request line and Host header, as bytes: the same on every attempt.
        self.head = f" {target} HTTP/1.1\r\nHost: {host}\r\n".encode("ascii", "strict")
        self.authorization: str | None = None
        if parsed.user is not None:  # as aiohttp does: URL credentials become Basic auth
            text = f"{parsed.user}:{parsed.password or ''}"
            try:  # as aiohttp's BasicAuth: latin-1, and UTF-8 only for what it cannot write
                pair = text.encode("latin-1")
            except UnicodeEncodeError:
                pair = text.encode("utf-8")
            self.authorization = "Basic " + base64.b64encode(pair).decode("ascii")


@functools.lru_cache(maxsize=4096)
def _origin(url: str) -> _Origin:
    return _Origin(url)


class _Exchange:
    """One response being read: what the parser has told so far."""

    __slots__ = ("body", "cut", "done", "eof_ends", "got", "head_bytes", "headers",
                 "limit", "status")

    def __init__(self, limit: int, done: asyncio.Future[None]) -> None:
        self.limit = limit  # body bytes kept; more and the response is cut (not drained)
        self.done = done
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []
        self.got = 0
        self.cut = False
        self.eof_ends = False  # no length and not chunked: the body ends with the connection
        self.head_bytes = 0


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one exchange at a time."""

    def __init__(self, open_connections: set[_Connection]) -> None:
        self._open = open_connections  # the sender's: a connection leaves it when it closes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._exchange: _Exchange | None = None
        self._head_done = False
        self._keep_alive = False

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # A 101 is a final answer (on_headers_complete kept it); what follows is not HTTP.
            self.close()
            return
        except httptools.HttpParserError as exc:
            # Also what on_message_begin raises for bytes after a complete answer: the
            # answer already taken stands, the connection goes.
            self._fail(SendError("error", f"invalid HTTP response: {exc}"))
            return
        if not self._head_done:  # a head still unfinished after this many bytes: refused
            exchange.head_bytes += len(data)
            if exchange.head_bytes > MAX_HEAD_BYTES:
                self._fail(SendError("error", f"response head over {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool:
        self.closed = True  # at once: a send in this loop step must not pick it from the pool
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._open.discard(self)
        exchange = self._exchange
        if exchange is not None and not exchange.done.done():
            if self._head_done and exchange.eof_ends:
                exchange.done.set_result(None)  # the body was everything until the close
            else:
                why = f"{type(exc).__name__}: {exc}" if exc else "closed by the server"
                exchange.done.set_exception(
                    SendError("connect", f"connection lost before the whole answer: {why}"))

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        if self._head_done:  # a second message after the answer: not ours to read
            raise ValueError("bytes after a complete answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._exchange is not None
        if not self._head_done:  # trailers of a chunked body do not join the answer's head
            self._exchange.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        exchange = self._exchange
        assert exchange is not None
        status = self._parser.get_status_code()
        if status < 200 and status != 101:  # 100 Continue, 103 Early Hints: the answer follows
            exchange.headers.clear()
            return
        exchange.status = status
        self._head_done = True
        if status == 101:  # switching protocols: final (and never retried: docs/api.md)
            exchange.done.set_result(None)
        elif status not in _NO_BODY_STATUS:
            # Neither a length nor a chunked coding last: the body ends with the connection.
            length, coding = False, ""
            for name, value in exchange.headers:
                lower = name.lower()
                if lower == "content-length":
                    length = True
                elif lower == "transfer-encoding":
                    coding = value
            exchange.eof_ends = not length and not coding.lower().rstrip().endswith("chunked")

    def on_body(self, chunk: bytes) -> None:
        exchange = self._exchange
        assert exchange is not None
        room = exchange.limit - exchange.got
        if room > 0:
            exchange.body.append(chunk[:room])
        exchange.got += len(chunk)
        if exchange.got > exchange.limit and not exchange.cut:
            # A large answer is not worth reading on: keep what fits, drop the connection.
            exchange.cut = True
            if not exchange.done.done():
                exchange.done.set_result(None)
            self.close()

    def on_message_complete(self) -> None:
        exchange = self._exchange
        if exchange is None or not self._head_done:
            return  # the end of a 1xx message: the answer follows
        # Asked here: once the message is over, the parser's flags belong to the next one.
        self._keep_alive = self._parser.should_keep_alive()
        if not exchange.done.done():
            exchange.done.set_result(None)

    # -- used by the sender

    def begin(self, exchange: _Exchange) -> None:
        self._exchange = exchange
        self._head_done = False
        self._keep_alive = False

    def finish(self) -> bool:
        """The exchange is over; whether the connection may carry another one."""
        self._exchange = None
        return not self.closed and self._keep_alive

    def _fail(self, error: SendError) -> None:
        exchange = self._exchange
        if exchange is not None and not exchange.done.done():
            exchange.done.set_exception(error)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


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
        self._idle: dict[tuple[bool, str, int], deque[_Connection]] = {}
        self._idle_count = 0
        self._open: set[_Connection] = set()
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
                   keep_body: int | None = None) -> Answer:
        keep = self.keep_body if keep_body is None else keep_body
        limit = MAX_RESPONSE_BYTES if keep_body is None else keep
        try:
            origin = _origin(url)
            request = _request_bytes(method, origin, headers, body)
        except ValueError as exc:  # UnicodeEncodeError included
            raise SendError("error", str(exc)) from exc
        loop = asyncio.get_running_loop()
        try:
            async with self._slots, asyncio.timeout(timeout):
                conn = await self._connection(origin, loop)
                if ready is not None and not ready():
                    self._put_back(origin, conn, loop)  # nothing was written on it
                    raise NotWritten("the attempt's lease ran short before its request "
                                     "was written")
                exchange = _Exchange(limit, loop.create_future())
                conn.begin(exchange)
                assert conn.transport is not None
                conn.transport.write(request)
                try:
                    await exchange.done
                except BaseException:
                    conn.close()  # half an answer, a timeout or a cancel: not reusable
                    raise
                finally:
                    reusable = conn.finish()
                # An early answer may come while part of the request is still unsent.
                if (reusable and not exchange.cut
                        and not conn.transport.get_write_buffer_size()):
                    self._put_back(origin, conn, loop)
                else:
                    conn.close()
        except TimeoutError as exc:
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

    # -- connections

    async def _connection(self, origin: _Origin, loop: asyncio.AbstractEventLoop
                          ) -> _Connection:
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
        return await self._dial(origin, loop)

    def _put_back(self, origin: _Origin, conn: _Connection,
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
        oldest: deque[_Connection] | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest[0].idle_since):
                oldest = idle
        if oldest is not None:
            conn = oldest.popleft()
            self._idle_count -= 1
            conn.close()
            self._open.discard(conn)

    async def _dial(self, origin: _Origin, loop: asyncio.AbstractEventLoop) -> _Connection:
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
                lambda: _Connection(self._open), sock=sock,
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

    async def _addresses(self, origin: _Origin, loop: asyncio.AbstractEventLoop) -> list[Any]:
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


def _request_bytes(method: str, origin: _Origin, headers: list[tuple[str, str]],
                   body: bytes | None) -> bytes:
    """The request as it goes on the wire. Header names and values were checked when the
    task was created (RFC 9110 tokens; no CR, LF or NUL in values: docs/api.md); they are
    checked again here, so no stored value can ever split the request."""
    lines = [method, origin.head.decode("ascii")]
    given = set()
    for name, value in headers:
        if not _SAFE_HEADER.fullmatch(name) or _UNSAFE_VALUE.search(value):
            raise ValueError(f"header {name!r} cannot be sent: a bad name or CR, LF or NUL")
        lines.append(f"{name}: {value}\r\n")
        given.add(name.lower())
    if origin.authorization is not None and "authorization" not in given:
        lines.append(f"Authorization: {origin.authorization}\r\n")
    if "accept" not in given:  # as aiohttp sent it: some firewalls refuse a request without
        lines.append("Accept: */*\r\n")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}\r\n\r\n")
        return "".join(lines).encode("utf-8") + body
    if method in ("POST", "PUT", "PATCH"):
        lines.append("Content-Length: 0\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8")

"""One HTTP/1.1 exchange on a keep-alive connection, for the callbacks' client
(timewheel/delivery/wire.py): the request's bytes, and the answer read by httptools (llhttp,
the parser uvicorn uses) into what an attempt keeps of it.

A connection carries one exchange at a time (no pipelining). Bytes after a complete answer,
or with no exchange under way, end the connection: nothing a server sends can stand in for
another request's answer.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import re

import httptools
import yarl

from timewheel.delivery.senders import SendError

MAX_HEAD_BYTES = 64 * 1024  # a response whose status line and headers are longer: an error
_NO_BODY_STATUS = frozenset({204, 304})
_SAFE_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
_UNSAFE_VALUE = re.compile(r"[\r\n\0]")


class Origin:
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
        # The rest of the request line and the Host header: the same on every attempt
        # (ASCII: yarl keeps the target percent-encoded and the host IDNA-encoded).
        self.head = f" {target} HTTP/1.1\r\nHost: {host}\r\n"
        self.head.encode("ascii")  # UnicodeEncodeError (a ValueError) if not
        self.authorization: str | None = None
        if parsed.user is not None:  # as aiohttp does: URL credentials become Basic auth
            text = f"{parsed.user}:{parsed.password or ''}"
            try:  # as aiohttp's BasicAuth: latin-1, and UTF-8 only for what it cannot write
                pair = text.encode("latin-1")
            except UnicodeEncodeError:
                pair = text.encode("utf-8")
            self.authorization = "Basic " + base64.b64encode(pair).decode("ascii")


@functools.lru_cache(maxsize=4096)
def origin_of(url: str) -> Origin:
    return Origin(url)


class Exchange:
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


class Connection(asyncio.Protocol):
    """One keep-alive connection: at most one exchange at a time."""

    def __init__(self, open_connections: set[Connection]) -> None:
        self._open = open_connections  # the sender's: a connection leaves it when it closes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._exchange: Exchange | None = None
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

    def begin(self, exchange: Exchange) -> None:
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


def request_bytes(method: str, origin: Origin, headers: list[tuple[str, str]],
                   body: bytes | None) -> bytes:
    """The request as it goes on the wire. Header names and values were checked when the
    task was created (RFC 9110 tokens; no CR, LF or NUL in values: docs/api.md); they are
    checked again here, so no stored value can ever split the request."""
    lines = [method, origin.head]
    given = set()
    for name, value in headers:
        given.add(_CHECKED_NAMES.get(name) or _checked_name(name))
        lines.append(f"{name}: {value}\r\n")
    # One search over every value, not one a header: this runs once per attempt.
    if _UNSAFE_VALUE.search("".join([value for _, value in headers])):
        bad = next(name for name, value in headers if _UNSAFE_VALUE.search(value))
        raise ValueError(f"header {bad!r} cannot be sent: CR, LF or NUL in its value")
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


# Header names already found to be tokens, each with its lower case: most attempts send the
# same few names (the webhook-* and timewheel-* headers, the tasks' own), and the token check
# and lower() of each took half of request_bytes' 8.7 us. Bounded: at most _MAX_CHECKED_NAMES
# names of at most _MAX_CHECKED_NAME_LENGTH characters (a name may be as long as a request;
# caching long ones could hold gigabytes); the others are checked every time.
_CHECKED_NAMES: dict[str, str] = {}
_MAX_CHECKED_NAMES = 4096
_MAX_CHECKED_NAME_LENGTH = 64


def _checked_name(name: str) -> str:
    """``name`` in lower case, once it is known to be an RFC 9110 token; else ValueError."""
    if not _SAFE_HEADER.fullmatch(name):
        raise ValueError(f"header {name!r} cannot be sent: its name is not a token")
    lower = name.lower()
    if len(name) <= _MAX_CHECKED_NAME_LENGTH and len(_CHECKED_NAMES) < _MAX_CHECKED_NAMES:
        _CHECKED_NAMES[name] = lower
    return lower

"""WireSender, the callbacks' own HTTP/1.1 client (timewheel/delivery/wire.py), against real
local servers scripted byte for byte: what goes on the wire, how each shape of answer is read,
when a connection is kept for the next callback and when it is dropped, how each failure is
reported (and that the sender still works after it), the SSRF guard (nothing dialled), the
lease's last check (nothing written) and TLS.

Only loopback is ever dialled. Every server here is an ``asyncio.start_server`` in the test's
own event loop; it records each connection it accepts (a ``Peer``) and each request read on it,
and answers the n-th request it reads with the n-th scripted reply (then "200 ok").
"""

from __future__ import annotations

import asyncio
import base64
import gc
import ipaddress
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.tls import client_context, self_signed, server_context
from tests.support.waiting import wait_until
from timewheel.delivery import http1, wire
from timewheel.delivery.netguard import NetworkPolicy, NotWritten
from timewheel.delivery.senders import MAX_RESPONSE_BYTES, SendError, kept_headers
from timewheel.delivery.wire import WireSender

OPEN = NetworkPolicy(allow_private=True)  # loopback allowed: what most tests need
STRICT = NetworkPolicy()  # the default: private and loopback addresses refused
TIMEOUT = 10.0  # generous: a send that should be answered never gets near it
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def _can_bind(host: str) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.bind((host, 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _can_bind("::1"), reason="no IPv6 loopback here")


# ------------------------------------------------------------------ the scripted server


@dataclass(frozen=True)
class Request:
    """One request as it arrived: its head (request line and headers, through the blank
    line) and the body its Content-Length announced."""

    head: bytes
    body: bytes

    @property
    def target(self) -> str:
        return self.head.split(b" ", 2)[1].decode()

    @property
    def headers(self) -> list[tuple[str, str]]:
        lines = self.head.decode("latin-1").split("\r\n")[1:-2]
        return [(name, value.strip()) for name, _, value in (x.partition(":") for x in lines)]


@dataclass(eq=False)
class Peer:
    """One connection the server accepted."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    requests: list[Request] = field(default_factory=list)
    eof: bool = False  # the server read the end of what the client sends on it

    async def next_request(self) -> Request | None:
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            return Request(head, await self.reader.readexactly(length))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof = True
            return None

    async def until_closed(self) -> None:
        """Read (and drop) whatever comes until the client closes the connection."""
        try:
            while await self.reader.read(65536):
                pass
        except ConnectionError:
            pass
        self.eof = True

    async def write(self, *parts: bytes) -> None:
        """Each part in a write of its own (the client may still read them together)."""
        for part in parts:
            self.writer.write(part)
            await self.writer.drain()


Script = Callable[[Peer, Request], Awaitable[None]]


def replying(*parts: bytes) -> Script:
    async def script(peer: Peer, request: Request) -> None:
        await peer.write(*parts)
    return script


def replying_then_closing(*parts: bytes) -> Script:
    async def script(peer: Peer, request: Request) -> None:
        await peer.write(*parts)
        peer.writer.close()
    return script


def replying_then_half_closing(*parts: bytes) -> Script:
    """Answer, then close the server's side only: the connection is over once the client
    notices and closes its own side (``Peer.eof``)."""
    async def script(peer: Peer, request: Request) -> None:
        await peer.write(*parts)
        peer.writer.write_eof()
    return script


def replying_in_one_write(data: bytes) -> Script:
    """A large answer handed to the kernel at once (a send buffer big enough for it), so it
    reaches the client as one read, as it does from a fast receiver on a fast network."""
    async def script(peer: Peer, request: Request) -> None:
        sock = peer.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * len(data))
        await peer.write(data)
    return script


async def never_answering(peer: Peer, request: Request) -> None:
    await peer.until_closed()


class ScriptedServer:
    def __init__(self, host: str, ssl_context: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = 0
        self.peers: list[Peer] = []
        self._ssl = ssl_context
        self._replies: deque[Script | bytes] = deque()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    def script(self, *replies: Script | bytes) -> None:
        """The next requests' answers, in the order the requests are read (on any
        connection); bytes are written as they are. After them: 200 "ok"."""
        self._replies.extend(replies)

    def url(self, path: str = "/hook", scheme: str = "http") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}{path}"

    @property
    def requests(self) -> list[Request]:
        return [request for peer in self.peers for request in peer.requests]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        peer = Peer(reader, writer)
        self.peers.append(peer)
        try:
            while (request := await peer.next_request()) is not None:
                peer.requests.append(request)
                reply = self._replies.popleft() if self._replies else OK
                if isinstance(reply, bytes):
                    await peer.write(reply)
                else:
                    await reply(peer, request)
        except (ConnectionError, ssl.SSLError):
            peer.eof = True
        finally:
            writer.close()
            self._handlers.discard(task)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for peer in self.peers:
            peer.writer.close()  # the handler reads EOF and ends
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[ScriptedServer]]]:
    """``await serve()`` starts a scripted server on 127.0.0.1 (``serve("::1")`` on IPv6
    loopback, ``ssl_context=`` for TLS); all are stopped after the test."""
    servers: list[ScriptedServer] = []

    async def start(host: str = "127.0.0.1",
                    ssl_context: ssl.SSLContext | None = None) -> ScriptedServer:
        server = ScriptedServer(host, ssl_context)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def server(serve: Callable[..., Awaitable[ScriptedServer]]) -> ScriptedServer:
    return await serve()


@pytest.fixture
async def sender() -> AsyncIterator[WireSender]:
    sender = WireSender(OPEN, max_connections=4)
    yield sender
    await sender.aclose()


def head_of(status: str, *headers: str, length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status}", *headers]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# ------------------------------------------------------------------ the request on the wire


async def test_a_post_goes_out_as_request_line_host_headers_in_order_length_and_body(
        server: ScriptedServer, sender: WireSender) -> None:
    headers = [("Content-Type", "application/json"), ("X-Zeta", "last?"), ("X-Alpha", "a b")]
    answer = await sender.send("POST", server.url("/hook/x?y=1&z=%20"), headers,
                               b'{"a":1}', TIMEOUT)
    assert answer.status == 200
    [request] = server.requests
    assert request.head == (
        b"POST /hook/x?y=1&z=%20 HTTP/1.1\r\n"
        + f"Host: 127.0.0.1:{server.port}\r\n".encode()
        + b"Content-Type: application/json\r\nX-Zeta: last?\r\nX-Alpha: a b\r\n"
        b"Accept: */*\r\nContent-Length: 7\r\n\r\n")
    assert request.body == b'{"a":1}'


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
async def test_a_method_with_a_body_and_none_given_sends_content_length_zero(
        server: ScriptedServer, sender: WireSender, method: str) -> None:
    await sender.send(method, server.url("/"), [("X-A", "1")], None, TIMEOUT)
    [request] = server.requests
    assert request.head == (f"{method} / HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                            "X-A: 1\r\nAccept: */*\r\nContent-Length: 0\r\n\r\n").encode()


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_request_without_a_body_sends_no_content_length(
        server: ScriptedServer, sender: WireSender, method: str) -> None:
    await sender.send(method, server.url("/q?x=1"), [], None, TIMEOUT)
    [request] = server.requests
    assert request.head == (f"{method} /q?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                            "Accept: */*\r\n\r\n").encode()


async def test_a_url_without_a_path_asks_for_the_root(
        server: ScriptedServer, sender: WireSender) -> None:
    await sender.send("GET", f"http://127.0.0.1:{server.port}", [], None, TIMEOUT)
    assert [request.target for request in server.requests] == ["/"]


async def test_credentials_in_the_url_become_basic_authorization(
        server: ScriptedServer, sender: WireSender) -> None:
    url = f"http://user:p%40ss@127.0.0.1:{server.port}/hook"
    await sender.send("POST", url, [("X-A", "1")], b"{}", TIMEOUT)
    [request] = server.requests
    expected = "Basic " + base64.b64encode(b"user:p@ss").decode()
    assert request.headers == [("Host", f"127.0.0.1:{server.port}"), ("X-A", "1"),
                               ("Authorization", expected), ("Accept", "*/*"),
                               ("Content-Length", "2")]


async def test_an_authorization_header_given_wins_over_credentials_in_the_url(
        server: ScriptedServer, sender: WireSender) -> None:
    url = f"http://user:pass@127.0.0.1:{server.port}/hook"
    await sender.send("POST", url, [("authorization", "Bearer t0k")], b"{}", TIMEOUT)
    [request] = server.requests
    assert [(n, v) for n, v in request.headers if n.lower() == "authorization"] == [
        ("authorization", "Bearer t0k")]


# ------------------------------------------------------------------ reading the answer


async def test_the_answer_has_the_status_retry_after_and_only_the_kept_headers(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(head_of("503 Service Unavailable", "Retry-After: 7",
                          "Content-Type: text/plain", "X-Request-Id: r-1",
                          "Set-Cookie: s=1", "Server: test", "X-Other: no", length=4)
                  + b"busy")
    answer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert (answer.status, answer.retry_after) == (503, "7")
    assert answer.headers == {"retry-after": "7", "content-type": "text/plain",
                              "x-request-id": "r-1", "content-length": "4"}
    assert (answer.body, answer.body_truncated) == (b"busy", False)


async def test_the_named_headers_are_kept_before_id_headers_that_came_first(
        server: ScriptedServer, sender: WireSender) -> None:
    """docs/api.md v3: content-type, content-length, retry-after and location are always
    kept; id headers fill the rest of the ten in arrival order, whatever came first."""
    ids = ["X-Correlation-Id", "Request-Id", "X-Amzn-RequestId", "X-Trace-Id", "X-B3-TraceId",
           "X-Amz-Request-Id", "X-Ms-Request-Id", "X-Span-Id", "X-Request-Id", "X-Event-Id"]
    server.script(head_of("503 Service Unavailable",
                          *(f"{name}: {i}" for i, name in enumerate(ids)),
                          "X-Request-Id: repeated", "Retry-After: 30",
                          "Location: /elsewhere", "Content-Type: text/plain",
                          "X-Message-Id: late", length=4)
                  + b"busy")
    answer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert answer.headers == {
        "retry-after": "30", "location": "/elsewhere", "content-type": "text/plain",
        "content-length": "4", "x-correlation-id": "0", "request-id": "1",
        "x-amzn-requestid": "2", "x-trace-id": "3", "x-b3-traceid": "4",
        "x-amz-request-id": "5"}
    assert list(answer.headers)[:4] == ["retry-after", "location", "content-type",
                                        "content-length"]


def test_kept_headers_keep_the_first_value_and_no_more_than_ten() -> None:
    many = [(f"X-Id-{i}-Id", str(i)) for i in range(12)]
    assert kept_headers([*many, ("Location", "/a"), ("location", "/b")]) == {
        "location": "/a", **{f"x-id-{i}-id": str(i) for i in range(9)}}
    assert kept_headers([("Server", "x"), ("X-Request-Id", "r"), ("Set-Cookie", "s")]) == {
        "x-request-id": "r"}


async def test_an_answer_without_retry_after_has_none(
        server: ScriptedServer, sender: WireSender) -> None:
    answer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert (answer.status, answer.retry_after, answer.body) == (200, None, b"ok")


async def test_the_body_excerpt_is_cut_at_keep_body_and_says_so(
        server: ScriptedServer) -> None:
    server.script(head_of("200 OK", length=10) + b"0123456789",
                  head_of("200 OK", length=4) + b"0123")
    sender = WireSender(OPEN, max_connections=4, keep_body=4)
    try:
        longer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
        exact = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    finally:
        await sender.aclose()
    assert (longer.body, longer.body_truncated) == (b"0123", True)
    assert (exact.body, exact.body_truncated) == (b"0123", False)
    assert len(server.peers) == 1  # a body read to its end leaves the connection reusable


async def test_a_result_callbacks_keep_body_replaces_the_senders_own(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(head_of("200 OK", length=10) + b"0123456789",
                  head_of("200 OK", length=10) + b"0123456789")
    whole = await sender.send("POST", server.url(), [], b"{}", TIMEOUT, keep_body=10)
    cut = await sender.send("POST", server.url(), [], b"{}", TIMEOUT, keep_body=6)
    assert (whole.body, whole.body_truncated) == (b"0123456789", False)
    assert (cut.body, cut.body_truncated) == (b"012345", True)


async def test_a_chunked_body_is_read_across_its_chunks(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(replying(head_of("200 OK", "Transfer-Encoding: chunked",
                                   "Content-Type: text/plain"),
                           b"3\r\nabc\r\n", b"4\r\ndefg\r\n", b"a\r\nhijklmnopq\r\n",
                           b"0\r\n\r\n"))
    answer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert (answer.status, answer.body) == (200, b"abcdefghijklmnopq")
    assert answer.headers == {"content-type": "text/plain"}
    again = await sender.send("POST", server.url("/again"), [], b"{}", TIMEOUT)
    assert again.status == 200 and len(server.peers) == 1  # the chunked answer was whole


async def test_a_body_with_neither_length_nor_chunks_ends_with_the_connection(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(replying_then_closing(head_of("200 OK", "Content-Type: text/plain"),
                                        b"until ", b"the end"))
    answer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert (answer.status, answer.body, answer.body_truncated) == (200, b"until the end",
                                                                   False)
    again = await sender.send("POST", server.url("/again"), [], b"{}", TIMEOUT)
    assert again.status == 200
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/hook"],
                                                                           ["/again"]]


@pytest.mark.parametrize("status", ["204 No Content", "304 Not Modified"])
async def test_an_answer_that_has_no_body_is_over_after_its_head(
        server: ScriptedServer, sender: WireSender, status: str) -> None:
    # No length and no close: the answer must be known complete from its status alone.
    server.script(head_of(status, "X-Request-Id: r-9"))
    answer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert (answer.status, answer.body, answer.body_truncated) == (int(status[:3]), b"",
                                                                   False)
    assert answer.headers == {"x-request-id": "r-9"}
    await sender.send("POST", server.url("/again"), [], b"{}", TIMEOUT)
    assert len(server.peers) == 1


@pytest.mark.parametrize("informational", [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nX-Request-Id: early\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n",
], ids=["100", "103", "100-then-102"])
async def test_an_informational_answer_is_skipped_for_the_real_one_after_it(
        server: ScriptedServer, sender: WireSender, informational: bytes) -> None:
    server.script(replying(informational,
                           head_of("201 Created", "X-Request-Id: real", length=4) + b"done"))
    answer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert (answer.status, answer.body) == (201, b"done")
    assert answer.headers == {"x-request-id": "real", "content-length": "4"}
    again = await sender.send("POST", server.url("/again"), [], b"{}", TIMEOUT)
    assert (again.status, len(server.peers)) == (200, 1)


# ------------------------------------------------------------------ keep-alive


async def test_sequential_sends_to_one_origin_share_one_connection(
        server: ScriptedServer, sender: WireSender) -> None:
    for path in ("/a", "/b", "/c"):
        assert (await sender.send("POST", server.url(path), [], b"{}", TIMEOUT)).status == 200
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/a", "/b", "/c"]]


@pytest.mark.parametrize("idle_seconds", [0.0, 3600.0])
async def test_an_idle_connection_of_an_origin_not_called_again_is_closed_once_stale(
        serve: Callable[..., Awaitable[ScriptedServer]], sender: WireSender,
        monkeypatch: pytest.MonkeyPatch, idle_seconds: float) -> None:
    """Idle connections are swept across origins when any connection goes back to the pool:
    one idle longer than IDLE_SECONDS is closed though its origin is never called again
    (0 s: at once); the control (an hour) keeps it open and reuses it."""
    monkeypatch.setattr(wire, "IDLE_SECONDS", idle_seconds)
    a, b = await serve(), await serve()
    await sender.send("POST", a.url("/1"), [], b"{}", TIMEOUT)
    await sender.send("POST", b.url("/1"), [], b"{}", TIMEOUT)  # its put-back sweeps
    if idle_seconds == 0.0:
        await wait_until(lambda: a.peers[0].eof, "the stale idle connection to be closed")
    else:
        await sender.send("POST", a.url("/2"), [], b"{}", TIMEOUT)
        assert [[r.target for r in peer.requests] for peer in a.peers] == [["/1", "/2"]]


async def test_an_answer_saying_connection_close_is_not_reused(
        server: ScriptedServer, sender: WireSender) -> None:
    # The server leaves the connection open: only the header says not to reuse it.
    server.script(head_of("200 OK", "Connection: close", length=2) + b"ok")
    await sender.send("POST", server.url("/a"), [], b"{}", TIMEOUT)
    answer = await sender.send("POST", server.url("/b"), [], b"{}", TIMEOUT)
    assert answer.status == 200
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/a"], ["/b"]]


async def test_an_http_1_0_answer_without_keep_alive_is_not_reused(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
    await sender.send("POST", server.url("/a"), [], b"{}", TIMEOUT)
    await sender.send("POST", server.url("/b"), [], b"{}", TIMEOUT)
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/a"], ["/b"]]


async def test_a_connection_the_server_closed_while_idle_is_not_reused(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(replying_then_half_closing(OK))
    await sender.send("POST", server.url("/a"), [], b"{}", TIMEOUT)
    first = server.peers[0]
    await wait_until(lambda: first.eof, "the sender to close its side of the closed connection")
    answer = await sender.send("POST", server.url("/b"), [], b"{}", TIMEOUT)
    assert answer.status == 200
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/a"], ["/b"]]


async def test_an_answer_longer_than_a_result_callbacks_keep_body_is_cut_and_dropped(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(head_of("200 OK", length=100) + b"x" * 100)
    answer = await sender.send("POST", server.url("/a"), [], b"{}", TIMEOUT, keep_body=10)
    assert (answer.status, answer.body, answer.body_truncated) == (200, b"x" * 10, True)
    await wait_until(lambda: server.peers[0].eof, "the cut connection to be closed")
    await sender.send("POST", server.url("/b"), [], b"{}", TIMEOUT)
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/a"], ["/b"]]


async def test_an_answer_over_max_response_bytes_is_cut_and_its_connection_dropped(
        server: ScriptedServer, sender: WireSender) -> None:
    size = MAX_RESPONSE_BYTES + 50_000
    server.script(replying_in_one_write(head_of("200 OK", length=size) + b"x" * size))
    answer = await sender.send("POST", server.url("/a"), [], b"{}", TIMEOUT)
    assert (answer.status, answer.body, answer.body_truncated) == (
        200, b"x" * sender.keep_body, True)
    await wait_until(lambda: server.peers[0].eof, "the cut connection to be closed")
    await sender.send("POST", server.url("/b"), [], b"{}", TIMEOUT)
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/a"], ["/b"]]


async def test_an_answer_of_exactly_max_response_bytes_is_read_whole(
        server: ScriptedServer, sender: WireSender) -> None:
    size = MAX_RESPONSE_BYTES
    server.script(replying_in_one_write(head_of("200 OK", length=size) + b"y" * size))
    answer = await sender.send("POST", server.url("/a"), [], b"{}", TIMEOUT,
                               keep_body=MAX_RESPONSE_BYTES)
    assert (answer.status, len(answer.body), answer.body_truncated) == (200, size, False)


async def test_connections_dropped_after_their_answers_are_not_held_by_the_sender(
        server: ScriptedServer, sender: WireSender) -> None:
    def live_connections() -> int:
        gc.collect()
        return sum(isinstance(o, http1.Connection) for o in gc.get_objects())

    server.script(*[head_of("200 OK", "Connection: close", length=2) + b"ok"] * 5)
    before = live_connections()
    for n in range(5):
        await sender.send("POST", server.url(f"/{n}"), [], b"{}", TIMEOUT)
    await wait_until(lambda: all(peer.eof for peer in server.peers),
                     "the sender to close each connection")
    assert len(server.peers) == 5
    assert live_connections() == before


# ------------------------------------------------------------------ failures


async def _control(sender: WireSender, server: ScriptedServer) -> None:
    """After a failure: the same sender still sends, on a connection that works."""
    answer = await sender.send("POST", server.url("/control"), [], b"{}", TIMEOUT)
    assert (answer.status, answer.body) == (200, b"ok")
    assert server.peers[-1].requests[-1].target == "/control"


async def test_a_refused_connection_is_a_connect_error(
        server: ScriptedServer, sender: WireSender) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(SendError) as caught:
            await sender.send("POST", f"http://127.0.0.1:{closed_port}/", [], b"{}", TIMEOUT)
    assert caught.value.kind == "connect"
    await _control(sender, server)


async def test_a_server_closing_mid_answer_is_a_connect_error(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(replying_then_closing(head_of("200 OK", length=10) + b"abc"))
    with pytest.raises(SendError) as caught:
        await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert caught.value.kind == "connect"
    await _control(sender, server)
    assert len(server.peers) == 2


async def test_a_server_closing_before_any_answer_is_a_connect_error(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(replying_then_closing(b""))
    with pytest.raises(SendError) as caught:
        await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert caught.value.kind == "connect"
    await _control(sender, server)


@pytest.mark.parametrize("garbage", [
    b"NOT HTTP AT ALL\r\n\r\n",
    b"HTTP/1.1 abc Nope\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
], ids=["not-http", "bad-status", "bad-length", "bad-chunk"])
async def test_invalid_answer_bytes_are_an_error_and_drop_the_connection(
        server: ScriptedServer, sender: WireSender, garbage: bytes) -> None:
    server.script(garbage)
    with pytest.raises(SendError) as caught:
        await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert caught.value.kind == "error"
    await wait_until(lambda: server.peers[0].eof, "the broken connection to be closed")
    await _control(sender, server)
    assert len(server.peers) == 2


async def test_an_answer_head_over_64_kib_is_an_error(
        server: ScriptedServer, sender: WireSender) -> None:
    pad = "".join(f"X-Pad-{n}: {'p' * 100}\r\n" for n in range(700))  # ~77 KiB, no end
    server.script(replying(b"HTTP/1.1 200 OK\r\n", pad.encode()))
    with pytest.raises(SendError) as caught:
        await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert caught.value.kind == "error"
    await wait_until(lambda: server.peers[0].eof, "the connection to be dropped")
    await _control(sender, server)


async def test_no_answer_within_the_timeout_is_a_timeout_and_drops_the_connection(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(never_answering)
    with pytest.raises(SendError) as caught:
        await sender.send("POST", server.url("/slow"), [], b"{}", 0.2)
    assert caught.value.kind == "timeout"
    await wait_until(lambda: server.peers[0].eof, "the timed-out connection to be closed")
    await _control(sender, server)
    assert len(server.peers) == 2


async def test_a_pooled_connection_that_does_not_answer_in_time_is_a_timeout_and_dropped(
        server: ScriptedServer, sender: WireSender) -> None:
    """The second request goes out on the first one's connection (no dial to time): its
    exchange has a deadline of its own."""
    server.script(OK, never_answering)
    assert (await sender.send("POST", server.url(), [], b"{}", TIMEOUT)).status == 200
    with pytest.raises(SendError) as caught:
        await sender.send("POST", server.url("/slow"), [], b"{}", 0.2)
    assert caught.value.kind == "timeout"
    assert len(server.peers) == 1  # it was the pooled connection that timed out
    await wait_until(lambda: server.peers[0].eof, "the timed-out connection to be closed")
    await _control(sender, server)
    assert len(server.peers) == 2


async def test_the_wait_for_a_free_connection_counts_against_the_timeout(
        server: ScriptedServer) -> None:
    """Every connection busy: a send that gets none within its timeout is a timeout, and
    the slot it never had is not given back (the busy send's own is, once it is answered)."""
    gate = asyncio.Event()

    async def answering_when_told(peer: Peer, request: Request) -> None:
        await gate.wait()
        await peer.write(OK)

    sender = WireSender(OPEN, max_connections=1)

    async def another_send_times_out_unwritten(requests_so_far: int) -> None:
        await wait_until(lambda: len(server.requests) == requests_so_far,
                         "the busy request to arrive")
        with pytest.raises(SendError) as caught:
            await sender.send("POST", server.url("/waits"), [], b"{}", 0.2)
        assert caught.value.kind == "timeout"
        assert len(server.requests) == requests_so_far  # the one that waited was not written

    try:
        server.script(answering_when_told)
        busy = asyncio.create_task(sender.send("POST", server.url("/busy"), [], b"{}", TIMEOUT))
        await another_send_times_out_unwritten(1)
        gate.set()
        assert (await busy).status == 200
        await _control(sender, server)  # the slot is free again
        # ... and there is still only one: while a send holds it, another waits and times out.
        server.script(never_answering)
        held = asyncio.create_task(sender.send("POST", server.url("/held"), [], b"{}", TIMEOUT))
        await another_send_times_out_unwritten(3)
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)
    finally:
        await sender.aclose()


async def test_a_half_answer_within_the_timeout_is_a_timeout(
        server: ScriptedServer, sender: WireSender) -> None:
    async def half_then_silence(peer: Peer, request: Request) -> None:
        await peer.write(head_of("200 OK", length=10) + b"abc")
        await peer.until_closed()

    server.script(half_then_silence)
    with pytest.raises(SendError) as caught:
        await sender.send("POST", server.url("/slow"), [], b"{}", 0.2)
    assert caught.value.kind == "timeout"
    await _control(sender, server)
    assert len(server.peers) == 2


async def test_a_url_that_is_not_http_is_an_error(sender: WireSender) -> None:
    for url in ("ftp://127.0.0.1/x", "/relative/only"):
        with pytest.raises(SendError) as caught:
            await sender.send("POST", url, [], b"{}", TIMEOUT)
        assert caught.value.kind == "error"


# ------------------------------------------------------------------ the SSRF guard


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1", "http://127.0.0.1:{port}/hook"),
    ("127.0.0.1", "http://127.1:{port}/hook"),
    ("127.0.0.1", "http://2130706433:{port}/hook"),
    ("127.0.0.1", "http://localhost:{port}/hook"),
    pytest.param("::1", "http://[::1]:{port}/hook", marks=needs_ipv6),
], ids=["dotted", "short", "integer", "localhost", "ipv6"])
async def test_a_loopback_destination_is_blocked_before_any_connection(
        serve: Callable[..., Awaitable[ScriptedServer]], host: str, url: str) -> None:
    server = await serve(host)
    target = url.format(port=server.port)
    strict = WireSender(STRICT, max_connections=4)
    try:
        with pytest.raises(SendError) as caught:
            await strict.send("POST", target, [], b"{}", TIMEOUT)
        assert caught.value.kind == "blocked"
    finally:
        await strict.aclose()
    # Control: allowed to, the same URL reaches the same server; and that is the only
    # connection it ever accepted (one dialled for the blocked send would be accepted first).
    allowed = WireSender(OPEN, max_connections=4)
    try:
        assert (await allowed.send("POST", target, [], b"{}", TIMEOUT)).status == 200
    finally:
        await allowed.aclose()
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/hook"]]


async def test_a_name_resolving_to_any_non_public_address_is_refused_whole(
        server: ScriptedServer) -> None:
    """One loopback address among public ones refuses the name: none is dialled (a
    tripwire socket factory records every dial and refuses any that is not loopback, so
    even a broken guard reaches nothing outside)."""
    dialled: list[str] = []

    def loopback_only(info: tuple[object, ...]) -> socket.socket:
        family, type_, proto, _, sockaddr = info
        assert isinstance(sockaddr, tuple)
        dialled.append(sockaddr[0])
        if not ipaddress.ip_address(sockaddr[0]).is_loopback:
            raise RuntimeError(f"test tripwire: refusing to dial {sockaddr[0]}")
        return socket.socket(family, type_, proto)  # type: ignore[arg-type]

    def resolving_to(*ips: str) -> Callable[[str, int], Awaitable[list[tuple[object, ...]]]]:
        async def resolve(host: str, port: int) -> list[tuple[object, ...]]:
            assert host == "callbacks.example"
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port))
                    for ip in ips]
        return resolve

    url = f"http://callbacks.example:{server.port}/hook"
    strict = WireSender(STRICT, max_connections=4, socket_factory=loopback_only,
                        resolve=resolving_to("93.184.216.34", "127.0.0.1"))
    try:
        with pytest.raises(SendError) as caught:
            await strict.send("POST", url, [], b"{}", TIMEOUT)
        assert caught.value.kind == "blocked"
    finally:
        await strict.aclose()
    assert dialled == []
    # Control: allowed to, the same name (resolving to loopback alone) is dialled.
    allowed = WireSender(OPEN, max_connections=4, socket_factory=loopback_only,
                         resolve=resolving_to("127.0.0.1"))
    try:
        assert (await allowed.send("POST", url, [], b"{}", TIMEOUT)).status == 200
    finally:
        await allowed.aclose()
    assert dialled == ["127.0.0.1"]
    [request] = server.requests
    assert request.headers[0] == ("Host", f"callbacks.example:{server.port}")


async def test_an_allowed_network_lets_loopback_through_the_default_policy(
        server: ScriptedServer) -> None:
    policy = NetworkPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),))
    sender = WireSender(policy, max_connections=4)
    try:
        assert (await sender.send("POST", server.url(), [], b"{}", TIMEOUT)).status == 200
    finally:
        await sender.aclose()


# ------------------------------------------------------------------ the lease's last check


async def test_a_request_whose_lease_ran_short_is_not_written(
        server: ScriptedServer, sender: WireSender) -> None:
    with pytest.raises(NotWritten):
        await sender.send("POST", server.url("/late"), [], b'{"a":1}', TIMEOUT,
                          ready=lambda: False)
    asked: list[str] = []

    def ready() -> bool:
        asked.append("ready")
        return True

    answer = await sender.send("POST", server.url("/in-time"), [], b"{}", TIMEOUT, ready=ready)
    # Asked before a connection is taken, and again right before the write.
    assert (answer.status, asked) == (200, ["ready", "ready"])
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/in-time"]]


async def test_written_is_told_once_right_after_the_write_and_never_without_one(
        server: ScriptedServer, sender: WireSender) -> None:
    """``written`` is called once, after the last check said yes and in the same step of the
    loop as the write (the dispatcher logs a write that came after its send-by); a request
    not written never calls it."""
    events: list[str] = []

    def ready() -> bool:
        events.append("ready")
        return True

    def written() -> None:
        events.append("written")

    answer = await sender.send("POST", server.url("/told"), [], b"{}", TIMEOUT, ready=ready,
                               written=written)
    assert (answer.status, events) == (200, ["ready", "ready", "written"])
    events.clear()
    for answers in ([False], [True, False]):  # no before the connection, or at the write
        said = iter(answers)
        with pytest.raises(NotWritten):
            await sender.send("POST", server.url("/late"), [], b"{}", TIMEOUT,
                              ready=lambda said=said: next(said), written=written)
    assert events == []
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/told"]]


async def test_a_lease_that_runs_short_while_the_connection_is_made_is_not_written(
        server: ScriptedServer, sender: WireSender) -> None:
    """The last check comes after the connection is ready: a request whose lease ran short
    while it was dialled is not written, and the connection made for it serves the next."""
    answers = iter([True, False])
    with pytest.raises(NotWritten):
        await sender.send("POST", server.url("/late"), [], b"{}", TIMEOUT,
                          ready=lambda: next(answers))
    await sender.send("POST", server.url("/next"), [], b"{}", TIMEOUT)
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/next"]]


async def test_a_pooled_connection_kept_for_a_request_not_written_serves_the_next(
        server: ScriptedServer, sender: WireSender) -> None:
    await sender.send("POST", server.url("/first"), [], b"{}", TIMEOUT, ready=lambda: True)
    with pytest.raises(NotWritten):
        await sender.send("POST", server.url("/late"), [], b"{}", TIMEOUT, ready=lambda: False)
    await sender.send("POST", server.url("/next"), [], b"{}", TIMEOUT)
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/first",
                                                                            "/next"]]


# ------------------------------------------------------------------ TLS


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    """A self-signed certificate for 127.0.0.1 (its own CA)."""
    return Certificate(*self_signed(tmp_path_factory.mktemp("tls"), ips=("127.0.0.1",)))


async def test_an_https_callback_to_a_trusted_certificate_is_answered_and_kept_alive(
        serve: Callable[..., Awaitable[ScriptedServer]], certificate: Certificate) -> None:
    server = await serve(ssl_context=server_context(certificate.cert, certificate.key))
    sender = WireSender(OPEN, max_connections=4, ssl_context=client_context(certificate.cert))
    try:
        first = await sender.send("POST", server.url("/a", "https"), [], b"{}", TIMEOUT)
        second = await sender.send("POST", server.url("/b", "https"), [], b"{}", TIMEOUT)
    finally:
        await sender.aclose()
    assert (first.status, first.body, second.status) == (200, b"ok", 200)
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/a", "/b"]]
    assert server.requests[0].headers[0] == ("Host", f"127.0.0.1:{server.port}")


async def test_an_https_callback_to_an_untrusted_certificate_is_a_connect_error(
        serve: Callable[..., Awaitable[ScriptedServer]], certificate: Certificate) -> None:
    server = await serve(ssl_context=server_context(certificate.cert, certificate.key))
    sender = WireSender(OPEN, max_connections=4)  # the default context: system CAs only
    try:
        with pytest.raises(SendError) as caught:
            await sender.send("POST", server.url("/a", "https"), [], b"{}", TIMEOUT)
    finally:
        await sender.aclose()
    assert caught.value.kind == "connect"
    assert server.requests == []


# ------------------------------------------------------------------ closing


async def test_aclose_closes_idle_and_busy_connections(
        server: ScriptedServer) -> None:
    sender = WireSender(OPEN, max_connections=4)
    server.script(never_answering)  # the first request: kept waiting
    busy = asyncio.create_task(sender.send("POST", server.url("/busy"), [], b"{}", TIMEOUT))
    await wait_until(lambda: bool(server.requests), "the busy request to arrive")
    await sender.send("POST", server.url("/idle"), [], b"{}", TIMEOUT)  # a second connection
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/busy"],
                                                                           ["/idle"]]
    assert not any(peer.eof for peer in server.peers)  # control: both open until aclose
    await sender.aclose()
    await wait_until(lambda: all(peer.eof for peer in server.peers),
                     "the server to see both connections closed")
    with pytest.raises(SendError) as caught:
        await busy
    assert caught.value.kind == "connect"


# ------------------------------------------------------------------ found in review


async def test_an_accept_header_given_is_sent_instead_of_the_default(
        server: ScriptedServer, sender: WireSender) -> None:
    await sender.send("POST", server.url(), [("accept", "application/json")], b"{}", TIMEOUT)
    [request] = server.requests
    assert [(n, v) for n, v in request.headers if n.lower() == "accept"] == [
        ("accept", "application/json")]


@pytest.mark.parametrize("header", [("X-A", "1\r\nX-Injected: 1"), ("X-A", "a\nb"),
                                    ("X-A", "a\0b"), ("X A", "1"), ("X-A:", "1")])
async def test_a_header_that_could_split_the_request_is_refused_at_the_wire(
        server: ScriptedServer, sender: WireSender, header: tuple[str, str]) -> None:
    with pytest.raises(SendError) as refused:
        await sender.send("POST", server.url(), [header], b"{}", TIMEOUT)
    assert refused.value.kind == "error"
    await sender.send("POST", server.url(), [("X-A", "fine")], b"{}", TIMEOUT)  # control
    assert [r.headers[1] for r in server.requests] == [("X-A", "fine")]


@pytest.mark.parametrize("extra_status", [b"500 Internal Server Error", b"200 OK"])
async def test_bytes_after_a_complete_answer_keep_its_status_and_drop_the_connection(
        server: ScriptedServer, sender: WireSender, extra_status: bytes) -> None:
    """A server that writes a second response after the answer in the same packet: the
    answer read stands (the second one is never taken for it), the connection goes."""
    first = b"204 No Content" if extra_status == b"200 OK" else b"200 OK"
    server.script(replying_in_one_write(
        b"HTTP/1.1 " + first + b"\r\nContent-Length: 0\r\n\r\n"
        + b"HTTP/1.1 " + extra_status + b"\r\nRetry-After: 3600\r\nContent-Length: 0\r\n\r\n"))
    answer = await sender.send("POST", server.url("/a"), [], b"{}", TIMEOUT)
    assert (answer.status, answer.retry_after) == (int(first[:3]), None)
    await sender.send("POST", server.url("/b"), [], b"{}", TIMEOUT)
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/a"], ["/b"]]


async def test_a_101_answer_is_final(server: ScriptedServer, sender: WireSender) -> None:
    server.script(replying_in_one_write(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade"
        b"\r\n\r\n\x81\x02hi"))
    answer = await sender.send("POST", server.url("/a"), [], b"{}", TIMEOUT)
    assert answer.status == 101
    await sender.send("POST", server.url("/b"), [], b"{}", TIMEOUT)  # on a new connection
    assert [[r.target for r in peer.requests] for peer in server.peers] == [["/a"], ["/b"]]


async def test_a_non_chunked_transfer_encoding_ended_by_the_close_is_an_answer(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(replying_then_closing(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nall of it"))
    answer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert (answer.status, answer.body) == (200, b"all of it")


async def test_trailers_do_not_join_the_answers_headers(
        server: ScriptedServer, sender: WireSender) -> None:
    server.script(b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\nTrailer: Retry-After"
                  b"\r\n\r\n4\r\nbusy\r\n0\r\nRetry-After: 3600\r\n\r\n")
    answer = await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert (answer.status, answer.body, answer.retry_after) == (503, b"busy", None)


async def test_https_to_a_name_with_a_trailing_dot_verifies_the_name_without_it(
        serve: Callable[..., Awaitable[ScriptedServer]], tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, names=("hook.example",))
    server = await serve(ssl_context=server_context(cert, key))

    async def resolve(host: str, port: int) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                 ("127.0.0.1", port))]

    sender = WireSender(OPEN, max_connections=2, ssl_context=client_context(cert),
                        resolve=resolve)
    try:
        for name in ("hook.example.", "hook.example"):
            url = f"https://{name}:{server.port}/"
            assert (await sender.send("POST", url, [], b"{}", TIMEOUT)).status == 200
    finally:
        await sender.aclose()


@pytest.fixture
def black_hole() -> Iterator[tuple[str, int]]:
    """A loopback address whose connects never complete: a listener with a full accept
    queue (Linux drops the SYNs beyond it, and the client keeps retrying)."""
    listener = socket.socket()
    listener.bind(("127.0.0.3", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(address)
        fillers.append(filler)
    yield address
    for sock in (*fillers, listener):
        sock.close()


@pytest.mark.parametrize("with_next", [True, False])
async def test_a_first_address_that_never_connects_falls_back_to_the_next(
        server: ScriptedServer, black_hole: tuple[str, int], with_next: bool) -> None:
    """Happy eyeballs: the next address is tried after 0.25 s, within the attempt's timeout.
    The control (the black hole alone) shows the first address really never connects."""

    async def resolve(host: str, port: int) -> list[tuple[Any, ...]]:
        infos = [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", black_hole)]
        if with_next:
            infos.append((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                          ("127.0.0.1", server.port)))
        return infos

    sender = WireSender(OPEN, max_connections=2, resolve=resolve)
    try:
        url = f"http://hook.example:{server.port}/"
        if with_next:
            assert (await sender.send("POST", url, [], b"{}", 5.0)).status == 200
        else:
            with pytest.raises(SendError) as failed:
                await sender.send("POST", url, [], b"{}", 1.0)
            assert failed.value.kind == "timeout"
    finally:
        await sender.aclose()


async def test_a_send_after_aclose_is_refused(server: ScriptedServer) -> None:
    sender = WireSender(OPEN, max_connections=2)
    assert (await sender.send("POST", server.url(), [], b"{}", TIMEOUT)).status == 200
    await sender.aclose()
    with pytest.raises(SendError) as refused:
        await sender.send("POST", server.url(), [], b"{}", TIMEOUT)
    assert refused.value.kind == "connect"

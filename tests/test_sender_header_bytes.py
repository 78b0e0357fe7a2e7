"""All three senders (TIMEWHEEL_HTTP_CLIENT=wire, aiohttp and httpx): an answer whose kept
headers hold bytes that are not UTF-8 (RFC 9110 obs-text, as a proxy or an old server may send
in an id header) still gives headers that a result callback's body and the attempt history can
write as UTF-8. aiohttp hands such a value over with lone surrogates (surrogateescape): an
outside audit found the result body of a delivered task with ``on_success`` failing to encode,
its outcome never stored, and the task sent again at every lease, its result never posted."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.local_server import serving
from timewheel.delivery.netguard import NetworkPolicy
from timewheel.delivery.senders import kept_headers, make_sender
from timewheel.store.results import ResultCallback

ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain; x=\xe9\r\n"
          b"X-Request-Id: ab\xff\xfe\r\nConnection: close\r\n\r\nok")


async def answer_with_obs_text(reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(ANSWER)
    await writer.drain()


@pytest.mark.parametrize("kind", ["wire", "aiohttp", "httpx"])
async def test_kept_headers_with_bytes_that_are_not_utf8_can_be_written(kind: str) -> None:
    sender = make_sender(kind, NetworkPolicy(allow_private=True), max_connections=1)
    try:
        async with serving(answer_with_obs_text) as url:
            answer = await sender.send("POST", url + "/", [], b"{}", 5.0, keep_body=1024)
    finally:
        await sender.aclose()
    assert answer.status == 200
    # each value read as its bytes in latin-1, whichever sender read it
    assert answer.headers["x-request-id"] == "ab\xff\xfe"
    assert answer.headers["content-type"] == "text/plain; x=\xe9"
    result = ResultCallback(url="http://127.0.0.1:9/results", verdict="ok", attempt=1,
                            status_code=200, scheduled_at_ms=0, timeout_ms=10_000,
                            response_headers=answer.headers, response_body=answer.body)
    assert b'"x-request-id":"ab\xc3\xbf\xc3\xbe"' in result.payload("k", 1)


def test_a_surrogate_that_stands_for_no_byte_is_replaced() -> None:
    assert kept_headers([("X-Request-Id", "a\ud800b")]) == {"x-request-id": "a?b"}

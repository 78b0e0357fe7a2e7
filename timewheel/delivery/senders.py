"""How callbacks leave the process: a small Sender interface and its implementations.

Measured on this project's 2-core machine (bench/senders.py, figures in bench/README.md):
httpx's default transport costs 1.5-6 ms of CPU per request, httpx on an aiohttp transport
~0.3 ms, aiohttp alone ~0.1 ms, and the service's own client (timewheel/delivery/wire.py, the
default) about a quarter of aiohttp's. ``AiohttpSender`` (``TIMEWHEEL_HTTP_CLIENT=aiohttp``) and
``HttpxSender`` (``TIMEWHEEL_HTTP_CLIENT=httpx``, which the dispatcher's unit tests drive with
respx) stay available. All connect only to addresses the SSRF guard approved
(timewheel/delivery/netguard.py; guarded_clients.py fits it into aiohttp and httpx), follow no
redirects and ignore proxy variables."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import aiohttp
import httpx

from timewheel.delivery.grace import timeout_after_a_poll
from timewheel.delivery.guarded_clients import (
    ExchangeEnd,
    LastCheckRequest,
    exchange_end,
    guarded_connector,
    guarded_httpx_transport,
    may_write,
    not_written_cause,
)
from timewheel.delivery.netguard import (
    NOT_WRITTEN,
    BlockedAddress,
    NetworkPolicy,
    NotWritten,
    blocked_cause,
)

MAX_RESPONSE_BYTES = 64 * 1024  # read (the first ``keep_body`` bytes kept), then dropped
RESULT_BODY_BYTES = 64 * 1024  # TIMEWHEEL_RESULT_BODY_BYTES's default
# The response headers an attempt's history keeps (docs/api.md v3): these, and id headers.
KEPT_HEADERS = frozenset({"content-type", "content-length", "retry-after", "location"})
_ID_HEADER = re.compile(r"(^|-)(request|correlation|trace|message|event)?-?id$")
MAX_KEPT_HEADERS = 10
MAX_HEADER_VALUE = 200


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    retry_after: str | None
    headers: dict[str, str] = field(default_factory=dict)  # kept_headers of the response
    body: bytes = b""  # its first bytes, at most the sender's ``keep_body``
    body_truncated: bool = False


def kept_headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The response headers worth keeping in an attempt's history: content-type,
    content-length, retry-after, location and id headers (x-request-id and the like), at
    most ten, each value cut at 200 characters; names in lower case, a repeated name's first
    value. The four named ones come first whenever present (an answer may carry many id
    headers before them), then id headers in arrival order fill the rest."""
    kept: dict[str, str] = {}
    ids: dict[str, str] = {}
    for name, value in items:
        lower = name.lower()
        if lower in KEPT_HEADERS:
            kept.setdefault(lower, _as_text(value)[:MAX_HEADER_VALUE])
        elif len(ids) < MAX_KEPT_HEADERS and _ID_HEADER.search(lower):
            ids.setdefault(lower, _as_text(value)[:MAX_HEADER_VALUE])
    for name, value in ids.items():
        if len(kept) == MAX_KEPT_HEADERS:
            break
        kept[name] = value
    return kept


def _as_text(value: str) -> str:
    """A header value that can be written as UTF-8. aiohttp decodes a value that is not UTF-8
    with surrogateescape, and a lone surrogate cannot be encoded: a result callback's body (and
    so its outcome) could not be written, and the delivered task was sent again at every lease.
    Such a value is read as its bytes in latin-1, as the wire and httpx senders read it."""
    try:
        value.encode()
    except UnicodeEncodeError:
        try:
            return value.encode("utf-8", "surrogateescape").decode("latin-1")
        except UnicodeEncodeError:  # a surrogate that stands for no byte
            return value.encode("utf-8", "replace").decode()
    return value


class SendError(Exception):
    """The attempt got no HTTP answer. ``kind`` says why; "blocked" is never retried."""

    def __init__(self, kind: Literal["connect", "timeout", "blocked", "error"],
                 message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Sender(Protocol):
    keep_body: int  # response body bytes an Answer carries
    # ... and for a task with a result callback (TIMEWHEEL_RESULT_BODY_BYTES)
    result_body: int

    async def send(self, method: str, url: str, headers: list[tuple[str, str]],
                   body: bytes | None, timeout: float,
                   ready: Callable[[], bool] | None = None,
                   keep_body: int | None = None,
                   written: Callable[[], None] | None = None) -> Answer:
        """Send one request. ``ready`` is asked once more when its connection is ready, just
        before the request is written; False raises NotWritten (nothing was sent).
        ``keep_body``: the body bytes this Answer carries instead of the sender's own.
        ``written``: called right after the request is written, where the sender sees that
        moment (the default sender, timewheel/delivery/wire.py; aiohttp and httpx write
        inside their own code and never call it)."""
        ...

    async def aclose(self) -> None: ...


async def _read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes:
    """Up to ``limit`` bytes of a response body, fewer only at its end (one ``read`` may
    answer a single chunk)."""
    chunks, got = [], 0
    while got < limit:
        chunk = await content.read(limit - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class AiohttpSender:
    def __init__(self, policy: NetworkPolicy, *, max_connections: int,
                 keep_body: int = 1024, result_body: int = RESULT_BODY_BYTES) -> None:
        self.keep_body = keep_body
        self.result_body = result_body
        self._session = aiohttp.ClientSession(
            connector=guarded_connector(policy, limit=max_connections, limit_per_host=0),
            trust_env=False, auto_decompress=False, skip_auto_headers=("User-Agent",),
            cookie_jar=aiohttp.DummyCookieJar(), request_class=LastCheckRequest,
        )

    async def send(self, method: str, url: str, headers: list[tuple[str, str]],
                   body: bytes | None, timeout: float,
                   ready: Callable[[], bool] | None = None,
                   keep_body: int | None = None,
                   written: Callable[[], None] | None = None) -> Answer:
        keep = self.keep_body if keep_body is None else keep_body
        token = may_write.set(ready)  # GuardedConnector.connect asks it (guarded_clients.py)
        try:
            # The whole request under one timeout of ours, not aiohttp's (ClientTimeout() has
            # none): aiohttp's total cancels the request the moment its timer runs, before an
            # answer already in the socket is read (timeout_after_a_poll).
            async with timeout_after_a_poll(timeout), self._session.request(
                method, url, headers=headers, data=body, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(),
            ) as response:
                if keep_body is None:
                    body = await response.content.read(MAX_RESPONSE_BYTES)
                else:  # a result callback reports the body: read it up to the bound
                    body = await _read_at_most(response.content, keep + 1)
                whole = response.content.at_eof()
                if not whole:
                    response.close()  # a large answer is not worth draining
                return Answer(response.status, response.headers.get("Retry-After"),
                              kept_headers(response.headers.items()), body[:keep],
                              len(body) > keep or not whole)
        except TimeoutError as exc:
            raise SendError("timeout", f"no answer within {timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            not_written = not_written_cause(exc)
            if not_written is not None:
                raise not_written from exc
            blocked = blocked_cause(exc)
            if blocked is not None:
                raise SendError("blocked", str(blocked)) from exc
            kind: Literal["connect", "error"] = (
                "connect" if isinstance(exc, aiohttp.ClientConnectionError) else "error")
            raise SendError(kind, f"{type(exc).__name__}: {exc}") from exc
        except BlockedAddress as exc:
            raise SendError("blocked", str(exc)) from exc
        finally:
            may_write.reset(token)

    async def aclose(self) -> None:
        await self._session.close()


class HttpxSender:
    def __init__(self, policy: NetworkPolicy, *, max_connections: int,
                 keep_body: int = 1024, result_body: int = RESULT_BODY_BYTES) -> None:
        self.keep_body = keep_body
        self.result_body = result_body
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        self._client = httpx.AsyncClient(
            transport=guarded_httpx_transport(policy, limits=limits),
            follow_redirects=False, trust_env=False,
        )

    async def send(self, method: str, url: str, headers: list[tuple[str, str]],
                   body: bytes | None, timeout: float,
                   ready: Callable[[], bool] | None = None,
                   keep_body: int | None = None,
                   written: Callable[[], None] | None = None) -> Answer:
        keep = self.keep_body if keep_body is None else keep_body
        limit = max(MAX_RESPONSE_BYTES, keep + 1)
        # httpx has no public hook between getting a connection and writing: asked here.
        if ready is not None and not ready():
            raise NotWritten(NOT_WRITTEN)
        answer: Answer | None = None
        # The whole exchange is bounded: in the connection's reads and writes (ExchangeEnd),
        # and until its first write (waiting for a connection) by a timer that then lets go.
        end = ExchangeEnd(timeout)
        bounding = exchange_end.set(end)
        try:
            async with timeout_after_a_poll(timeout, unless=end.written), self._client.stream(
                    method, url, headers=headers, content=body, timeout=timeout) as response:
                chunks, read, cut = [], 0, False
                async for chunk in response.aiter_raw():
                    if read < keep:
                        chunks.append(chunk)
                    read += len(chunk)
                    if read >= limit:
                        cut = True
                        break
                body = b"".join(chunks)
                answer = Answer(response.status_code, response.headers.get("Retry-After"),
                                kept_headers(response.headers.multi_items()),
                                body[:keep], cut or len(body) > keep)
            return answer
        except (httpx.TimeoutException, TimeoutError) as exc:
            if answer is not None:
                return answer
            raise SendError("timeout", f"no answer within {timeout:g}s") from exc
        except (httpx.HTTPError, BlockedAddress) as exc:
            blocked = blocked_cause(exc)
            if blocked is not None:
                raise SendError("blocked", str(blocked)) from exc
            kind: Literal["connect", "error"] = (
                "connect" if isinstance(exc, httpx.TransportError) else "error")
            raise SendError(kind, f"{type(exc).__name__}: {exc}") from exc
        finally:
            exchange_end.reset(bounding)

    async def aclose(self) -> None:
        await self._client.aclose()


def make_sender(kind: str, policy: NetworkPolicy, *, max_connections: int,
                keep_body: int = 1024, result_body: int = RESULT_BODY_BYTES) -> Sender:
    if kind == "httpx":
        return HttpxSender(policy, max_connections=max_connections, keep_body=keep_body,
                           result_body=result_body)
    if kind == "wire":
        from timewheel.delivery.wire import WireSender  # wire.py imports this module

        return WireSender(policy, max_connections=max_connections, keep_body=keep_body,
                          result_body=result_body)
    return AiohttpSender(policy, max_connections=max_connections, keep_body=keep_body,
                         result_body=result_body)

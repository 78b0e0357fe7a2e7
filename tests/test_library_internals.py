"""The private or version-bound library behaviour timewheel relies on, tested directly, so that
an upgrade of Python, redis-py, aiohttp, httpx or httpcore that changes it fails here, loudly,
instead of slowing down or breaking a path in production. Each mechanism, what it pays for and
why it stays: bench/README.md, "What each mechanism pays for"; the pins: pyproject.toml.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import json.encoder
import math
import socket
import struct
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpcore
import httpx
import pytest
import redis.exceptions
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.http_writer import StreamWriter
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from tests.support.ports import refused_port
from tests.support.redis_server import RedisServer, free_port
from timewheel.delivery import guarded_clients
from timewheel.delivery.guarded_clients import (
    GuardedConnector,
    GuardedNetworkBackend,
    guarded_connector,
    guarded_httpx_transport,
)
from timewheel.delivery.netguard import BlockedAddress, NetworkPolicy, blocked_cause
from timewheel.operations import prepare as record  # the fingerprint and body encoders
from timewheel.store.connection import (
    AbortiveClose,
    HiredisPacking,
    make_redis,
    wheel_connection,
)

# ------------------------------------------------------------------ json.encoder.c_make_encoder
# operations/prepare.py builds json.dumps's C encoder once (_json_encoder) instead of on every call.

JSON_VALUES: list[Any] = [
    None, True, False, 0, -1, 2**70, -(2**63), 1.0, -0.0, 0.1, 1e300, 5e-324, 1e16, "",
    "plain", "ünï\u2028cödé 😀", "quote\" back\\slash ctl\n\t\x00\x1f", "\ud800 lone surrogate",
    [], {}, [1, "a", None, [True, {"z": 1, "a": 2}]],
    {"b": 1, "a": {"y": [1.5, 2], "x": None}, "é": "ü", "": "", "B": [], "aa": {}},
]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=20)


def _dumps_canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _dumps_compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def test_cpython_still_has_the_c_encoder_factory() -> None:
    # Without it prepare.py falls back to the pure-Python encoder: right, but the batch bench
    # loses the gain the fast path was kept for.
    assert callable(getattr(json.encoder, "c_make_encoder", None))


@pytest.mark.parametrize("value", JSON_VALUES, ids=lambda v: type(v).__name__)
def test_prebuilt_encoders_write_what_json_dumps_writes(value: Any) -> None:
    assert record._canonical(value) == _dumps_canonical(value)
    assert record._compact(value) == _dumps_compact(value)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_prebuilt_encoders_match_json_dumps_on_generated_values(value: Any) -> None:
    assert record._canonical(value) == _dumps_canonical(value)
    assert record._compact(value) == _dumps_compact(value)


@pytest.mark.parametrize("value", [math.nan, math.inf, [-math.inf], {"a": math.nan}])
def test_prebuilt_encoders_treat_non_finite_floats_as_json_dumps_does(value: Any) -> None:
    assert record._canonical(value) == _dumps_canonical(value)  # NaN, Infinity written out
    with pytest.raises(ValueError) as ours:
        record._compact(value)
    with pytest.raises(ValueError) as theirs:
        _dumps_compact(value)
    assert str(ours.value) == str(theirs.value)


# ------------------------------------------------------------------ redis-py's read_response
# store/batch.py reads a round's replies with read_response(timeout=math.inf) under one shared
# deadline, and names the server in its timeout error with Connection._host_error().


@pytest.fixture
async def slow_reader(redis_server: RedisServer) -> Iterator[Any]:
    """A pooled connection whose socket timeout (0.2 s) is shorter than the reply it will wait
    for: BLPOP on an empty list answers nil after 1 s."""
    client = Redis.from_url(redis_server.url, socket_timeout=0.2)
    conn = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
    yield conn
    await client.connection_pool.release(conn)
    await client.aclose()


async def test_read_response_with_infinite_timeout_outlives_the_socket_timeout(
        slow_reader: Any) -> None:
    await slow_reader.send_command("BLPOP", "internals:never-pushed", 1)
    assert await slow_reader.read_response(timeout=math.inf) is None  # BLPOP's nil, in time


async def test_read_response_without_a_timeout_gives_up_at_the_socket_timeout(
        slow_reader: Any, redis_server: RedisServer) -> None:
    """The control of the test above: the same wait does fail with the socket timeout, with
    the message store/batch.py imitates (``Timeout reading from <_host_error()>``)."""
    assert slow_reader._host_error() == f"{slow_reader.host}:{redis_server.port}"
    await slow_reader.send_command("BLPOP", "internals:never-pushed", 1)
    with pytest.raises(redis.exceptions.TimeoutError) as raised:
        await slow_reader.read_response()
    assert str(raised.value) == f"Timeout reading from {slow_reader._host_error()}"


def test_read_response_still_takes_a_timeout_argument() -> None:
    from redis.asyncio.connection import Connection

    parameters = inspect.signature(Connection.read_response).parameters
    assert parameters["timeout"].default is None
    assert callable(Connection._host_error)


# ------------------------------------------------------------------ hiredis packing
# store/connection.py packs every command of the asyncio clients with redis-py's
# HiredisRespSerializer (its sync client's packer) instead of the asyncio connection's Python one.

PACKED_ARGS: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 1, "{tw:3}:", "key", b"\x00\xffbin", 7, -3, 2**70, 0.1, 2.5, 1e300),
    ("CONFIG GET", "maxmemory"),                     # a multi-word command name is split
    (b"CLIENT SETNAME", b"x"),
    ("SET", "ünï cödé", memoryview(b"view"), bytearray(b"array")),
    ("SET", "big", b"v" * 100_000),                  # past the Python packer's buffer cutoff
    ("RPUSH", "k", *[str(i) for i in range(1_000)]),
]


@pytest.mark.parametrize("args", PACKED_ARGS, ids=lambda args: str(args[0]))
def test_hiredis_packing_writes_the_bytes_redis_py_writes(args: tuple[Any, ...]) -> None:
    from redis.asyncio.connection import Connection

    python = b"".join(Connection().pack_command(*args))
    packing = wheel_connection(Connection)()
    assert b"".join(packing.pack_command(*args)) == python


@pytest.mark.parametrize("value", [True, None, object()])
def test_hiredis_packing_refuses_what_redis_py_refuses(value: Any) -> None:
    from redis.asyncio.connection import Connection

    with pytest.raises(redis.exceptions.DataError):
        Connection().pack_command("SET", "k", value)  # the control: redis-py's own refusal
    with pytest.raises(redis.exceptions.DataError):
        wheel_connection(Connection)().pack_command("SET", "k", value)


async def test_the_service_client_packs_with_hiredis_resets_on_close_and_round_trips(
        redis_server: RedisServer) -> None:
    client = make_redis(redis_server.url)
    try:
        conn = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        assert isinstance(conn, HiredisPacking)
        # AbortiveClose overrides redis-py's Connection._connect and reads its _writer
        sock = conn._writer.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8) == struct.pack("ii", 1, 0)
        await client.connection_pool.release(conn)
        await client.set("internals:packed", "ü" * 10_000)
        assert await client.get("internals:packed") == "ü".encode() * 10_000
        pipe = client.pipeline(transaction=False)
        pipe.incr("internals:n").incr("internals:n")
        assert await pipe.execute() == [1, 2]
    finally:
        await client.aclose()


def test_the_wheel_connection_keeps_the_url_connection_class() -> None:
    from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection

    for url, base in [("unix:///tmp/internals.sock", UnixDomainSocketConnection),
                      ("rediss://127.0.0.1:1", SSLConnection)]:
        cls = make_redis(url).connection_pool.connection_class
        assert issubclass(cls, HiredisPacking) and issubclass(cls, AbortiveClose)
        assert issubclass(cls, base)


# ------------------------------------------------------------------ aiohttp's _resolve_host
# guarded_clients.GuardedConnector overrides TCPConnector._resolve_host to refuse IP literals (any
# spelling) before aiohttp handles them itself.


def test_tcp_connector_resolve_host_has_the_signature_the_override_expects() -> None:
    base = inspect.signature(aiohttp.TCPConnector._resolve_host)
    assert inspect.iscoroutinefunction(aiohttp.TCPConnector._resolve_host)
    assert list(base.parameters) == ["self", "host", "port", "traces"]
    assert base.parameters["traces"].default is None
    assert inspect.signature(GuardedConnector._resolve_host).parameters.keys() == (
        base.parameters.keys())


@pytest.fixture
def dials() -> list[str]:
    return []


def _recording_factory(dials: list[str]) -> Any:
    def factory(addr_info: AddrInfoType) -> socket.socket:
        host = str(addr_info[4][0])
        assert host in ("127.0.0.1", "::1"), host  # loopback only, whatever happens
        dials.append(host)
        return socket.socket(addr_info[0], addr_info[1], addr_info[2])
    return factory


async def _aiohttp_get(policy: NetworkPolicy, url: str, dials: list[str]) -> BaseException:
    connector = guarded_connector(policy, socket_factory=_recording_factory(dials))
    async with aiohttp.ClientSession(connector=connector) as session:
        with pytest.raises(aiohttp.ClientError) as raised:
            await session.get(url)
    return raised.value


async def test_aiohttp_calls_the_override_for_an_ip_literal(dials: list[str]) -> None:
    # 127.1 is a literal aiohttp itself refuses as an invalid URL; only the override, called
    # before that, turns it into a refusal by the guard, without any socket made.
    error = await _aiohttp_get(NetworkPolicy(), f"http://127.1:{free_port()}/", dials)
    assert isinstance(error, aiohttp.ClientConnectorError), repr(error)
    assert isinstance(blocked_cause(error), BlockedAddress)
    assert dials == []


async def test_aiohttp_dials_through_the_socket_factory(dials: list[str]) -> None:
    """The control: allowed, the same kind of request reaches the socket factory (and finds
    nothing listening: the port is held by the test, so no other worker's server answers)."""
    with refused_port() as port:
        error = await _aiohttp_get(NetworkPolicy(allow_private=True),
                                   f"http://127.0.0.1:{port}/", dials)
    assert blocked_cause(error) is None
    assert dials == ["127.0.0.1"]


class _ClosingResolver(AbstractResolver):
    closed = 0

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        raise AssertionError("not resolving here")

    async def close(self) -> None:
        type(self).closed += 1


async def test_tcp_connector_closes_the_resolver_it_owns(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # GuardedConnector passes aiohttp its GuardedResolver and sets TCPConnector's private
    # _resolver_owner so that closing the connector closes the default resolver made for it.
    monkeypatch.setattr(guarded_clients, "DefaultResolver", _ClosingResolver)
    monkeypatch.setattr(_ClosingResolver, "closed", 0)
    connector = guarded_connector(NetworkPolicy())
    assert connector._resolver_owner is True
    await connector.close()
    assert _ClosingResolver.closed == 1


async def test_tcp_connector_leaves_a_given_resolver_open(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The control: a resolver the caller gave is the caller's to close."""
    monkeypatch.setattr(_ClosingResolver, "closed", 0)
    connector = guarded_connector(NetworkPolicy(), resolver=_ClosingResolver())
    await connector.close()
    assert _ClosingResolver.closed == 0


# ------------------------------------------------------------------ httpx / httpcore's pool
# guarded_clients.guarded_httpx_transport swaps the network backend of the transport's httpcore
# pool.


def test_httpx_transport_still_has_the_pool_and_backend_the_guard_swaps() -> None:
    transport = httpx.AsyncHTTPTransport()
    assert type(transport._pool) is httpcore.AsyncConnectionPool
    assert isinstance(transport._pool._network_backend, httpcore.AsyncNetworkBackend)
    guarded = guarded_httpx_transport(NetworkPolicy())
    assert isinstance(guarded._pool._network_backend, GuardedNetworkBackend)


class _Recording(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self.dialled: list[str] = []

    async def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any
                          ) -> httpcore.AsyncNetworkStream:
        self.dialled.append(host)
        raise httpcore.ConnectError("recorded, not dialled")

    async def sleep(self, seconds: float) -> None:
        pass


async def test_httpcore_pool_dials_through_the_swapped_backend() -> None:
    transport = guarded_httpx_transport(NetworkPolicy(allow_private=True))
    guard = transport._pool._network_backend
    assert isinstance(guard, GuardedNetworkBackend)
    inner = guard._backend = _Recording()
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{free_port()}/")
    assert inner.dialled == ["127.0.0.1"]  # resolved and checked by the guard, then dialled


# ------------------------------------------------------------------ aiohttp's body writer hook
# guarded_clients.LastCheckRequest overrides ClientRequest.write_bytes and sets the StreamWriter's
# private ``_on_chunk_sent``, which aiohttp awaits before each body write (and sets itself
# only for trace signals). tests/test_sender_last_check.py checks the behaviour end to end;
# this names the exact piece an upgrade could move.


def test_client_request_write_bytes_has_the_signature_the_override_expects() -> None:
    base = inspect.signature(aiohttp.ClientRequest.write_bytes)
    assert list(base.parameters) == ["self", "writer", "conn", "content_length"]
    assert base.parameters["content_length"].default is None
    assert inspect.signature(guarded_clients.LastCheckRequest.write_bytes).parameters.keys() == (
        base.parameters.keys())


async def test_stream_writer_awaits_on_chunk_sent_before_it_writes() -> None:
    class Transport:
        def __init__(self) -> None:
            self.written: list[bytes] = []

        def is_closing(self) -> bool:
            return False

        def write(self, data: bytes) -> None:
            self.written.append(bytes(data))

        def writelines(self, data: list[bytes]) -> None:
            self.written.append(b"".join(data))

    class Protocol:
        def __init__(self) -> None:
            self.transport = Transport()
            self._paused = False

        async def _drain_helper(self) -> None:
            return None

    protocol = Protocol()
    writer = StreamWriter(protocol, asyncio.get_running_loop())  # type: ignore[arg-type]
    assert writer._on_chunk_sent is None  # none unless aiohttp has traces
    seen: list[list[bytes]] = []

    async def hook(chunk: bytes) -> None:
        seen.append(list(protocol.transport.written))  # what was written before the hook

    writer._on_chunk_sent = hook
    await writer.write(b"body")
    assert seen == [[]]  # asked before anything went out
    assert b"".join(protocol.transport.written).endswith(b"body")  # control: then written


def test_the_cluster_client_still_flags_a_pending_refresh_in_initialize() -> None:
    """WheelCluster.initialize (store/connection.py) returns at once unless redis-py's own
    ``_initialize`` flag says a slot-map refresh is due, as RedisCluster.initialize does, and
    shields only that refresh from its caller's cancellation."""
    import inspect

    from redis.asyncio.cluster import RedisCluster

    client = RedisCluster(host="127.0.0.1", port=1)
    assert client._initialize is True  # a fresh client must refresh first
    assert "if self._initialize:" in inspect.getsource(RedisCluster.initialize)

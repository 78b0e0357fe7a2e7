"""Builds the redis-py asyncio client: a single Redis or a Redis Cluster, from a URL.

On a cluster the client is ``WheelCluster``, redis-py's ``RedisCluster`` with three changes the
wheel depends on (docs/design.md, "Durability" and "Redis Cluster"):

- **Migration guard.** Every Lua script of the wheel takes one key, a bucket's (or flow's) key
  prefix ``{tw:3}:``, and derives the keys it touches from it. That prefix is never itself a
  key, so while its slot migrates the source node answers ASK to every call, and the importing
  node would run the script (the client sends ASKING) over the half of the bucket that has
  moved so far: a create would write a second record beside the one still on the source, a
  cancel would answer 404. Each script call therefore carries a second key of the same slot
  that never exists (``{tw:3}:~``). A call with several keys, some missing, is refused by the
  importing node with TRYAGAIN instead: no script runs on a bucket while its keys are split
  between two nodes. The client retries, and after ``CLUSTER SETSLOT ... NODE`` the MOVED
  reply sends it to the new owner, which holds every key of the bucket.
- **Bounded, not failing, concurrency.** redis-py's cluster nodes raise MaxConnectionsError when
  their pool is exhausted (the single-Redis client uses a blocking pool instead); commands
  wait for one of ``MAX_CONNECTIONS`` slots.
- **Closing what redis-py drops.** ``RedisCluster.aclose`` does nothing while a re-initialisation
  is pending (after any node error), and a refresh of the slot map drops nodes that left the
  cluster without closing the connections in use; both leave sockets open. The owner's
  ``aclose`` here closes every node the client ever used. (redis-py also calls ``aclose``
  itself, to reset after an error; that call keeps redis-py's meaning.)

Both clients pack commands with hiredis (``HiredisPacking``): redis-py's asyncio connections
pack every argument in Python (its sync client uses hiredis when it is installed, the asyncio
one cannot be told to), ~4.8 µs per complete outcome of nine arguments against ~0.6 in C
(bench/README.md, "Packing, encoding and script text"). And both reset a connection they
close (``AbortiveClose``), so that a command given up on is not delivered after a partition.

The single-Redis client's pool (``WheelPool``) is redis-py's blocking pool with a fast path
while no caller waits for a connection: redis-py's takes an ``asyncio.Condition`` and a timeout
and records observability events on every get and release: ~30 of the ~85 µs of CPU a script
call cost the caller here (bench/README.md, "The Redis pool's fast path").

Two redis-py defaults are changed for the same reasons: ``reinitialize_steps=0`` (a MOVED
patches the slot map; redis-py's default closes every connection of the client on every fifth
MOVED, under the feet of concurrent commands, and a migration produces MOVED in bursts), and a
``RuntimeError`` of a transport closed under a command (uvloop) and an ``AttributeError`` of a
connection redis-py tore down under it (``'NoneType' object has no attribute 'writelines'``,
a concurrent command's reset, seen with the event loop held during connects) are a
ConnectionError, so that callers see StoreUnavailable (a 503) rather than a crash (a 500).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import re
import socket
import struct
from collections import Counter
from typing import Any

import hiredis
from redis import DriverInfo
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError, RedisError, TimeoutError

from timewheel import __version__
from timewheel.store.keys import Keyspace

# Short timeouts: a dead Redis must turn into a quick 503, not a hung request. Retries are safe
# for every script: claim is idempotent per token, start per token, and schedule, complete,
# release, cancel and replay answer the same (or "stale") when run twice.
SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0  # a cluster node's, retried (see make_redis)
MAX_CONNECTIONS = 64  # per process (per node on a cluster); calls are batched per bucket
# A cluster node's pool is larger than the commands allowed at once: pipelines (batched
# creates, durable writes) take their connection from the node directly, beside the commands.
_NODE_CONNECTIONS = 2 * MAX_CONNECTIONS
GUARD_SUFFIX = "~"  # appended to a script's prefix key: a key of the same slot that never exists
_PREFIX_KEY = re.compile(rb"^\{[^{}]+\}:$")
_SCRIPT_COMMANDS = (b"EVALSHA", b"EVAL", "EVALSHA", "EVAL")
# Set while redis-py runs a command or pipeline of ours: an ``aclose`` then is redis-py's reset.
_in_call = contextvars.ContextVar("timewheel_in_redis_call", default=False)


def _retry(*errors: type[RedisError]) -> Retry:
    return Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=2, supported_errors=errors)


def _as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def guarded(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A script call whose only key is a prefix ``{tag}:`` with the migration guard key added
    (see the module docstring); any other command unchanged."""
    if len(args) < 4 or args[0] not in _SCRIPT_COMMANDS or args[2] not in (1, "1", b"1"):
        return args
    key = args[3]
    if not isinstance(key, str | bytes) or not _PREFIX_KEY.match(_as_bytes(key)):
        return args
    guard = f"{key}{GUARD_SUFFIX}" if isinstance(key, str) else key + GUARD_SUFFIX.encode()
    return (args[0], args[1], 2, key, guard, *args[4:])


_SERIALIZER = HiredisRespSerializer()  # stateless: redis-py's sync client keeps one a connection


class HiredisPacking:
    """Mixed into a redis-py asyncio connection class: commands (and so pipelines, which pack
    each command) are packed by hiredis's C ``pack_command``, through the serializer redis-py's
    sync client uses, which splits a multi-word command name and refuses what redis-py's
    encoder refuses (``DataError``). Same bytes: tests/test_library_internals.py."""

    def pack_command(self, *args: Any) -> list[bytes]:
        # The serializer first copies every argument through a generator (bytearray and
        # memoryview to bytes): for a complete call of 20 outcomes (189 arguments), 73 us
        # against 36 us for hiredis alone. So hiredis first; what it refuses (a bytearray, or
        # a value redis-py refuses too) goes the serializer's way, to the same bytes or error.
        name = args[0]
        if (" " not in name) if isinstance(name, str) else (b" " not in name):
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        packed: list[bytes] = _SERIALIZER.pack(*args)
        return packed


# SO_LINGER on, with a zero timeout: close() resets the connection.
_ABORT_ON_CLOSE = struct.pack("ii", 1, 0)


class AbortiveClose:
    """Mixed into a redis-py asyncio connection class: a connection redis-py closes (after a
    timeout, an error, a cancelled call, or at shutdown) is aborted, not closed normally, so
    that a command not delivered yet is dropped instead of sent later.

    A normal close delivers what is still buffered first: the transport's own buffer (a write
    bigger than the kernel's send buffer: a batch of 1,000 creates), a TLS shutdown (up to 30
    s), then the kernel retransmits, for a minute or two. Across a network partition Redis
    would run the command once the partition heals, after the API had answered 503 and after
    the client's next write of the same task through another process (a PUT answered 503 then
    replaced the later PUT: tests/e2e/test_partition.py). So the socket has SO_LINGER 0 (its
    close is a reset and the kernel drops its unsent data) and the transport is aborted (its
    buffer dropped, no TLS shutdown). A command Redis has received runs either way."""

    async def _connect(self) -> None:
        await super()._connect()  # type: ignore[misc]
        sock = self._writer.transport.get_extra_info("socket")  # type: ignore[attr-defined]
        if sock is not None:
            with contextlib.suppress(OSError):  # a socket kind without SO_LINGER: as before
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT_ON_CLOSE)

    async def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._abort()
        await super().disconnect(*args, **kwargs)  # type: ignore[misc]

    def _close(self) -> None:
        self._abort()
        super()._close()  # type: ignore[misc]

    def _abort(self) -> None:
        writer = self._writer  # type: ignore[attr-defined]
        if writer is not None:
            writer.transport.abort()


_wheel_classes: dict[type, type] = {}


def wheel_connection(connection_class: type[AbstractConnection]
                     ) -> type[AbstractConnection]:
    """``connection_class`` (TCP, Unix socket or TLS) with ``HiredisPacking`` and
    ``AbortiveClose`` mixed in."""
    if issubclass(connection_class, HiredisPacking):
        return connection_class
    wheel = _wheel_classes.get(connection_class)
    if wheel is None:
        wheel = type(f"Wheel{connection_class.__name__}",
                     (HiredisPacking, AbortiveClose, connection_class), {})
        _wheel_classes[connection_class] = wheel
    return wheel


class WheelPool(BlockingConnectionPool):
    """redis-py's blocking pool, with a fast path for the usual case: an idle connection and no
    caller queued for one. Then a get pops it and a release pushes it back, both without the
    pool's Condition, timeout and events: the observability records (for redis-py's
    OpenTelemetry integration) and the after-release event (for streaming credential
    providers' re-authentication), neither of which the wheel configures. While anyone waits
    (the pool exhausted), in maintenance mode (Redis Enterprise notifications), or for a
    connection that must reconnect, redis-py's own path runs, so queued callers are served in
    their order and woken as before. A fast get still runs ``ensure_connection``, as redis-py's
    own get does."""

    def _uncontended(self) -> bool:
        """Nobody is queued for a connection, and the pool is not in maintenance mode."""
        return not self._condition._waiters and not self._in_maintenance

    async def get_connection(self, *args: Any, **kwargs: Any) -> AbstractConnection:
        idle = self._available_connections
        if idle and self._uncontended():
            connection = idle.pop()
            self._in_use_connections.add(connection)
            try:
                await self.ensure_connection(connection)
            except BaseException:
                await self.release(connection)
                raise
            return connection
        return await super().get_connection()  # type: ignore[no-any-return,no-untyped-call]

    async def release(self, connection: AbstractConnection) -> None:
        if not self._uncontended() or connection.should_reconnect():  # type: ignore[no-untyped-call]
            await super().release(connection)
            return
        self._in_use_connections.remove(connection)
        self._available_connections.append(connection)


# A connection redis-py's cluster client tore down (its reset after another command's error)
# while this command used it: its reader or writer is None then.
_TORN_DOWN = "'NoneType' object has no attribute"


def _closed_under(exc: RuntimeError | AttributeError) -> ConnectionError | None:
    """The ConnectionError that ``exc`` is when the command's connection closed under it;
    None for anything else (a bug, raised as it is)."""
    if isinstance(exc, AttributeError) and _TORN_DOWN not in str(exc):
        return None
    return ConnectionError(f"connection closed during the command: "
                           f"{type(exc).__name__}: {exc}")


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A shielded refresh's outcome, read when no caller waits for it any more (else
    asyncio logs "exception was never retrieved"); the callers that wait see it themselves."""
    if not task.cancelled():
        task.exception()


class WheelPipeline(ClusterPipeline):
    """A cluster pipeline whose script calls carry the migration guard key."""

    def execute_command(self, *args: Any, **kwargs: Any) -> ClusterPipeline:
        return super().execute_command(*guarded(args), **kwargs)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True
                      ) -> list[Any]:
        token = _in_call.set(True)
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except (RuntimeError, AttributeError) as exc:
            closed = _closed_under(exc)
            if closed is None:
                raise
            raise closed from exc
        finally:
            _in_call.reset(token)


class WheelCluster(RedisCluster):
    """redis-py's cluster client with the wheel's migration guard, bounded concurrency and a
    complete ``aclose`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Nodes found later are built from these keyword arguments (redis-py's NodesManager
        # shares the dict); the startup nodes were built already.
        wheel = wheel_connection(self.connection_kwargs["connection_class"])
        self.connection_kwargs["connection_class"] = wheel
        for node in self.nodes_manager.startup_nodes.values():
            node.connection_class = wheel  # type: ignore[assignment]  # a Connection subclass
        self._commands = asyncio.Semaphore(MAX_CONNECTIONS)
        self._retired: dict[int, ClusterNode] = {}  # nodes dropped from the slot map
        self._refreshing: asyncio.Future[RedisCluster] | None = None  # see initialize

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        token = _in_call.set(True)
        try:
            async with self._commands:
                return await super().execute_command(*guarded(args), **kwargs)
        except (RuntimeError, AttributeError) as exc:
            closed = _closed_under(exc)
            if closed is None:
                raise
            raise closed from exc
        finally:
            _in_call.reset(token)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None
                 ) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # refused by redis-py
        return WheelPipeline(self, transaction)  # type: ignore[abstract]

    def _known_nodes(self) -> list[ClusterNode]:
        manager = self.nodes_manager
        return [*manager.nodes_cache.values(), *manager.startup_nodes.values()]

    async def initialize(self, *args: Any, **kwargs: Any) -> RedisCluster:
        """Refresh the slot map; nodes it drops are kept to be closed (they may still have a
        command in flight).

        Shielded: the command that runs a refresh may be cancelled (an API request at its
        deadline, api/deadline.py; a scrape's bounded read), and redis-py answers any
        exception inside its refresh, cancellation included, by closing every node's
        connections, those of other commands in flight on healthy masters too. The refresh
        goes on without the caller instead."""
        if not self._initialize:
            return self
        # One refresh at a time, which every caller meanwhile waits for: each cancelled caller
        # left one behind, queued on redis-py's lock, and a silent master's took its socket
        # timeout each, one after the other (a second review).
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh(*args, **kwargs))
            self._refreshing.add_done_callback(_retrieved)
        refresh = self._refreshing
        try:
            return await asyncio.shield(refresh)
        except asyncio.CancelledError:
            # The refresh was ended by the owner's close (aclose), not this caller cancelled:
            # a Redis error to it, not a cancellation it never asked for.
            task = asyncio.current_task()
            if refresh.cancelled() and task is not None and not task.cancelling():
                raise ConnectionError("the client was closed during a slot-map refresh") from None
            raise

    async def _refresh(self, *args: Any, **kwargs: Any) -> RedisCluster:
        before = {id(node): node for node in self._known_nodes()}
        try:
            return await super().initialize(*args, **kwargs)
        finally:
            after = {id(node) for node in self._known_nodes()}
            self._retired.update({k: n for k, n in before.items() if k not in after})

    async def aclose(self) -> None:
        """The owner's close: the connections of every node this client used, which redis-py's
        ``aclose`` skips while a re-initialisation is pending and never sees once dropped.
        Called by redis-py during a command (its reset after an error), it is redis-py's.
        A slot-map refresh under way is ended first: shielded from its callers, it would
        otherwise finish after the close and leave the client open again."""
        refresh = self._refreshing
        if refresh is not None and not refresh.done() and not _in_call.get():
            refresh.cancel()  # redis-py closes what the refresh opened (its except clause)
            await asyncio.gather(refresh, return_exceptions=True)
        await super().aclose()
        if _in_call.get():
            return
        nodes = {id(node): node for node in self._known_nodes()}
        nodes.update(self._retired)
        self._retired = {}
        await asyncio.gather(*(node.disconnect() for node in nodes.values()),
                             return_exceptions=True)


# What each connection names itself with (CLIENT SETINFO: "redis-py(timewheel_v0.1.0)" in
# CLIENT LIST). One for all: left to redis-py, a pool's every new connection reads redis-py's
# version from its installed metadata, ~1 ms of the event loop each (the cluster client
# already shares one).
DRIVER_INFO = DriverInfo().add_upstream_driver("timewheel", __version__)


def make_redis(url: str, *, cluster: bool = False) -> Redis | RedisCluster:
    if cluster:
        return WheelCluster.from_url(
            url, max_connections=_NODE_CONNECTIONS, socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT, reinitialize_steps=0,
            retry=_retry(ConnectionError, TimeoutError), decode_responses=False,
            driver_info=DRIVER_INFO)
    # A blocking pool: under a burst, callers queue for a connection instead of failing with
    # "Too many connections" (the default pool's behaviour at its 100-connection cap).
    # A refused or reset connection (Redis restarted) is tried again on a new one; a timeout is
    # not: a Redis silent for SOCKET_TIMEOUT (stopped, cut off) is answered 503 then, not after
    # three timeouts. (A cluster's client retries timeouts by its own rule: a silent master's
    # replica may have been promoted meanwhile.) A connect gets the same 5 s, not retried 2 s:
    # the timeout runs on the event loop's clock, and a burst on a fresh pool can hold the loop
    # past 2 s while Redis has long accepted the connection.
    pool = WheelPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=SOCKET_TIMEOUT,
        socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT,
        retry=_retry(ConnectionError), retry_on_error=[ConnectionError],
        decode_responses=False, health_check_interval=30, driver_info=DRIVER_INFO)
    pool.connection_class = wheel_connection(pool.connection_class)
    return Redis.from_pool(pool)


async def bucket_spread(redis: RedisCluster, keys: Keyspace) -> dict[str, int]:
    """Buckets per master ("host:port" -> count; every master listed, 0 for one that serves
    none): each bucket is one hash slot, so this is how a minute's due load is shared."""
    await redis.initialize()
    counts: Counter[str] = Counter()
    for bucket in range(keys.buckets):
        node = redis.get_node_from_key(keys.prefix(bucket))
        counts[node.name if node is not None else "none"] += 1
    return {node.name: counts[node.name]
            for node in sorted(redis.get_primaries(), key=lambda n: n.name)}

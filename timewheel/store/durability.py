"""Acknowledged writes: a change a client is told about WAITs until enough replicas have it.

With ``TIMEWHEEL_REDIS_WAIT_REPLICAS=N > 0`` every script call whose result the API reports
(``scripts.ACKNOWLEDGED``: create, replace, cancel, replay, schedule and flow changes) is sent
as one non-transactional pipeline on one connection of the node serving its slot:

    EVALSHA <script> ...        the change (any number of them, batched creates)
    SET <slot tag>~ack "" PX 10000
    WAIT N <timeout ms>

WAIT counts the writes *of the connection it is sent on* (up to that connection's last write),
so it must follow the change on the same connection, and redis-py's ``register_script`` cannot
be used: it sends EVALSHA on whichever pooled connection is free. The SET is there because a
script that changes nothing (a repeated create answering "exists", a cancel of a finished
task) moves no replication offset: WAIT would then cover only the connection's older writes,
and a retried request could be told "200, it exists" about a record that the master has and
no replica got yet. After the SET, the connection's offset is the master's current one.

If fewer than N replicas confirm within the timeout, ``NotReplicated`` is raised (the API's
503): the change is on the master and may or may not survive its failover. Redis cannot undo
it; every acknowledged script is safe to repeat, so the client may retry.

With N = 0 nothing here runs: the scripts are redis-py's, unchanged (``scripts.Scripts``).

On a Redis Cluster the calls are routed here, not by redis-py's pipeline (which re-sends a
redirected command on another connection, where the WAIT would not cover it): NOSCRIPT loads
the script on that node, MOVED updates the slot map, ASK sends ASKING first on the same
connection, TRYAGAIN (a slot mid-migration, see ``connection.py``) waits a little; each time
only the calls that did not run are sent again, with their own WAIT. The marker SET is never
sent with ASKING: a script runs after ASK only on a node that already serves the slot (the
guard key keeps scripts off an importing node), so the marker is needed only there, and one
written on an importing node would collide with the source's when the reshard moves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    MovedError,
    NoScriptError,
    RedisError,
    TimeoutError,
    TryAgainError,
)

from timewheel.errors import NotReplicated, StoreUnavailable

MARKER_SUFFIX = "~ack"
MARKER_TTL_MS = 10_000
ROUNDS = 16  # as redis-py's RedisClusterRequestTTL: redirects and retries per call
RETRIES = 2  # after a connection or cluster-down error, as connection.py's Retry
TRY_AGAIN_SECONDS = 0.05  # a slot mid-migration: how long to wait before the next round
_RETRY_ON = (ConnectionError, TimeoutError, ClusterDownError)


@dataclass(frozen=True, slots=True)
class Durability:
    """How many replicas must confirm an acknowledged write, and for how long to wait."""

    replicas: int = 0
    timeout_ms: int = 1000

    @property
    def enabled(self) -> bool:
        return self.replicas > 0


NONE = Durability()


@dataclass(slots=True)
class Call:
    """One script call: KEYS[1] routes it (all its keys share KEYS[1]'s slot)."""

    script: AsyncScript
    keys: Sequence[str]
    args: Sequence[Any]
    reply: Any = None
    done: bool = False
    ask: str | None = None  # node name an ASK redirect sent this call to

    @property
    def command(self) -> tuple[Any, ...]:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


def marker(key: str) -> str:
    """A key of ``key``'s slot for the offset-moving SET (its hash tag, else the whole key)."""
    start = key.find("{")
    end = key.find("}", start + 1)
    tag = key[start:end + 1] if start >= 0 and end > start + 1 else "{" + key + "}"
    return tag + MARKER_SUFFIX


async def run_acknowledged(redis: Redis | RedisCluster, durability: Durability, what: str,
                           calls: Sequence[Call]) -> list[Any]:
    """Run every call once, then WAIT on each connection that carried one; the replies in
    order (an error reply in its place). Raises NotReplicated if a WAIT came back short, and
    StoreUnavailable if the calls could not be run in ``ROUNDS`` rounds."""
    short: list[int] = []
    failures = 0
    for _ in range(ROUNDS):
        pending = [call for call in calls if not call.done]
        if not pending:
            break
        try:
            if isinstance(redis, RedisCluster):
                short += await _cluster_round(redis, durability, pending)
            else:
                short += await _single_round(redis, durability, pending)
        except _RETRY_ON as exc:
            # A refused or broken connection (a cluster's node may have just failed over): as
            # many more tries as the client's own commands get, so that a dead master is a 503
            # within about a second. A single Redis that timed out is not tried again, as its
            # commands are not (connection.py); a cluster's timeout is, as its commands' are.
            failures += 1
            if failures > RETRIES or (isinstance(exc, TimeoutError)
                                      and not isinstance(redis, RedisCluster)):
                raise
            await asyncio.sleep(0.1 * failures)
    if any(not call.done for call in calls):
        raise StoreUnavailable(f"{what}: still redirected after {ROUNDS} rounds")
    if short:
        raise NotReplicated(what, min(short), durability.replicas, durability.timeout_ms)
    return [call.reply for call in calls]


async def _single_round(redis: Redis, durability: Durability, calls: Sequence[Call]
                        ) -> list[int]:
    pipe: Any = redis.pipeline(transaction=False)
    for call in calls:
        pipe.execute_command(*call.command)
    _mark_and_wait(pipe, marker(calls[-1].keys[0]), durability)
    replies = await pipe.execute(raise_on_error=False)
    ran = 0
    for call, reply in zip(calls, replies[:len(calls)], strict=True):
        if isinstance(reply, NoScriptError):
            await redis.script_load(call.script.script)
        else:
            call.reply, call.done = reply, True
            ran += 1
    return _short(replies[-1], durability) if ran else []


async def _cluster_round(redis: RedisCluster, durability: Durability, calls: Sequence[Call]
                         ) -> list[int]:
    """One pipeline over every node involved: each node's calls, its marker and its WAIT go
    on one connection of that node, in that order."""
    await redis.initialize()
    groups: dict[str, tuple[ClusterNode, list[Call]]] = {}
    for call in calls:
        node = (redis.get_node(node_name=call.ask) if call.ask else None)
        node = node or _owner(redis, call.keys[0])
        groups.setdefault(node.name, (node, []))[1].append(call)
    pipe: Any = redis.pipeline(transaction=False)
    for node, group in groups.values():
        for call in group:
            if call.ask:
                pipe.execute_command("ASKING", target_nodes=node)
            pipe.execute_command(*call.command, target_nodes=node)
        # The marker goes without ASKING: only a node that serves the slot may create it.
        # An importing node refuses the scripts (TRYAGAIN) but would take the marker, beside
        # the one the source still holds, and the reshard's MIGRATE of it fails (BUSYKEY).
        # So it is of a slot the node was not ASKed into, when the group has one.
        mark = next((call for call in reversed(group) if not call.ask), group[-1])
        _mark_and_wait(pipe, marker(mark.keys[0]), durability, node)
    replies = iter(await pipe.execute(raise_on_error=False, allow_redirections=False))
    short: list[int] = []
    retry_later = False
    for node, group in groups.values():
        outcomes, wait_reply = await _read_group(redis, node, group, replies)
        if "done" in outcomes:
            short += _short(wait_reply, durability)
        retry_later |= "try again" in outcomes
    if retry_later:
        await asyncio.sleep(TRY_AGAIN_SECONDS)
    return short


async def _read_group(redis: RedisCluster, node: ClusterNode, group: list[Call],
                      replies: Iterator[Any]) -> tuple[list[str], Any]:
    """The outcome of each call of one node's share, and its WAIT reply."""
    outcomes = []
    for call in group:
        if call.ask:
            next(replies)  # ASKING's OK
        outcomes.append(await _settle(redis, node, call, next(replies)))
    next(replies)  # the marker's OK (MOVED or ASK on a node that does not serve the slot)
    return outcomes, next(replies)


def _owner(redis: RedisCluster, key: str) -> ClusterNode:
    node = redis.get_node_from_key(key)
    if node is None:
        raise StoreUnavailable(f"no node serves the slot of {key!r}")
    return node


async def _settle(redis: RedisCluster, node: ClusterNode, call: Call, reply: Any) -> str:
    """Keep a final reply ("done"), or prepare the call's next round after a redirect."""
    call.ask = None
    if isinstance(reply, NoScriptError):
        await redis.execute_command("SCRIPT LOAD", call.script.script, target_nodes=node)
    elif isinstance(reply, MovedError):
        await redis.nodes_manager.move_slot(reply)
    elif isinstance(reply, AskError):
        name = f"{reply.host}:{reply.port}"
        if redis.get_node(node_name=name) is None:
            return "try again"  # a node the slot map does not know yet: ask the owner again
        call.ask = name
    elif isinstance(reply, TryAgainError):
        return "try again"  # the slot's keys are moving (connection.py's migration guard)
    elif isinstance(reply, _RETRY_ON):
        raise reply
    else:
        call.reply, call.done = reply, True
        return "done"
    return "redirected"


def _mark_and_wait(pipe: Any, marker_key: str, durability: Durability,
                   node: ClusterNode | None = None) -> None:
    target = {} if node is None else {"target_nodes": node}
    pipe.execute_command("SET", marker_key, "", "PX", MARKER_TTL_MS, **target)
    pipe.execute_command("WAIT", durability.replicas, durability.timeout_ms, **target)


def _short(wait_reply: Any, durability: Durability) -> list[int]:
    """[replicas confirmed] if fewer than wanted, else []."""
    if isinstance(wait_reply, RedisError):
        return [0]
    confirmed = int(wait_reply)
    return [confirmed] if confirmed < durability.replicas else []


class DurableScript(AsyncScript):
    """A registered script whose calls are acknowledged (``run_acknowledged``); called like
    redis-py's ``AsyncScript``: ``await script(keys=[prefix], args=[...])``."""

    def __init__(self, redis: Redis | RedisCluster, source: str, name: str,
                 durability: Durability) -> None:
        super().__init__(redis, source)
        self.redis = redis
        self.name = name
        self.durability = durability

    async def __call__(self, keys: Sequence[Any] | None = None,  # type: ignore[override]
                       args: Sequence[Any] | None = None, client: Any = None) -> Any:
        reply = (await run_acknowledged(self.redis, self.durability, self.name,
                                        [Call(self, list(keys or []), list(args or []))]))[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

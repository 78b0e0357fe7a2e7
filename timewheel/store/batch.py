"""Many tasks at once (``POST /tasks/batch``, a recurring schedule's occurrences): the
``schedule`` script called once per bucket for many tasks, the calls pipelined, and the views of
many tasks read with one script call per bucket.

- Calls: lua/schedule.lua takes the tasks of one bucket, up to CALL_TASKS of them, in request
  order. Each call stays a single-slot script (its bucket's tag), and each task in it is
  decided and written as ``Store.schedule`` would alone. A key's every occurrence goes into the
  call of its first, in order, so a later duplicate sees the earlier one (200 when identical,
  409 when not), exactly as two POSTs in a row would, whatever order the calls run in.
- One pipeline of those calls: one round trip on a single Redis (packed by hiredis, see
  ``_exchange``); on a Redis Cluster, redis-py's cluster pipeline splits the commands by node
  and sends each node its share concurrently.
- NOSCRIPT: the commands are queued as raw ``EVALSHA`` (redis-py 8 blocks ``evalsha`` on a
  cluster pipeline, redis/redis-py#2914, and loads scripts for plain pipelines with an extra
  SCRIPT EXISTS round trip). A call answered NOSCRIPT (the script cache was flushed: a restart, a
  failover, a new node) did not run; it is run again on its own through the registered script,
  which loads the script and retries. The calls touch distinct tasks, so this reorders nothing.
- Each task carries its own request id (the batch's random id and the item's index), so a
  pipeline that redis-py re-sends after a lost reply answers each item as the first run did.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from timewheel.errors import StoreUnavailable
from timewheel.store.durability import Call, DurableScript, run_acknowledged
from timewheel.store.record import NewTask, TaskRecord
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import ScheduleReply
from timewheel.store.task_store import Store

# New keys a schedule call takes at most. One call holds Redis for its whole run, ~20 us a task
# (bench/README.md), so other clients wait ~2 ms; a key given again joins its first's call, so
# a batch of one key a thousand times is one call (~7 ms: repeats only answer). A call per task
# cost Redis ~30 % more a task (the script's library definitions and the call itself, every
# time).
CALL_TASKS = 100


def script_calls(keys: Sequence[str], bucket_of: Callable[[str], int]
                 ) -> list[tuple[int, list[int]]]:
    """Indexes of ``keys`` grouped into script calls, each with its bucket: a call's keys share
    the bucket, in request order, at most CALL_TASKS of them, except that a key given again
    joins the call of its first occurrence (which may then pass CALL_TASKS)."""
    calls: list[tuple[int, list[int]]] = []
    filling: dict[int, int] = {}  # bucket -> its call still taking new keys
    home: dict[str, int] = {}  # key -> the call it is in
    for index, key in enumerate(keys):
        call = home.get(key)
        if call is None:
            bucket = bucket_of(key)
            call = filling.get(bucket)
            if call is None or len(calls[call][1]) >= CALL_TASKS:
                call = filling[bucket] = len(calls)
                calls.append((bucket, []))
            home[key] = call
        calls[call][1].append(index)
    return calls


async def schedule_many(store: Store, tasks: Sequence[NewTask], now_ms: int
                        ) -> list[ScheduleReply]:
    """Create ``tasks`` (never replace): CREATED, EXISTS or CONFLICT for each, in order, as
    ``Store.schedule(task, replace=False)`` answers for one."""
    codes: list[ScheduleReply] = [ScheduleReply.CREATED] * len(tasks)
    batch_id = secrets.token_hex(8)
    groups = script_calls([task.key for task in tasks], store.keys.bucket_of)
    calls = []
    for bucket, group in groups:
        args: list[Any] = ["create", now_ms]
        for i in group:
            args += store.schedule_args(tasks[i], f"{batch_id}.{i}")
        calls.append(([store.keys.prefix(bucket)], args))
    try:
        async with redis_errors("schedule_many"):
            replies = await _run_calls(store, calls)
    except StoreUnavailable:
        # Refused part-way (a Redis that filled up, a lost connection, replicas that did not
        # confirm): any call may have stored its tasks, and one due before the next tick
        # would wait for that tick. A word for a bucket with nothing new costs one claim.
        _tell_due(store, tasks, groups, lambda i: True)
        raise
    for (_, group), reply in zip(groups, replies, strict=True):
        for index, code in zip(group, reply, strict=True):
            codes[index] = ScheduleReply(int(code))
    if store.cipher is not None:  # fingerprints keyed by another key (Store.same_request)
        for index, code in enumerate(codes):
            if code is ScheduleReply.CONFLICT and await store.same_request(tasks[index]):
                codes[index] = ScheduleReply.EXISTS
    _tell_due(store, tasks, groups, lambda i: codes[i] is ScheduleReply.CREATED)
    return codes


def _tell_due(store: Store, tasks: Sequence[NewTask], groups: list[tuple[int, list[int]]],
              created: Callable[[int], bool]) -> None:
    """``Store.due_soon`` for each call's bucket, with its earliest task ``created`` (the
    ticker keeps the earliest a bucket: one word a call is enough)."""
    for bucket, group in groups:
        due = [tasks[i].due_ms for i in group if created(i)]
        if due:
            store.due_soon(bucket, min(due))


async def _run_calls(store: Store, calls: Sequence[tuple[list[str], list[Any]]]
                     ) -> list[list[Any]]:
    """One pipeline of schedule calls on distinct tasks; NOSCRIPT answers re-run one by one."""
    script = store.scripts.schedule
    commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]
    replies: list[Any]
    if isinstance(script, DurableScript):  # acknowledged: WAIT on each connection that wrote
        replies = await run_acknowledged(store.redis, script.durability, "schedule_many",
                                         [Call(script, keys, args) for keys, args in calls])
    elif isinstance(store.redis, Redis):
        replies = await _exchange(store.redis, commands)
    else:  # a cluster: redis-py's cluster pipeline sends each node its share
        pipe: Any = store.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        replies = await pipe.execute(raise_on_error=False)
    answered = []
    for (keys, args), reply in zip(calls, replies, strict=True):
        if isinstance(reply, NoScriptError):
            reply = await script(keys=keys, args=args)
        elif isinstance(reply, Exception):  # also a cluster's "TTL exhausted" (a RedisError)
            raise reply
        answered.append(reply)
    return answered


# The reads of one round share a deadline, moved on only when less than the socket timeout is
# left (to now + socket timeout x _SLACK): every reply still has at least the socket timeout from
# the one before, as when each read_response had its own, and waits at most 10 % longer.
# Pays for itself: with a plain read_response() per reply the service spent 9 % more CPU per
# task (2-11 % by sitting) on `python -m bench.batch --tasks 50000 --concurrency 2`
# (bench/README.md, "What each mechanism pays for"). It rests on redis-py's
# read_response(timeout=math.inf) meaning "no timer" (so documented in redis-py 8.1, and marked
# there to change in its next major: redis is pinned below 9) and on Connection._host_error();
# tests/test_library_internals.py checks both.
_SLACK = 1.1


async def _exchange(redis: Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` in one write on one pooled connection and read every reply (an error
    reply in its place): what redis-py's pipeline does, with the commands packed by hiredis.

    redis-py's asyncio client packs commands in Python, about 17 us for one schedule call's 28
    arguments (layout 1; layout 2 sends 8, the record packed), a fifth of a batched task's
    whole cost in the service (bench/README.md); hiredis packs the same bytes in C in about
    5 us. Arguments are str (UTF-8, redis-py's default
    encoding), bytes or int, which both pack alike. Retries and their disconnects are the
    connection's own, as in redis-py's pipeline; a re-sent call answers as before (request id).
    """
    packed = b"".join(hiredis.pack_command(command) for command in commands)
    pool = redis.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    loop = asyncio.get_running_loop()

    async def read_all(deadline: asyncio.Timeout | None, timeout: float) -> list[Any]:
        replies: list[Any] = []
        for _ in commands:
            try:
                # No timeout of its own (math.inf): read_response would make and cancel one
                # per reply, ~5 of the ~12 us of client CPU a batched task cost. The deadline
                # below moves on with the replies instead (_SLACK).
                replies.append(await conn.read_response(timeout=math.inf))
            except ResponseError as exc:  # read whole: the connection stays in step
                replies.append(exc)
            if deadline is not None:
                now = loop.time()
                if (deadline.when() or now) - now < timeout:
                    deadline.reschedule(now + timeout * _SLACK)
        return replies

    async def send_and_read() -> list[Any]:
        await conn.send_packed_command(packed)
        timeout = conn.socket_timeout
        if timeout is None:
            return await read_all(None, 0)
        try:
            async with asyncio.timeout(timeout * _SLACK) as deadline:
                return await read_all(deadline, timeout)
        except TimeoutError:  # as read_response fails when its socket timeout passes
            await conn.disconnect(nowait=True)
            raise RedisTimeoutError(f"Timeout reading from {conn._host_error()}") from None

    async def reset(error: Exception) -> None:
        await conn.disconnect()

    try:
        # A send or read cut short (an error, a timeout, a cancelled request) disconnects the
        # connection inside redis-py, so no unread reply is handed to the next user
        # (tests/test_api_batch.py checks this).
        replies: list[Any] = await conn.retry.call_with_retry(send_and_read, reset)
        return replies
    finally:
        await pool.release(conn)


# Headers and bodies that get_many reads: the existing tasks a batch names are shown in its
# answer, and 1000 of them with 1 MiB bodies must not be copied out of Redis at once.
REQUEST_BYTES = 8 * 1024 * 1024


async def get_many(store: Store, keys: Sequence[str]) -> list[TaskRecord | None]:
    """The tasks of ``keys`` (None for an unknown key): one lua/view.lua call per bucket, the
    calls concurrent. Headers and bodies are read up to REQUEST_BYTES in all (the first of
    each bucket always); a task past that has them None."""
    if not keys:
        return []
    by_bucket: dict[int, list[str]] = {}
    for key in dict.fromkeys(keys):
        by_bucket.setdefault(store.keys.bucket_of(key), []).append(key)
    budget = REQUEST_BYTES // len(by_bucket)
    groups = await asyncio.gather(*(store.views(b, ks, request_budget=budget)
                                    for b, ks in by_bucket.items()))
    found = {key: view for ks, views in zip(by_bucket.values(), groups, strict=True)
             for key, view in zip(ks, views, strict=True)}
    return [found[key] for key in keys]

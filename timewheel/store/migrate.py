"""Upgrading a wheel written by layout 1 (a hash per task record) to layout 2.

Layout 2 (timewheel/store/layout.py, keys.py) keeps a task's record under the same key, as a
string, and uses other names for every index. So the two layouts never read each other's
indexes, and a script of either layout that meets a record of the other fails on its type
before writing anything (layout-2 write scripts answer ``OLDLAYOUT``; reads treat it as no
record of theirs).

``migrate_v1`` runs once per process, in ``Store.init``, before the process claims or serves
anything; the claim path knows nothing of layout 1. A v1 process still writing during a
rolling upgrade writes records that no layout-2 process claims or lists until one starts
again (stop the v1 processes before the last restart). A bucket was written by layout 1 if and
only if it has the v1 cursor (``cursor``: every v1 create set it, nothing v1 ever deleted it).
For each such bucket:

1. its v1 cursor is deleted first, so that a v1 process writing during the migration sets it
   again and the bucket is migrated once more;
2. every v1 record of the wheel is found by ``SCAN ... TYPE hash`` over the task keys, read,
   rebuilt as a layout-2 record in Python (``from_v1``) and written by lua/migrate.lua, which
   checks that the hash is still what was read and puts the task into the index of its state;
3. the v1 indexes (slices, delete-sets, leases, dead letters, claim records, parked sets) are
   deleted.

Every step is idempotent, so processes starting together may all run it. Nothing is dropped:
a record that cannot be rebuilt becomes a failed task (a dead letter) saying why. The scan
reads the whole keyspace once (10 M keys: a minute or so of SCAN calls of 1,000 keys, each
short, so Redis keeps serving meanwhile).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import defaultdict
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from timewheel.store import layout
from timewheel.store.keys import Keyspace
from timewheel.store.record import default_flow
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import MigrateReply
from timewheel.store.scripts import source

log = logging.getLogger(__name__)

BATCH = 100  # records per script call
V1_CURSOR = "cursor"
V1_INDEXES = ("lease", "dead", "wf")  # plus the m:, d:, c: and w: families
TOMBSTONE_FP = b"tombstone".ljust(12, b"\0")  # as lua/sched_tombstone.lua pads it


def _glob(text: str) -> str:
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def _ms(fields: dict[str, bytes], name: str, lenient: bool) -> int:
    try:
        return int(fields.get(name) or 0)
    except ValueError:
        if lenient:
            return 0
        raise


def from_v1(fields: dict[str, bytes], now_ms: int | None) -> bytes:
    """The layout-2 record of a v1 record's fields. One that does not convert becomes a failed
    task whose last_err says why (so it shows among the dead letters instead of vanishing);
    its finished time is ``now_ms``, or lua/migrate.lua's when None."""
    try:
        return _convert(fields)
    except (KeyError, ValueError, TypeError) as exc:
        log.error("a v1 task record does not convert; it becomes a failed task: %s", exc)
        return _convert(fields, failed=f"could not migrate the v1 record: {exc}"[:500],
                        now_ms=now_ms)


def _convert(fields: dict[str, bytes], *, failed: str | None = None,
             now_ms: int | None = None) -> bytes:
    lenient = failed is not None
    text = {name: value.decode(errors="replace" if lenient else "strict")
            for name, value in fields.items() if name != "body"}
    url = text.get("url", "")
    try:
        headers = [(str(n), str(v)) for n, v in json.loads(text.get("headers") or "[]")]
        flow = text.get("flow") or default_flow(url)
    except (ValueError, TypeError):
        if not lenient:
            raise
        headers, flow = [], "migration"
    method = text.get("method", "POST")
    if method not in layout.METHOD_CODES:
        if not lenient:
            raise ValueError(f"method {method!r}")
        method = "POST"
    fp = text.get("fp", "")
    ms = {name: _ms(fields, name, lenient) for name in (
        "due", "attempts", "max", "exec", "created", "backoff", "timeout", "last_at",
        "last_code", "finished")}
    record: dict[str, Any] = {
        "ver": layout.VERSION, "st": layout.STATUS_CODES[text["status"]] if not lenient else "f",
        "att": ms["attempts"], "max": ms["max"] or 1,
        "meth": layout.METHOD_CODES[method], "started": int("started" in fields),
        "due": ms["due"], "exec": ms["exec"] or ms["due"],
        "created": ms["created"], "backoff": ms["backoff"], "timeout": ms["timeout"] or 10_000,
        "last_at": ms["last_at"], "last_code": ms["last_code"], "finished": ms["finished"],
        "claim": layout.digest(text["claim"]) if "claim" in text else layout.NONE,
        "op": layout.NONE, "opr": 0,
        "fp": TOMBSTONE_FP if fp == "tombstone" else layout.fp_bytes(fp),
        "flow": flow, "url": url, "headers": layout.encode_headers(headers),
        "body": fields.get("body", b""), "last_err": failed or text.get("last_err", ""),
    }
    if lenient:
        record["finished"] = record["finished"] or now_ms or 0  # 0: migrate.lua sets now
        record["claim"] = layout.NONE
    return layout.encode(record)


def _seen(row: dict[bytes, bytes]) -> str:
    """What lua/migrate.lua compares: SHA-1 of HGETALL's fields and values joined by NUL."""
    return hashlib.sha1(b"\0".join(part for item in row.items() for part in item),
                        usedforsecurity=False).hexdigest()


class _Target:
    """What the migration works on: the client, the wheel's keys and lua/migrate.lua."""

    def __init__(self, redis: Redis | RedisCluster, keys: Keyspace) -> None:
        self.redis = redis
        self.keys = keys
        self.migrate_script: AsyncScript = redis.register_script(source("migrate"))


async def migrate_v1(redis: Redis | RedisCluster, keys: Keyspace,
                     now_ms: int | None = None) -> int:
    """Migrate every bucket that still has v1 keys; returns how many records were converted.
    ``now_ms`` places overdue pending tasks (default: Redis's clock)."""
    target = _Target(redis, keys)
    async with redis_errors("migrate"):
        pipe: Any = target.redis.pipeline(transaction=False)
        for bucket in range(keys.buckets):
            pipe.exists(keys.prefix(bucket) + V1_CURSOR)
        flags: list[Any] = await pipe.execute()
        buckets = [b for b, flag in enumerate(flags) if int(flag)]
        if not buckets:
            return 0
        log.warning("migrating %d buckets written by layout 1 to layout 2", len(buckets))
        for bucket in buckets:
            await target.redis.delete(keys.prefix(bucket) + V1_CURSOR)
        migrated = await _records(target, now_ms)
        for bucket in buckets:
            await _drop_v1_indexes(target, bucket)
    log.warning("migration to layout 2 done: %d task records converted", migrated)
    return migrated


async def _records(target: _Target, now_ms: int | None) -> int:
    pattern = _glob("{" + target.keys.key_prefix + ":") + "*}:t:*"
    batches: defaultdict[int, list[str]] = defaultdict(list)
    migrated = 0
    async for name in target.redis.scan_iter(match=pattern, count=1000, _type="HASH"):
        tag, _, key = name.decode().partition("}:t:")
        bucket = int(tag.rpartition(":")[2])  # the bucket the key is stored in
        batches[bucket].append(key)
        if len(batches[bucket]) >= BATCH:
            migrated += await _batch(target, bucket, batches.pop(bucket), now_ms)
    for bucket, batch in batches.items():
        migrated += await _batch(target, bucket, batch, now_ms)
    return migrated


async def _batch(target: _Target, bucket: int, keys: list[str], now: int | None) -> int:
    """Convert one bucket's records; a record changed between read and write is read again."""
    done = 0
    for _ in range(5):
        pipe: Any = target.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(f"{target.keys.prefix(bucket)}t:{key}")
        rows: list[dict[bytes, bytes]] = await pipe.execute()
        # Without a caller's time, lua/migrate.lua reads Redis's clock (the wheel's clock).
        args: list[Any] = ["" if now is None else now]
        present = [(key, row) for key, row in zip(keys, rows, strict=True) if row]
        for key, row in present:
            fields = {name.decode(): value for name, value in row.items()}
            args += [key, _seen(row), from_v1(fields, now)]
        if not present:
            return done
        reply = await target.migrate_script(keys=[target.keys.prefix(bucket)], args=args)
        codes = [MigrateReply(int(code)) for code in reply]
        done += codes.count(MigrateReply.MIGRATED)
        keys = [key for (key, _), code in zip(present, codes, strict=True)
                if code is MigrateReply.CHANGED]
        if not keys:
            return done
    log.error("%d v1 records kept changing during the migration; they are left for the next "
              "one", len(keys))
    return done


async def _drop_v1_indexes(target: _Target, bucket: int) -> None:
    prefix = target.keys.prefix(bucket)
    names = [prefix + name for name in V1_INDEXES]
    async for name in target.redis.scan_iter(match=_glob(prefix) + "[mdcw]:*", count=1000):
        names.append(name.decode())
    for i in range(0, len(names), 500):
        await target.redis.delete(*names[i:i + 500])

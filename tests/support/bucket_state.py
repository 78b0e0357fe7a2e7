"""A bucket's whole state as a dict, to seed before a script runs and compare after it
(asynq's Seed*/Get*), for the script tests (tests/test_scripts.py and its siblings).

Keys are named without the bucket prefix. A task record (``t:<key>``) is the decoded record
(timewheel/store/layout.py) without its length fields; a zset is {member: score}, a set a set,
a list a list, a string a str. ``rec`` builds a record the way lua/schedule.lua writes the
tests' standard task, with claim tokens and request ids given as text.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from tests.conftest import START_MS
from timewheel.store import Store, layout
from timewheel.store.keys import INDEX_KEEPER

NOW = START_MS
MIN = 60_000
M0 = NOW // MIN
RET = 7 * 86_400_000  # the store fixture's retention_ms
MARGIN = 5000  # the store fixture's lease_margin_ms
B = 3
P = "{tw:3}:"
URL = "http://127.0.0.1:9/cb"
FLOW = "127.0.0.1:9"
_LENGTHS = ("fl", "ul", "hl", "bl", "el")
# ``dump`` leaves the keeper of the lease and finished indexes out (store/keys.py
# INDEX_KEEPER), so a test states the entries it expects; tests/test_lease_index.py checks the
# keeper itself.
KEPT_INDEXES = frozenset(P + name for name in ("ls", "fs", "ff", "fc"))


def rec(status: str = "scheduled", due: int = NOW, **extra: Any) -> dict[str, Any]:
    """A task record as schedule.lua writes it, then ``extra``: attempts, claim (the token),
    op (the request id), started (bool), and any other field by its layout name."""
    row: dict[str, Any] = {
        "ver": layout.VERSION, "st": layout.STATUS_CODES[status], "att": 0, "max": 5,
        "meth": "P", "started": 0, "due": due, "exec": due, "created": NOW, "backoff": 1000,
        "timeout": 10000, "last_at": 0, "last_code": 0, "finished": 0, "claim": layout.NONE,
        "op": layout.NONE, "opr": 0, "fp": layout.fp_bytes("fp"), "flow": FLOW.encode(),
        "url": URL.encode(), "headers": b"", "body": b"", "last_err": b""}
    for name, value in extra.items():
        if name == "attempts":
            row["att"] = value
        elif name in ("claim", "op"):
            row[name] = layout.digest(value)
        elif name == "started":
            row["started"] = int(bool(value))
        elif name == "fp":
            row["fp"] = layout.fp_bytes(value)
        elif isinstance(value, str) and name in ("flow", "url", "headers", "body", "last_err"):
            row[name] = value.encode()
        else:
            assert name in row, name
            row[name] = value
    return row


def delivering(token: str = "tok", **extra: Any) -> dict[str, Any]:
    return rec("delivering", claim=token, **extra)


PAGES = "fc pages"  # how ``dump`` shows the cancelled index's pages: their entries together


def cancelled(entries: dict[str, int]) -> dict[str, dict[str, int]]:
    """The cancelled index's pages (lua/lib/record.lua) holding ``entries``, as ``dump`` shows
    them; tests/test_cancelled_pages.py checks how they are paged."""
    return {PAGES: entries}


def _pages(out: dict[str, Any]) -> None:
    """The cancelled index's directory and pages in ``out`` replaced by their entries, once
    checked: each page is in the directory and each directory entry has its page, and every
    entry lies in its page's range (from its start to the next page's)."""
    directory = out.pop("fcp", {})
    pages = {int(name[3:]): out.pop(name) for name in list(out) if name.startswith("fc:")}
    assert {int(start) for start in directory} == set(pages), (directory, pages)
    assert all(int(start) == score for start, score in directory.items())
    starts = sorted(pages)
    entries: dict[str, int] = {}
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else None
        assert all(start <= t and (end is None or t < end) for t in pages[start].values())
        assert not set(entries) & set(pages[start]), "a task on two pages"
        entries |= pages[start]
    if entries:
        out[PAGES] = entries


def minutes(*ms: int) -> dict[str, dict[str, int]]:
    """The minute index ``mn`` holding ``ms``."""
    return {"mn": {str(m): m for m in ms}}


async def seed(redis: Redis, state: dict[str, Any]) -> None:
    for short, value in state.items():
        name = P + short
        if short.startswith("t:"):
            await redis.set(name, layout.encode(value))
        elif short.startswith(("ms:", "ls", "ff", "fs", "fc", "pw:", "pf", "pa", "mn")):
            await redis.zadd(name, value)
        elif short.startswith("md:"):
            await redis.sadd(name, *value)
        elif short.startswith("cl:"):
            await redis.rpush(name, *value)
        else:
            await redis.set(name, value)


async def dump(redis: Redis) -> dict[str, Any]:
    """Every key in Redis but the wheel's bucket count; all of them must be in bucket B."""
    out: dict[str, Any] = {}
    async for raw in redis.scan_iter(match="*"):
        name = raw.decode()
        if name == "tw:buckets":
            continue
        assert name.startswith(P), f"key outside the bucket: {name}"
        kind = (await redis.type(raw)).decode()
        value: Any
        if kind == "zset":
            value = {m.decode(): int(s) for m, s in await redis.zrange(raw, 0, -1, withscores=True)}
            if name in KEPT_INDEXES:
                value.pop(INDEX_KEEPER, None)
                if not value:
                    continue
        elif kind == "set":
            value = {m.decode() for m in await redis.smembers(raw)}
        elif kind == "list":
            value = [m.decode() for m in await redis.lrange(raw, 0, -1)]
        elif name[len(P):].startswith("t:"):
            value = layout.decode(await redis.get(raw))
            for length in _LENGTHS:
                del value[length]
        else:
            value = (await redis.get(raw)).decode()
        out[name[len(P):]] = value
    _pages(out)
    return out


async def assert_ttls(redis: Redis, expected: dict[str, int]) -> None:
    """Exactly the keys in ``expected`` expire, each within a minute under its TTL."""
    found = {}
    async for raw in redis.scan_iter(match="*"):
        pttl = await redis.pttl(raw)
        if pttl >= 0:
            found[raw.decode()[len(P):]] = pttl
    assert set(found) == set(expected)
    for short, ttl in expected.items():
        assert ttl - 60_000 < found[short] <= ttl, short


async def run(store: Store, name: str, *args: Any) -> Any:
    """Run a script (``Scripts``' or the store's own read-only ones) on bucket B."""
    script = getattr(store.scripts, name, None) or getattr(store, f"{name}_script")
    if name == "start":  # one prefix, then its key, token pairs (lua/start.lua takes several)
        args = (1, len(args) // 2, *args)
    elif name == "complete":  # now, retention, kept, one prefix, then its outcomes (nine each)
        args = (*args[:3], 1, -(-(len(args) - 3) // 9), *args[3:])
    elif name == "schedule":  # one task: key, mode, now, request id, record[, results]
        key, mode, now, req, record, *results = args
        (code,) = await script(keys=[P], args=[mode, now, key, req, record, *(results or [""])])
        return code
    return await script(keys=[P], args=list(args))


def template(due: int, fp: str = "fp", **fields: Any) -> bytes:
    """The record lua/schedule.lua takes for the standard task (NewTask.record)."""
    args: dict[str, Any] = {"url": URL, "method": "POST", "headers": [], "body": None,
                            "due_ms": due, "timeout_ms": 10000, "max_attempts": 5,
                            "backoff_ms": 1000, "fingerprint": fp, "flow": FLOW, **fields}
    return layout.template(**args)


async def schedule(store: Store, key: str, due: int, mode: str = "create", now: int = NOW,
                   fp: str = "fp", req: str = "r1") -> int:
    return int(await run(store, "schedule", key, mode, now, req, template(due, fp)))


async def claim(store: Store, now: int, horizon: int | None = None, limit: int = 100,
                token: str = "tok", max_minutes: int = 1440) -> tuple[bool, list[str]]:
    more, tasks = await store.claim(B, now_ms=now, horizon_ms=now if horizon is None else horizon,
                                    limit=limit, token=token, max_minutes=max_minutes)
    assert all(t.token == token for t in tasks)
    return more, [t.key for t in tasks]

"""Finds ``lua/*.lua`` and registers each script once per Redis client.

A script that starts with ``-- lib: a, b`` gets the definitions of ``lua/lib/a.lua`` and
``lua/lib/b.lua`` that it uses prepended: code that several scripts share is written once, and
EVALSHA hashes the text as sent, libraries included. Only the definitions the script names
(directly or through another definition) are sent: Redis runs a script's top level, and so
makes every library function's closure, on every call; schedule's libraries alone took 3.2 µs
a call, the ones it uses 2.2 (bench/README.md, "Packing, encoding and script text").

redis-py's ``register_script`` calls EVALSHA and falls back to loading the script on NOSCRIPT,
so a Redis restart or failover that empties the script cache is handled transparently.

Acknowledged writes: the scripts in ``ACKNOWLEDGED`` are those whose result a client is told
(create, replace, cancel, replay, schedule and flow changes). With
``TIMEWHEEL_REDIS_WAIT_REPLICAS`` > 0 they are registered as ``durability.DurableScript``,
which WAITs for the replicas on the connection that ran the script; with 0 they are redis-py's
own scripts and cost nothing more. Callers do not change: both are called as
``await script(keys=[prefix], args=[...])``.

Every script takes one key, KEYS[1] (a bucket's or flow's prefix), and must use no other: on a
cluster the client adds a second key of the same slot to each call (the migration guard,
``connection.py``).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from timewheel.store.durability import NONE, Durability, DurableScript

NAMES = ("schedule", "cancel", "claim", "start", "complete", "release", "replay", "park",
         "unpark", "permits", "flow_limits", "flow_pause", "reschedule",
         "waiting_report", "waiting_count")
# The scripts whose reply the API reports to a client: acknowledged once durable.
ACKNOWLEDGED = frozenset({"schedule", "cancel", "replay", "reschedule", "flow_limits",
                          "flow_pause", "job_create", "sched_put", "sched_pause",
                          "sched_resume", "sched_delete", "sched_tombstone", "publish",
                          "topic_put", "topic_delete"})


def lua_dir() -> Path:
    """``timewheel/lua`` in an installed wheel; the repository's ``lua/`` in an editable install."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "lua", package.parent / "lua"):
        if (candidate / "claim.lua").is_file():
            return candidate
    raise FileNotFoundError("cannot find the timewheel Lua scripts (lua/claim.lua)")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMENT = re.compile(r"--.*$", re.MULTILINE)  # no script has "--" inside a string
_DEFINES = re.compile(r"^local\s+(?:function\s+([A-Za-z_]\w*)|([\w\s,]+?)\s*=)")


def _names(code: str) -> set[str]:
    return set(_NAME.findall(_COMMENT.sub("", code)))


def definitions(lib: str) -> list[tuple[frozenset[str], str]]:
    """A library's top-level definitions, in order: the names each defines (``local function
    f`` or ``local A, B = ...``) and its text, with the comment lines just above it. A library
    holds nothing else at its top level (tests/test_script_libraries.py checks every one)."""
    chunks: list[tuple[frozenset[str], str]] = []
    pending: list[str] = []  # comment and blank lines waiting for the next definition
    for line in lib.splitlines(keepends=True):
        found = _DEFINES.match(line)
        if found:
            names = found.group(1) or found.group(2)
            chunks.append((frozenset(n.strip() for n in names.split(",")),
                           "".join(pending) + line))
            pending = []
        elif line.startswith((" ", "\t", "end")) and chunks:  # the definition goes on
            chunks[-1] = (chunks[-1][0], chunks[-1][1] + "".join(pending) + line)
            pending = []
        elif line.strip() == "" or line.startswith("--"):
            pending.append(line)
        else:
            raise ValueError(f"not a definition at a library's top level: {line!r}")
    return chunks


@cache
def source(name: str) -> str:
    """The script as sent to Redis: the definitions of its ``-- lib:`` libraries that it uses,
    then its own text."""
    text = (lua_dir() / f"{name}.lua").read_text()
    first = text.partition("\n")[0]
    if not first.startswith("-- lib:"):
        return text
    libs = [lib.strip() for lib in first.removeprefix("-- lib:").split(",") if lib.strip()]
    chunks = [chunk for lib in libs
              for chunk in definitions((lua_dir() / "lib" / f"{lib}.lua").read_text())]
    used = _names(text)
    kept = [False] * len(chunks)
    grew = True
    while grew:  # a kept definition's own names count too
        grew = False
        for i, (names, body) in enumerate(chunks):
            if not kept[i] and names & used:
                kept[i], grew = True, True
                used.update(_names(body))
    return "".join(body for (_, body), keep in zip(chunks, kept, strict=True) if keep) + text


class Scripts:
    """One registered script per operation, named like the Store method that calls it."""

    schedule: AsyncScript
    cancel: AsyncScript
    claim: AsyncScript
    start: AsyncScript
    complete: AsyncScript
    release: AsyncScript
    replay: AsyncScript
    park: AsyncScript
    unpark: AsyncScript
    permits: AsyncScript
    flow_limits: AsyncScript
    flow_pause: AsyncScript
    waiting_report: AsyncScript
    waiting_count: AsyncScript
    reschedule: AsyncScript

    def __init__(self, redis: Redis | RedisCluster, durability: Durability = NONE) -> None:
        self.redis = redis
        self.durability = durability
        self._register_all()

    def _register_all(self) -> None:
        for name in NAMES:
            setattr(self, name, self.register(name))

    def register(self, name: str) -> AsyncScript:
        """``lua/<name>.lua`` on this client: acknowledged (WAIT) when it is one of
        ``ACKNOWLEDGED`` and replicas are required, else redis-py's script."""
        if name in ACKNOWLEDGED and self.durability.enabled:
            return DurableScript(self.redis, source(name), name, self.durability)
        return self.redis.register_script(source(name))

    def require_replicas(self, durability: Durability) -> None:
        """Acknowledge writes with ``durability`` from now on. ``Wheel.open`` calls this once,
        right after building the Store and before anything else registers scripts."""
        self.durability = durability
        self._register_all()

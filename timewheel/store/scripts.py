"""Finds ``lua/*.lua`` and registers each script once per Redis client.

A script that starts with ``-- lib: a, b`` gets ``lua/lib/a.lua`` and ``lua/lib/b.lua``
prepended: code that several scripts share is written once, and EVALSHA hashes the text as
sent, libraries included.

redis-py's ``register_script`` calls EVALSHA and falls back to loading the script on NOSCRIPT,
so a Redis restart or failover that empties the script cache is handled transparently.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

NAMES = ("schedule", "cancel", "claim", "start", "complete", "release", "replay", "park",
         "unpark", "permits", "flow_limits")


def lua_dir() -> Path:
    """``timewheel/lua`` in an installed wheel; the repository's ``lua/`` in an editable install."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "lua", package.parent / "lua"):
        if (candidate / "claim.lua").is_file():
            return candidate
    raise FileNotFoundError("cannot find the timewheel Lua scripts (lua/claim.lua)")


@cache
def source(name: str) -> str:
    """The script as sent to Redis: its ``-- lib:`` libraries, then its own text."""
    text = (lua_dir() / f"{name}.lua").read_text()
    first = text.partition("\n")[0]
    if not first.startswith("-- lib:"):
        return text
    libs = [lib.strip() for lib in first.removeprefix("-- lib:").split(",") if lib.strip()]
    return "".join((lua_dir() / "lib" / f"{lib}.lua").read_text() for lib in libs) + text


class Scripts:
    """One registered script per operation, named like the Store method that calls it."""

    def __init__(self, redis: Redis | RedisCluster) -> None:
        registered = {name: redis.register_script(source(name)) for name in NAMES}
        self.schedule: AsyncScript = registered["schedule"]
        self.cancel: AsyncScript = registered["cancel"]
        self.claim: AsyncScript = registered["claim"]
        self.start: AsyncScript = registered["start"]
        self.complete: AsyncScript = registered["complete"]
        self.release: AsyncScript = registered["release"]
        self.replay: AsyncScript = registered["replay"]
        self.park: AsyncScript = registered["park"]
        self.unpark: AsyncScript = registered["unpark"]
        self.permits: AsyncScript = registered["permits"]
        self.flow_limits: AsyncScript = registered["flow_limits"]

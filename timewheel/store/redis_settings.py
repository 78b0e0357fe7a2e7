"""The Redis settings the wheel relies on or is cheaper with, and the start-up check of them.

- ``maxmemory-policy noeviction``: an evicted key is a lost task (docs/design.md invariant 5).
- Compact encodings for the per-minute structures. At 6,000 tasks due a minute a bucket's minute
  slice (``ms:<minute>``, a zset) holds ~375 entries: past Redis's default limit of 128 it turns
  from a listpack (ziplist on Redis 6.2) into a skiplist and a pending task costs ~100 bytes
  more. The same holds for the minute's delete-set (``md:<minute>``, a set of task keys) on
  Redis 7.2+, which has a listpack encoding for small sets of strings (6.2 has none: a set of
  strings is always a hash table there). A listpack's operations scan and move it (O(N)), and
  the same limit applies to the bucket's lease and finished indexes, so the limit is not set
  higher than such a wheel needs: 512 keeps slices compact up to ~8,000 tasks due a minute,
  for ~5 µs more Redis time per claimed task (bench/README.md, "Memory at density").

Redis 7 renamed ``zset-max-ziplist-entries`` to ``zset-max-listpack-entries`` (the old name is an
alias); ``set-max-listpack-entries`` exists from 7.2 on. A setting the server does not know is
left out: CONFIG GET returns nothing for it, and ``server_args`` only passes names the version
accepts.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

COMPACT_ENTRIES = 512


@dataclass(frozen=True, slots=True)
class Setting:
    """One memory setting: its name (``old``: its name before Redis 7 renamed it), the least
    value that is not costly, and the first Redis version that has it."""

    name: str
    least: int
    since: tuple[int, int] = (0, 0)
    old: str | None = None

    def named_for(self, version: tuple[int, int]) -> str:
        return self.old if self.old and version < (7, 0) else self.name


MEMORY_SETTINGS = (
    Setting("zset-max-listpack-entries", COMPACT_ENTRIES, old="zset-max-ziplist-entries"),
    Setting("set-max-listpack-entries", COMPACT_ENTRIES, since=(7, 2)),
)


def server_args(version: tuple[int, int]) -> list[str]:
    """redis-server arguments that keep the wheel's per-minute structures compact, in the names
    a server of ``version`` (major, minor) accepts."""
    args = []
    for setting in MEMORY_SETTINGS:
        if version >= setting.since:
            args += [f"--{setting.named_for(version)}", str(setting.least)]
    return args


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) from the server's ``--version`` ("Redis server v=6.2.14 sha=...",
    "Valkey server v=8.1.8 sha=...")."""
    found = re.search(r"v=(\d+)\.(\d+)", text)
    if found is None:
        raise ValueError(f"not a redis-server version: {text!r}")
    return int(found.group(1)), int(found.group(2))


def costly_settings(config: dict[str, str]) -> list[str]:
    """The settings in ``config`` (CONFIG GET's answer) that cost memory, each as
    "name value (set N)". A setting the server does not have is not in ``config``; Redis 7
    may answer a renamed one under either name."""
    costly = []
    for setting in MEMORY_SETTINGS:
        name = setting.name if setting.name in config else setting.old
        value = config.get(name) if name else None
        if name and value is not None and value.isdigit() and int(value) < setting.least:
            costly.append(f"{name} {value} (set {setting.least})")
    return costly


async def primaries_config(redis: Redis | RedisCluster, pattern: str) -> dict[str, dict[str, str]]:
    """CONFIG GET ``pattern`` on every primary: {node: {name: value}} (a single Redis is one
    node, named by its address as a cluster names each: the warnings below name it). Raises
    RedisError where CONFIG is refused (managed Redis often does)."""
    if isinstance(redis, RedisCluster):
        reply: Any = await redis.config_get(pattern, target_nodes=RedisCluster.PRIMARIES)
        return {node: {_text(k): _text(v) for k, v in values.items()}
                for node, values in _per_primary(reply).items()}
    reply = await redis.config_get(pattern)
    return {_address(redis): {_text(k): _text(v) for k, v in reply.items()}}


def _address(redis: Redis) -> str:
    """host:port of a single Redis, or its unix socket's path."""
    given = redis.connection_pool.connection_kwargs
    if "path" in given:
        return str(given["path"])
    return f"{given.get('host', 'localhost')}:{given.get('port', 6379)}"


async def memory_used_ratio(redis: Redis | RedisCluster) -> float:
    """used_memory / maxmemory of the fullest primary (INFO memory, which managed Redis
    allows where it refuses CONFIG); 0.0 where none has a maxmemory. At 1 a primary refuses
    writes (noeviction: docs/deploy.md, "A full Redis")."""
    if isinstance(redis, RedisCluster):
        reply: Any = await redis.info("memory", target_nodes=RedisCluster.PRIMARIES)
    else:
        reply = await redis.info("memory")
    return max((int(node["used_memory"]) / int(node["maxmemory"])
                for node in _per_primary(reply).values() if int(node.get("maxmemory", 0))),
               default=0.0)


def _per_primary(reply: dict[Any, Any]) -> dict[str, dict[Any, Any]]:
    """A command sent to every primary: a cluster answers {node: {name: value}}, or a flat
    {name: value} for one primary (and a single Redis): that one as node "redis"."""
    if any(isinstance(value, dict) for value in reply.values()):
        return {str(node): values for node, values in reply.items()}
    return {"redis": reply}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def warn_about_settings(redis: Redis | RedisCluster) -> None:
    """Log a warning for every primary that may evict tasks, or lose them on a restart (no
    append-only file) or a power loss (appendfsync no), and one for every primary whose
    settings will cost memory (naming each, with the value to set). Says nothing where CONFIG
    is refused (or Redis fails: the caller has done its work already)."""
    try:
        policies = await primaries_config(redis, "maxmemory-policy")
        encodings = await primaries_config(redis, "*set-max-*-entries")
    except RedisError:  # managed Redis often refuses CONFIG
        return
    try:
        persistence = await primaries_config(redis, "append*")
    except RedisError:  # refused alone: the warnings above are still given
        persistence = {}
    for node, values in persistence.items():
        if values.get("appendonly") == "no":
            log.warning("Redis %s has appendonly no: a restart of it loses every task written "
                        "since its last snapshot, acknowledged or not (set appendonly yes, "
                        "README.md, \"Redis requirements\")", node)
        elif values.get("appendfsync") == "no":
            log.warning("Redis %s has appendfsync no: a power loss loses the tasks written in "
                        "the last ~30 s, acknowledged or not (set always, or everysec for up to "
                        "a second)", node)
    for node, values in policies.items():
        policy = values.get("maxmemory-policy", "")
        if policy != "noeviction":
            log.warning("Redis %s has maxmemory-policy %r, not noeviction: it may evict "
                        "tasks under memory pressure", node, policy)
    for node, values in encodings.items():
        costly = costly_settings(values)
        if costly:
            log.warning("Redis %s has %s: the minute slices of a busy wheel (more than ~2,000 "
                        "tasks due a minute) will not be compact, ~90 bytes more a pending task "
                        "(docs/deploy.md, \"Redis settings for memory\")", node, ", ".join(costly))

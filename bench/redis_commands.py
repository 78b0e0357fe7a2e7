"""Redis's own account of a due window: ``INFO commandstats`` and ``INFO cpu`` read at its start
and end, so that Redis's CPU per callback splits into the scripts, the commands they run and
the rest (bench/README.md, "Redis time per callback at 4,000/s").

Only for a run against a redis-server of its own: ``TIMEWHEEL_REDIS_URL`` set for the bench
and so for the service it starts (the embedded Redis is the service's, behind a private unix
socket). ``INFO`` resets nothing, so runs may share that Redis.
"""

from __future__ import annotations

import os
from typing import Any

import redis.asyncio as aioredis

URL_VARIABLE = "TIMEWHEEL_REDIS_URL"
# Not the service's own work: the bench's INFO, the client's handshake.
_NOT_THE_WHEELS = frozenset({"info", "hello", "client", "script", "ping"})


async def snapshot() -> dict[str, Any] | None:
    """Every command's calls and microseconds so far, and Redis's CPU seconds; None without
    TIMEWHEEL_REDIS_URL."""
    url = os.environ.get(URL_VARIABLE)
    if not url:
        return None
    client = aioredis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
        cpu = await client.info("cpu")
    finally:
        await client.aclose()
    commands = {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
                for name, v in stats.items()}
    return {"commands": commands,
            "cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])}


def per_callback(before: dict[str, Any], after: dict[str, Any], callbacks: int
                 ) -> dict[str, Any]:
    """The window's Redis time per callback (µs): all of Redis's CPU, the scripts (EVALSHA),
    the commands run by them and by the service directly, and each command's share."""
    def delta(name: str) -> tuple[int, int]:
        c0, u0 = before["commands"].get(name, (0, 0))
        c1, u1 = after["commands"][name]
        return c1 - c0, u1 - u0

    rows = {name: delta(name) for name in after["commands"] if name not in _NOT_THE_WHEELS}
    scripts = rows.pop("evalsha", (0, 0))
    n = max(callbacks, 1)
    return {
        "redis_cpu_us": round((after["cpu_s"] - before["cpu_s"]) * 1e6 / n, 1),
        "scripts_us": round(scripts[1] / n, 1),
        "callbacks_per_script_call": round(n / scripts[0], 1) if scripts[0] else None,
        "commands_us": round(sum(usec for _, usec in rows.values()) / n, 1),
        "by_command": {name: {"calls_per_callback": round(calls / n, 3),
                              "us_per_callback": round(usec / n, 2),
                              "us_per_call": round(usec / calls, 2)}
                       for name, (calls, usec) in sorted(rows.items(), key=lambda r: -r[1][1])
                       if calls},
    }

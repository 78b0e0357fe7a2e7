"""What the tests of a listing with an opaque name cursor (``GET /topics``, ``GET /schedules``:
timewheel/operations/cursors.py) check of a cursor it did not hand out."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest
from _pytest.mark import ParameterSet
from redis.asyncio import Redis

from tests.test_api import snapshot


def b64(text: str) -> str:
    """``text`` as such a cursor carries it: base64url, unpadded."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def cursors_not_handed_out(listing: str, name: str) -> list[ParameterSet]:
    """Strings that are no cursor of ``GET /{listing}``, whose names include ``name``: each
    test's parameters (ids as given)."""
    other = "schedules" if listing == "topics" else "topics"
    return [
        pytest.param("garbage", id="garbage"),
        pytest.param(name, id="a-bare-name"),  # the old cursor: a name, not a cursor
        pytest.param("", id="empty"),
        pytest.param(b64(f"{listing}\nbad name"), id="not-a-name-inside"),
        pytest.param(b64(f"{listing}\n{name}\n{name}"), id="two-names-inside"),
        pytest.param(base64.urlsafe_b64encode(f"{listing}\n".encode() + b"\xff").decode()
                     .rstrip("="), id="not-utf8-inside"),
        pytest.param(b64(f"{other}\n{name}"), id="another-listing"),
        pytest.param(b64(f"scheduled\n17\n{name}"), id="a-tasks-cursor"),
        pytest.param(b64(f"{listing}\n{name}") + "==", id="padded"),
        pytest.param("x" * 401, id="too-long"),
    ]


async def listing_reads(redis: Redis) -> int:
    """How many ZRANGEBYLEX calls Redis has run: a page of either listing starts with them."""
    stats: dict[str, Any] = await redis.info("commandstats")
    return int(stats.get("cmdstat_zrangebylex", {}).get("calls", 0))


async def assert_cursor_refused(client: httpx.AsyncClient, redis: Redis, path: str,
                                cursor: str) -> None:
    """``GET path?cursor=...`` is a 422 located at the cursor, and nothing is read or
    stored for it."""
    before, reads = await snapshot(redis), await listing_reads(redis)
    r = await client.get(path, params={"cursor": cursor})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", "cursor"]
    assert await listing_reads(redis) == reads
    assert await snapshot(redis) == before

"""Review of 26f809e: a DELETE of a started attempt keeps its lease in `ls`."""

from __future__ import annotations

import json

from redis.asyncio import Redis

from tests.support.bucket_state import NOW, RET, P, claim, dump, run, schedule
from timewheel.store import Store, layout

KEPT = 20


async def test_a_started_attempt_parked_after_a_delete_is_not_recorded_lost(
        store: Store, redis: Redis) -> None:
    """A rated flow's started attempt that asks its flow again (dispatcher
    _late_for_its_rate / NotWritten) is parked; a DELETE came in between. park.lua answers 0
    (the dispatcher moves it to SKIPPED and calls nothing else), so the claim and the lease
    that cancel now keeps stay behind, and the claim that finds the lease run out writes
    'lost: its process died or stalled' for an attempt that was never sent by a live process.
    It should be recorded as release.lua records it: cancelled, not sent."""
    due = NOW + 1000
    assert await schedule(store, "a", due) == 0
    assert (await claim(store, NOW, horizon=due))[1] == ["a"]
    assert (await run(store, "start", "a", "tok"))[0] == 1
    lease = int(await redis.zscore(P + "ls", "a") or 0)
    assert await run(store, "cancel", "a", NOW + 20, RET, "req-del", KEPT) == 1
    assert await run(store, "park", KEPT, "a", "tok") == [0]
    # The holder is done with it: nothing of its claim should be left.
    assert await redis.zscore(P + "ls", "a") is None
    await claim(store, lease + 1, token="t2")
    state = await dump(redis)
    history = [json.loads(e) for e in state.get("a:a", [])]
    assert [e["o"] for e in history] == ["cancelled"]
    assert (state["t:a"]["claim"], state["t:a"]["started"]) == (layout.NONE, 0)

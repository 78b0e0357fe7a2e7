"""GET /tasks: every status, in its order, paged with opaque cursors, in bounded steps
(docs/api.md "GET /tasks — list and search"; timewheel/store/listing.py)."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Literal

import httpx
import pytest

from tests.conftest import START_MS
from tests.test_api import URL, expected_view, fail_due
from timewheel.clock import FakeClock
from timewheel.models import format_ms
from timewheel.store import Outcome, Store
from timewheel.store.batch import schedule_many
from timewheel.store.listing import MAX_BUDGET
from timewheel.store.record import ClaimedTask, NewTask


async def add(client: httpx.AsyncClient, key: str, at_ms: int) -> None:
    r = await client.post("/tasks", json={"key": key, "callback_url": URL,
                                          "execute_at": at_ms / 1000})
    assert r.status_code == 201, r.text


async def pages(client: httpx.AsyncClient, status: str, limit: int, prefix: str = ""
                ) -> list[list[dict[str, Any]]]:
    """Every page of a listing, following next_cursor until it is null."""
    out, cursor = [], None
    for _ in range(1000):
        params: dict[str, Any] = {"status": status, "limit": limit}
        if prefix:
            params["key_prefix"] = prefix
        if cursor:
            params["cursor"] = cursor
        r = await client.get("/tasks", params=params)
        assert r.status_code == 200, r.text
        out.append(r.json()["tasks"])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("the listing never ended")


def keys(listing: list[list[dict[str, Any]]]) -> list[str]:
    return [task["key"] for page in listing for task in page]


async def test_scheduled_pages_in_due_order_with_a_prefix(client: httpx.AsyncClient) -> None:
    """30 tasks over five minutes (three on one millisecond), mixed with others: pages of 7
    hold exactly the prefix's tasks, soonest first (ties by key), each once, as full views."""
    due = {f"rem-{i:02d}": START_MS + 10_000 + ((i * 37) % 30) * 9_000 for i in range(30)}
    for key in ("rem-tie-b", "rem-tie-a", "rem-tie-c"):
        due[key] = START_MS + 100_000
    others = {f"other-{i}": START_MS + 5_000 + i * 20_000 for i in range(10)}
    items = list({**due, **others}.items())
    random.Random(7).shuffle(items)
    for key, at in items:
        await add(client, key, at)
    listing = await pages(client, "scheduled", 7, prefix="rem-")
    expected = sorted(due, key=lambda k: (due[k], k))
    assert keys(listing) == expected
    assert [len(page) for page in listing] == [7, 7, 7, 7, 5]
    for task in (t for page in listing for t in page):
        at = format_ms(due[task["key"]])
        assert task == expected_view(task["key"], execute_at=at)
    assert keys(await pages(client, "scheduled", 100)) == sorted(
        {**due, **others}, key=lambda k: ({**due, **others}[k], k))


async def test_each_status_lists_only_its_tasks(client: httpx.AsyncClient, store: Store,
                                                fake_clock: FakeClock) -> None:
    """scheduled (with the parked tasks that have no attempt yet), retrying (with the parked
    ones that have), delivering by lease, succeeded and cancelled newest first."""
    for i, key in enumerate(["ok-1", "ok-2", "retry-1", "claimed-1", "park-1", "park-2"]):
        await add(client, key, START_MS + i)
    await add(client, "later", START_MS + 3_600_000)
    await add(client, "gone-1", START_MS + 60_000)
    await add(client, "gone-2", START_MS + 120_000)
    for key in ("gone-2", "gone-1"):  # cancelled in this order: gone-1 is the newest
        assert (await client.delete(f"/tasks/{key}")).status_code == 204
        fake_clock.advance(10)
    now = START_MS + 100
    tasks = {t.key: t for t in await claim_every_bucket(store, now, "first")}
    assert sorted(tasks) == ["claimed-1", "ok-1", "ok-2", "park-1", "park-2", "retry-1"]
    await attempt(store, tasks["ok-2"], now + 5, "ok")
    await attempt(store, tasks["ok-1"], now + 9, "ok")
    await attempt(store, tasks["retry-1"], now, "retry", next_due_ms=START_MS + 50_000)
    await attempt(store, tasks["park-2"], now, "retry", next_due_ms=now)
    [tasks["park-2"]] = await claim_every_bucket(store, now, "second")
    for key in ("park-1", "park-2"):
        assert await store.park(tasks[key].bucket, [(key, tasks[key].token)]) == [1]

    assert keys(await pages(client, "scheduled", 1)) == ["park-1", "later"]
    assert keys(await pages(client, "retrying", 1)) == ["park-2", "retry-1"]
    assert keys(await pages(client, "delivering", 1)) == ["claimed-1"]
    assert keys(await pages(client, "succeeded", 1)) == ["ok-1", "ok-2"]
    assert keys(await pages(client, "cancelled", 1)) == ["gone-1", "gone-2"]
    assert keys(await pages(client, "failed", 1)) == []
    retrying = (await client.get("/tasks", params={"status": "retrying"})).json()["tasks"]
    assert [(t["status"], t["attempts"]) for t in retrying] == [("retrying", 1)] * 2


async def claim_every_bucket(store: Store, now: int, token: str) -> list[ClaimedTask]:
    claimed: list[ClaimedTask] = []
    for bucket in range(store.keys.buckets):
        claimed += (await store.claim(bucket, now_ms=now, horizon_ms=now, limit=100,
                                      token=f"{token}.{bucket}"))[1]
    return claimed


async def attempt(store: Store, task: ClaimedTask, at: int, kind: Literal["ok", "retry"],
                  next_due_ms: int | None = None) -> None:
    [started] = await store.start(task.bucket, claims=[(task.key, task.token)])
    assert started.attempt == task.attempts + 1
    assert await store.complete(task.bucket, now_ms=at, outcomes=[Outcome(
        task.key, task.token, kind, 200 if kind == "ok" else 503, next_due_ms=next_due_ms,
        started_ms=at)]) == [1]


@pytest.mark.parametrize("limit", [1, 2, 100])
async def test_failed_newest_first_ties_by_key(client: httpx.AsyncClient, store: Store,
                                               limit: int) -> None:
    """The dead letters (v1's meaning of status=failed): newest first, ties by key, descending."""
    at = {"f-a": 1000, "f-b": 2000, "f-c": 2000, "f-d": 3000}
    for key, ms in at.items():
        await add(client, key, START_MS + ms)
    for ms in sorted(set(at.values())):
        await fail_due(store, START_MS + ms)
    assert keys(await pages(client, "failed", limit)) == ["f-d", "f-c", "f-b", "f-a"]


async def test_cursor_round_trip(client: httpx.AsyncClient) -> None:
    """A cursor is opaque, reusable (the same cursor gives the same page) and belongs to its
    listing: a scheduled cursor on the cancelled listing is a 422."""
    for i in range(5):
        await add(client, f"c-{i}", START_MS + i * 1000)
    first = (await client.get("/tasks", params={"status": "scheduled", "limit": 2})).json()
    cursor = first["next_cursor"]
    assert cursor and "c-1" not in cursor
    again = [(await client.get("/tasks", params={"status": "scheduled", "limit": 2,
                                                 "cursor": cursor})).json() for _ in range(2)]
    assert again[0] == again[1]
    assert [t["key"] for t in again[0]["tasks"]] == ["c-2", "c-3"]
    r = await client.get("/tasks", params={"status": "cancelled", "cursor": cursor})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "cursor"]


@pytest.mark.parametrize("params", [
    {}, {"status": "other"}, {"status": "waiting"}, {"status": "scheduled", "limit": 0},
    {"status": "scheduled", "limit": 1001}, {"status": "scheduled", "limit": "ten"},
    {"status": "failed", "cursor": "nope"}, {"status": "failed", "cursor": "17:x"},
    {"status": "scheduled", "key_prefix": "k" * 201},
])
async def test_bad_queries_are_422(client: httpx.AsyncClient, params: dict[str, Any]) -> None:
    r = await client.get("/tasks", params=params)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][0] == "query"


async def test_a_page_reads_a_bounded_number_of_entries(client: httpx.AsyncClient,
                                                        store: Store) -> None:
    """3,000 cancelled tasks whose slice entries wait for the claimer, before three live ones:
    a page looks at no more than its budget per bucket, so the first pages come back short
    (empty) with a cursor; following the cursors finds the three, each once."""
    cancelled = [NewTask(key=f"x-{i:04d}", url=URL, method="POST", headers=[], body=None,
                         due_ms=START_MS + 1000 + i, timeout_ms=10_000, max_attempts=5,
                         backoff_ms=1000, fingerprint="f", flow="127.0.0.1:9")
                 for i in range(3000)]
    assert set(await schedule_many(store, cancelled, START_MS)) == {0}
    for i in range(0, 3000, 100):
        replies = await asyncio.gather(*(store.cancel(t.key, now_ms=START_MS)
                                         for t in cancelled[i:i + 100]))
        assert set(replies) == {1}
    for i in range(3):
        await add(client, f"live-{i}", START_MS + 10_000 + i)
    per_bucket = 3000 / store.keys.buckets
    assert per_bucket > 100  # more than one page's budget (limit 10: 100 per bucket)
    listing = await pages(client, "scheduled", 10)
    assert keys(listing) == ["live-0", "live-1", "live-2"]
    assert listing[0] == [] and len(listing) >= 2
    assert len(listing) <= 3000 // (100 * store.keys.buckets) + 3
    assert MAX_BUDGET <= 1000


async def test_views_show_the_request_and_large_bodies_end_a_page_early(
        client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each listed view carries its headers and body. A page reads at most
    PAGE_REQUEST_BYTES of them: with bodies that pass it, pages end early with a cursor, and
    following the cursors still lists every task once, in due order, each with its body."""
    keys = [f"big-{i:02d}" for i in range(20)]  # more than the 16 buckets: some share one
    for i, key in enumerate(keys):
        r = await client.post("/tasks", json={
            "key": key, "callback_url": URL, "execute_at": (START_MS + i) / 1000,
            "headers": {"X-I": str(i)}, "body": {"i": i, "pad": "x" * 1000}})
        assert r.status_code == 201, r.text
    # The control: with the default budget one page holds all of them.
    whole = await pages(client, "scheduled", 100)
    assert len(whole) == 1 and [v["key"] for v in whole[0]] == keys
    monkeypatch.setattr("timewheel.store.listing.PAGE_REQUEST_BYTES", 3000)
    cut = await pages(client, "scheduled", 100)
    assert len(cut) > 1
    listed = [view for page in cut for view in page]
    assert [v["key"] for v in listed] == keys
    for i, view in enumerate(listed):
        assert view["body"] == {"i": i, "pad": "x" * 1000}
        assert view["headers"] == {"X-I": str(i), "Content-Type": "application/json"}
        assert view["attempts_url"] == f"/tasks/big-{i:02d}/attempts"

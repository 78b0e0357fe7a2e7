"""Bulk jobs end to end (docs/api.md v3, "Bulk jobs"): real `timewheel serve` processes, a real
Redis, a real receiver. A cancel of 50 000 tasks by prefix while other tasks fall due, with
the process running the job SIGKILLed halfway: a second process carries it on, each matching
task is cancelled once, every other task is delivered (none early) or left untouched."""

from __future__ import annotations

import time
from typing import Any

import httpx
from redis import Redis

from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer
from tests.support.waiting import settle
from timewheel.store.keys import Keyspace

MATCHING = 50_000
DUE_DURING = 300  # other tasks, due while the job runs
LATER = 2_000  # other tasks, due after the test, some of them with a key close to the prefix


def create(client: httpx.Client, tasks: list[dict[str, Any]]) -> None:
    for i in range(0, len(tasks), 1000):
        r = client.post("/tasks/batch", json={"tasks": tasks[i:i + 1000]}, timeout=60)
        assert r.status_code == 200, r.text
        assert {item["status"] for item in r.json()["results"]} == {201}


def job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    r = client.get(f"/jobs/{job_id}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def holder_of(services: list[Service], job_id: str) -> Service | None:
    found = [s for s in services if f"bulk job {job_id} " in s.log() and "taken by" in s.log()]
    return found[0] if len(found) == 1 else None


def test_bulk_cancel_of_50k_survives_a_sigkill_and_touches_nothing_else(
        start_service, receiver: ThreadedReceiver, redis_server_e2e: RedisServer) -> None:
    # Small, paced steps: the job lasts long enough to be killed halfway.
    settings = {"job_step_tasks": "200", "job_step_pause_seconds": "0.005",
                "job_lease_seconds": "3", "job_busy_share": "0.5"}
    first = start_service(**settings)
    second = start_service(**settings)  # both up before the job starts
    now = time.time()
    hook = receiver.url("/other")
    matching = [{"key": f"bulk.{i}", "callback_url": receiver.url("/bulk"),
                 "execute_at": now + 3600 + i / 100} for i in range(MATCHING)]
    later = [{"key": f"bulk{i}" if i % 2 else f"keep.{i}", "callback_url": hook,
              "execute_at": now + 3600 + i} for i in range(LATER)]
    with first.client() as client:
        create(client, matching + later)
        # Due from 2 s on, over about 15 s: while the job runs, before and after the kill.
        start_at = time.time() + 2
        due = {f"due.{i}": start_at + i * 0.05 for i in range(DUE_DURING)}
        create(client, [{"key": k, "callback_url": hook, "execute_at": at}
                        for k, at in due.items()])
        r = client.post("/tasks/cancel", json={"key_prefix": "bulk."})
        assert r.status_code == 202, r.text
        job_id = r.json()["job"]
        # One of the two takes the job; kill that one halfway.
        running = settle(lambda: holder_of([first, second], job_id), 20, "a runner")
        survivor = second if running is first else first
    with survivor.client() as client:
        settle(lambda: job(client, job_id)["done"] >= MATCHING // 4, 60, "a quarter done")
        running.kill()
    with survivor.client() as client:
        halfway = job(client, job_id)
        assert halfway["state"] == "running" and halfway["done"] < MATCHING, halfway
        settle(lambda: job(client, job_id)["state"] == "done", 90, "the job done")
        final = job(client, job_id)
        assert (final["matched"], final["done"], final["skipped"]) == (MATCHING, MATCHING, 0)
        assert f"bulk job {job_id} " in survivor.log()  # the survivor carried it on

        # Every other task due meanwhile was delivered, none early; the later ones untouched.
        # Distinct keys, not arrivals: a task the killed process had sent but not recorded is
        # sent again (at-least-once), and one it held unsent only once its lease runs out
        # (its timeout, 30 s by default, plus the lease margin): count keys, wait long enough.
        settle(lambda: {a.headers["webhook-id"] for a in receiver.arrivals_for("/other")}
             >= due.keys(), 120, "every other due task delivered")
        arrivals: dict[str, list[float]] = {}
        for arrival in receiver.arrivals_for("/other"):
            arrivals.setdefault(arrival.headers["webhook-id"], []).append(arrival.received_at)
        assert set(arrivals) == set(due)
        early = {k: min(ts) - due[k] for k, ts in arrivals.items() if min(ts) < due[k]}
        assert early == {}
        assert receiver.arrivals_for("/bulk") == []

    redis = Redis.from_url(redis_server_e2e.url)
    try:
        # Each matching task cancelled, and nothing else: the cancelled index's pages hold
        # them (lua/lib/record.lua), and nothing is in the zset from before pages.
        cancelled: set[str] = set()
        keyspace = Keyspace("tw")
        for bucket in range(keyspace.buckets):
            assert redis.zcard(keyspace.finished(bucket, "cancelled")) == 0
            for start in redis.zrange(keyspace.cancelled_pages(bucket), 0, -1):
                page = keyspace.cancelled_page(bucket, start.decode())
                cancelled |= {k.decode() for k in redis.zrange(page, 0, -1)}
        assert cancelled == {t["key"] for t in matching}
    finally:
        redis.close()
    with survivor.client() as client:
        sample = [t["key"] for t in later[::97]]
        for key in sample:
            view = client.get(f"/tasks/{key}").json()
            assert (view["status"], view["attempts"]) == ("scheduled", 0), view

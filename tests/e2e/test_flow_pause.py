"""Flow pause and what ``waiting`` counts, end to end: real `timewheel serve` processes on one
Redis, a real receiver (docs/api.md v3, "Flows: pause, retry defaults, and what waiting
counts")."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable

import httpx
from redis import Redis

from tests.e2e.conftest import Service
from tests.e2e.test_flows import post_all, scheduled_at
from tests.support.receiver import Reply, ThreadedReceiver
from tests.support.redis_server import RedisServer
from tests.support.waiting import settle


def flow(service: Service, key: str) -> dict[str, object]:
    with service.client() as client:
        response = client.get(f"/flows/{key}")
        assert response.status_code == 200, response.text
        return dict(response.json())


def test_pause_on_one_process_holds_the_flow_on_every_process(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """Paused through the first process, the flow starts nothing on either process while its
    tasks fall due (control: the same tasks in an unpaused flow arrive meanwhile); they wait
    (scheduled, no attempt, counted in ``waiting``). Resumed through the second, every one
    arrives once, as attempt 1, in due order (parallelism 1), none before its time."""
    first, second = start_service(), start_service()
    with first.client() as client:
        for key in ("held", "free"):
            assert client.put(f"/flows/{key}", json={"parallelism": 1}).status_code == 200
        paused = client.post("/flows/held/pause")
        assert paused.status_code == 200 and paused.json()["paused"] is True
    assert flow(second, "held")["paused"] is True

    due = time.time() + 2.0
    keys = [f"held-{i}" for i in range(8)]
    tasks = [{"key": key, "callback_url": receiver.url("/held"), "flow_key": "held",
              "execute_at": due + i * 0.1} for i, key in enumerate(keys)]
    tasks += [{"key": f"free-{i}", "callback_url": receiver.url("/free"), "flow_key": "free",
               "execute_at": due + i * 0.1} for i in range(8)]
    post_all(first, tasks[::2])
    post_all(second, tasks[1::2])

    receiver.wait_for_sync(8, timeout=30, path="/free")  # control: due, and delivered
    # Every held task is due and waits, in a process or parked, counted over both processes.
    settle(lambda: flow(first, "held")["waiting"] == 8, 15, "8 held tasks waiting")
    assert receiver.arrivals_for("/held") == []
    with second.client() as client:
        views = [client.get(f"/tasks/{key}").json() for key in keys]
    # Not failed, no attempt: parked ("scheduled"), or still claimed in a process until its
    # next permits call learns of the pause ("delivering", as any claimed task; docs/design.md,
    # Pause).
    assert {v["attempts"] for v in views} == {0}
    assert {v["status"] for v in views} <= {"scheduled", "delivering"}

    # Due order across processes is kept by Redis, for parked tasks (lua/unpark.lua takes the
    # earliest first); waiters still in two processes' memory would race for the one permit.
    # A paused flow's waiters park at once (the gate's next permits call): the resume comes
    # once every held task has.
    def all_parked() -> bool:
        with second.client() as client:
            return all(client.get(f"/tasks/{key}").json()["status"] == "scheduled"
                       for key in keys)
    settle(all_parked, 30, "every held task parked in Redis")
    with second.client() as client:
        resumed = client.post("/flows/held/resume")
        assert resumed.status_code == 200 and resumed.json()["paused"] is False
    receiver.wait_for_sync(8, timeout=30, path="/held")
    held = receiver.arrivals_for("/held")
    assert [a.headers["webhook-id"] for a in held] == keys  # due order
    assert Counter(a.headers["timewheel-attempt"] for a in held) == {"1": 8}
    assert all(a.received_at >= scheduled_at(a.headers) for a in held), "one came early"
    settle(lambda: flow(first, "held")["waiting"] == 0, 15, "nothing waiting after resume")


def test_waiting_is_the_backlog_over_both_processes(
        start_service: Callable[..., Service], receiver: ThreadedReceiver,
        redis_server_e2e: RedisServer) -> None:
    """Issue #21's new user: 20 tasks behind parallelism 1, each callback slow. ``waiting``
    equals the true backlog (20 minus those the receiver has seen) while the tasks wait in
    the memory of two processes: the first claims 10 while the second is stopped, the second
    the other 10 while the first is. A long lease margin keeps them in memory (not parked):
    counting only parked tasks says 0 here."""
    settings = {"lease_margin_seconds": "60"}
    first, second = start_service(**settings), start_service(**settings)
    with first.client() as client:
        assert client.put("/flows/slow", json={"parallelism": 1}).status_code == 200
    receiver.respond("/slow", [Reply(200, delay=2.0)])
    keys = [f"s-{i:02d}" for i in range(20)]

    def claimed_all(service: Service, batch: list[str]) -> bool:
        with service.client() as client:
            return all(client.get(f"/tasks/{key}").json()["status"] == "delivering"
                       for key in batch)

    for mine, other, batch in ((first, second, keys[:10]), (second, first, keys[10:])):
        other.signal(signal.SIGSTOP)
        try:
            post_all(mine, [{"key": key, "callback_url": receiver.url("/slow"),
                             "flow_key": "slow"} for key in batch])
            settle(lambda m=mine, b=batch: claimed_all(m, b), 15, "the batch claimed")
        finally:
            other.signal(signal.SIGCONT)

    redis = Redis.from_url(redis_server_e2e.url)
    try:
        def consistent() -> tuple[int, int] | None:
            """(arrived, live reports) when GET /flows and the gauge both say 20 - arrived."""
            seen = len(receiver.arrivals_for("/slow"))
            waiting = flow(first, "slow")["waiting"]
            with httpx.Client(base_url=second.base_url) as client:
                gauge = _gauge(client.get("/metrics").text, 'timewheel_flow_waiting{flow="slow"}')
            live = redis.zcard("{tw:wl}:live")
            if len(receiver.arrivals_for("/slow")) == seen and waiting == gauge == 20 - seen:
                return seen, int(live)
            return None

        seen, live = settle(consistent, 20, "waiting == 20 - arrived")
        assert seen < 20 and live == 2  # some still waited, in both processes
        assert flow(second, "slow")["in_flight"] == 1
        receiver.wait_for_sync(seen + 2, timeout=30, path="/slow")  # still true later
        settle(consistent, 20, "waiting == 20 - arrived, two callbacks later")
    finally:
        redis.close()


def _gauge(metrics: str, series: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None

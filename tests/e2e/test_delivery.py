"""Delivery end to end: real `timewheel serve` processes, a real Redis, a real receiver.

Retries and backoff, timeouts, permanent failures and replay, exhausted attempts, and the
faults of docs/api.md / docs/design.md: a process killed or stopped mid-delivery, SIGTERM with
attempts in flight, Redis killed and restarted from its append-only file.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterable
from typing import Any, TypeVar

import httpx
import pytest

from tests.e2e.conftest import Service
from tests.support.receiver import Arrival, Reply, ThreadedReceiver
from tests.support.redis_server import RedisServer
from tests.support.waiting import settle
from timewheel.store import layout
from timewheel.store.keys import INDEX_KEEPER, Keyspace

pytestmark = pytest.mark.e2e

T = TypeVar("T")
KEYS = Keyspace("tw")
# Receiver (time.time) and service (Redis TIME through a monotonic offset) read the same host
# clock; the service's estimate may lag by a round trip. Lower bounds allow this much slack.
# A lower bound on the spacing of attempts is the contract "never early" (a retry never comes
# before its backoff has passed): an ordering of two events, not a timing; no test here bounds
# how late an attempt may come (that is bench/'s).
CLOCK_SLACK = 0.02


# -- helpers ---------------------------------------------------------------------------------



def schedule(client: httpx.Client, url: str, key: str, **fields: Any) -> dict[str, Any]:
    resp = client.post("/tasks", json={"key": key, "callback_url": url, **fields})
    assert resp.status_code == 201, resp.text
    assert resp.headers["location"] == f"/tasks/{key}"
    return resp.json()  # type: ignore[no-any-return]


def view(client: httpx.Client, key: str) -> dict[str, Any]:
    resp = client.get(f"/tasks/{key}")
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def wait_status(client: httpx.Client, keys: Iterable[str], status: str,
                timeout: float = 30.0) -> dict[str, dict[str, Any]]:
    """Wait until every task has ``status``; return their views."""
    keys = list(keys)

    def probe() -> dict[str, dict[str, Any]] | None:
        views = {key: view(client, key) for key in keys}
        done = all(v["status"] == status for v in views.values())
        return views if done else None

    return settle(probe, timeout, f"{len(keys)} task(s) {status}")


def attempt_numbers(arrivals: list[Arrival]) -> list[str]:
    return [a.headers["timewheel-attempt"] for a in arrivals]


def by_key(arrivals: list[Arrival]) -> dict[str, list[Arrival]]:
    grouped: dict[str, list[Arrival]] = {}
    for arrival in arrivals:
        grouped.setdefault(arrival.headers["webhook-id"], []).append(arrival)
    return grouped


def raw_task(server: RedisServer, key: str) -> dict[str, str]:
    """The task's record straight from Redis (for moments when no service is up), decoded
    from its packed string (timewheel/store/layout.py): status, attempts, and claim and
    started only while they are set."""
    with server.client() as conn:
        raw = conn.get(KEYS.task(key))
    assert raw is not None, key
    record = layout.decode(raw)
    st = record["st"].decode() if isinstance(record["st"], bytes) else record["st"]
    out = {"status": layout.STATUS_NAMES[st], "attempts": str(record["att"])}
    if record["claim"] != layout.NONE:
        out["claim"] = record["claim"].hex()
    if record["started"]:
        out["started"] = "1"
    return out


def leased(server: RedisServer) -> dict[str, float]:
    """Every lease entry of the wheel: task key -> lease expiry ms."""
    out: dict[str, float] = {}
    with server.client() as conn:
        for bucket in range(KEYS.buckets):
            for member, score in conn.zrange(KEYS.lease(bucket), 0, -1, withscores=True):
                if member != INDEX_KEEPER.encode():
                    out[member.decode()] = score
    return out


def dropped_in_log(service: Service, keys: Iterable[str]) -> bool:
    text = service.log_path.read_text(errors="replace")
    return all(f"outcome of {key} dropped" in text for key in keys)


# -- outcomes of attempts --------------------------------------------------------------------

def test_retries_with_backoff_until_success(start_service, receiver: ThreadedReceiver) -> None:
    """500, 503, then 200: three attempts spaced by the doubling backoff, one webhook-id."""
    service = start_service()
    receiver.respond("/retry", [500, 503, 200])
    with service.client() as client:
        schedule(client, receiver.url("/retry"), "retry-1", retry_backoff=0.5)
        final = wait_status(client, ["retry-1"], "succeeded")["retry-1"]

    hits = receiver.arrivals_for("/retry")
    assert len(hits) == 3
    assert [a.headers["webhook-id"] for a in hits] == ["retry-1"] * 3
    assert attempt_numbers(hits) == ["1", "2", "3"]
    # Never early (an ordering, not a timing): each retry after the one before + its backoff.
    assert hits[1].received_at - hits[0].received_at >= 0.5 - CLOCK_SLACK
    assert hits[2].received_at - hits[1].received_at >= 1.0 - CLOCK_SLACK
    assert final["attempts"] == 3
    assert final["max_attempts"] == 5
    assert final["last_status_code"] == 200
    assert final["last_error"] is None
    assert final["next_attempt_at"] is None
    assert final["finished_at"] is not None


def test_hanging_receiver_times_out_and_is_retried(start_service,
                                                   receiver: ThreadedReceiver) -> None:
    """A receiver silent past the task's timeout: the attempt times out and is retried."""
    service = start_service()
    receiver.respond("/hang", [Reply(200, delay=5)])
    with service.client() as client:
        schedule(client, receiver.url("/hang"), "hang-1", timeout=1, max_attempts=2,
                 retry_backoff=0.2)
        final = wait_status(client, ["hang-1"], "failed")["hang-1"]

    hits = receiver.arrivals_for("/hang")
    assert attempt_numbers(hits) == ["1", "2"]
    assert {a.headers["webhook-id"] for a in hits} == {"hang-1"}
    # Never early (an ordering, not a timing): the second attempt came after the first one's
    # timeout (1 s) and the backoff (0.2 s) had both passed.
    assert hits[1].received_at - hits[0].received_at >= 1.2 - CLOCK_SLACK
    assert final["attempts"] == 2
    assert final["last_status_code"] is None
    assert final["last_error"] is not None and "timeout" in final["last_error"]


def test_permanent_failure_is_dead_lettered_and_replayed(start_service,
                                                         receiver: ThreadedReceiver) -> None:
    """400 fails at once into the dead letters; replay after the fix delivers it."""
    service = start_service()
    receiver.respond("/bad", [400])
    with service.client() as client:
        schedule(client, receiver.url("/bad"), "bad-1")
        failed = wait_status(client, ["bad-1"], "failed")["bad-1"]
        assert failed["attempts"] == 1
        assert failed["last_status_code"] == 400
        assert failed["last_error"] == "HTTP 400"
        assert failed["finished_at"] is not None
        assert len(receiver.arrivals_for("/bad")) == 1

        listed = client.get("/tasks", params={"status": "failed"})
        assert listed.status_code == 200
        assert listed.json() == {"tasks": [failed], "next_cursor": None}

        receiver.respond("/bad", [200])
        replayed = client.post("/tasks/bad-1/replay")
        assert replayed.status_code == 200
        # Read right after the script: a tick may already have claimed it, not started it.
        assert replayed.json()["status"] in ("scheduled", "delivering")
        assert replayed.json()["attempts"] == 0
        assert replayed.json()["finished_at"] is None

        final = wait_status(client, ["bad-1"], "succeeded")["bad-1"]
        assert final["attempts"] == 1
        assert final["last_status_code"] == 200
        assert final["last_error"] is None
        empty = client.get("/tasks", params={"status": "failed"}).json()
        assert empty == {"tasks": [], "next_cursor": None}

    hits = receiver.arrivals_for("/bad")
    assert attempt_numbers(hits) == ["1", "1"]  # replay resets the attempts
    assert {a.headers["webhook-id"] for a in hits} == {"bad-1"}


def test_exhausted_attempts_fail_with_exactly_max_attempts(start_service,
                                                           receiver: ThreadedReceiver) -> None:
    """Always 503 with max_attempts=3: exactly three requests, then `failed`, and no fourth.
    Control: the same task allowed four attempts, scheduled once the first has failed, gets
    its fourth (so the wait is long enough for one to come)."""
    service = start_service()
    receiver.respond("/down", [503])
    receiver.respond("/control", [503])
    with service.client() as client:
        schedule(client, receiver.url("/down"), "down-1", max_attempts=3, retry_backoff=0.1)
        final = wait_status(client, ["down-1"], "failed")["down-1"]
        assert final["attempts"] == 3
        assert final["last_status_code"] == 503
        assert final["last_error"] == "HTTP 503"
        listed = client.get("/tasks", params={"status": "failed"}).json()
        assert listed["tasks"] == [final]  # exactly it among the dead letters
        # A fourth attempt of down-1 would be due 0.4 s after its third (backoff doubled); the
        # control's fourth is due 0.1 + 0.2 + 0.4 s (never early) after it starts, later.
        schedule(client, receiver.url("/control"), "control-1", max_attempts=4,
                 retry_backoff=0.1)
        wait_status(client, ["control-1"], "failed")
        assert view(client, "down-1") == final
        assert attempt_numbers(receiver.arrivals_for("/control")) == ["1", "2", "3", "4"]

    hits = receiver.arrivals_for("/down")
    assert attempt_numbers(hits) == ["1", "2", "3"]


# -- process faults --------------------------------------------------------------------------

def test_sigkill_mid_delivery_loses_nothing(start_service, receiver: ThreadedReceiver,
                                            redis_server_e2e: RedisServer) -> None:
    """A process killed with 20 attempts in flight: another one re-delivers all 20 after the
    lease, with the next attempt number, and each ends succeeded."""
    keys = [f"crash-{i}" for i in range(20)]
    receiver.respond("/crash", [Reply(200, delay=10)])
    first = start_service()
    at = time.time() + 1.5  # one shared due time: all 20 go out together
    with first.client() as client:
        for key in keys:
            schedule(client, receiver.url("/crash"), key, execute_at=at, timeout=3)
    receiver.wait_for_sync(20, timeout=15, path="/crash")
    first.kill()
    receiver.respond("/crash", [200])

    # The kill left every task claimed, started and leased: only the lease can free them.
    for key in keys:
        record = raw_task(redis_server_e2e, key)
        assert (record["status"], record["attempts"]) == ("delivering", "1"), key
        assert record["claim"] and record["started"], key
    assert sorted(leased(redis_server_e2e)) == sorted(keys)

    second = start_service()
    with second.client() as client:
        views = wait_status(client, keys, "succeeded", timeout=30)
    assert {key: (v["attempts"], v["last_status_code"]) for key, v in views.items()} == (
        dict.fromkeys(keys, (2, 200)))
    grouped = by_key(receiver.arrivals_for("/crash"))
    assert {key: attempt_numbers(hits) for key, hits in grouped.items()} == {
        key: ["1", "2"] for key in keys}
    assert leased(redis_server_e2e) == {}


def test_stopped_process_cannot_overwrite_outcomes(start_service, receiver: ThreadedReceiver,
                                                   redis_server_e2e: RedisServer) -> None:
    """SIGSTOP a process holding attempts past their lease; another one finishes them; after
    SIGCONT the stale process's outcomes are refused: no view changes, nothing is re-sent."""
    keys = [f"stall-{i}" for i in range(6)]
    paths = {key: f"/stall/{i}" for i, key in enumerate(keys)}
    for i, key in enumerate(keys):
        # First attempt: half never answer (the stale process will time out), half answer 200
        # while it is stopped (it may see the 200). The second attempt is answered at once.
        receiver.respond(paths[key], [Reply(200, delay=30 if i % 2 else 2.5), 200])
    stalled = start_service()
    at = time.time() + 1.5
    with stalled.client() as client:
        for key in keys:
            schedule(client, receiver.url(paths[key]), key, execute_at=at, timeout=3)
    settle(lambda: len(receiver.arrivals) >= len(keys), 15, "first attempts in flight")
    stalled.signal(signal.SIGSTOP)
    for key in keys:  # stopped while the attempts were in flight
        assert raw_task(redis_server_e2e, key)["status"] == "delivering", key

    finisher = start_service()  # starts after the stop: it can only get the tasks via leases
    with finisher.client() as client:
        finished = wait_status(client, keys, "succeeded", timeout=30)
        assert {key: (v["attempts"], v["last_status_code"])
                for key, v in finished.items()} == dict.fromkeys(keys, (2, 200))

        stalled.signal(signal.SIGCONT)

        def refused() -> bool:
            assert {key: view(client, key) for key in keys} == finished  # never flips
            return dropped_in_log(stalled, keys)

        settle(refused, 20, "the stale process to report its outcomes dropped")
    # The stale process alone from here: what is sent now, it sent.
    assert finisher.stop() == 0
    with stalled.client() as client:
        # Control: a task due in 2.5 s (a tick and room), sent by the stale process (it does
        # send what it may); until then nothing is re-sent or rewritten.
        schedule(client, receiver.url("/stall/control"), "stall-control",
                 execute_at=time.time() + 2.5)
        receiver.wait_for_sync(1, timeout=30, path="/stall/control")
        assert {key: view(client, key) for key in keys} == finished
        assert len(receiver.arrivals_for("/stall/control")) == 1

    assert stalled.process is not None and stalled.process.poll() is None
    for key in keys:
        hits = receiver.arrivals_for(paths[key])
        assert attempt_numbers(hits) == ["1", "2"], key
        assert {a.headers["webhook-id"] for a in hits} == {key}
    assert leased(redis_server_e2e) == {}


def test_sigterm_finishes_in_flight_and_hands_back_the_rest(
        start_service, receiver: ThreadedReceiver, redis_server_e2e: RedisServer) -> None:
    """SIGTERM with 5 attempts in flight and 5 claimed waiting for a slot: the in-flight ones
    are finished, the waiting ones handed back, the process shuts down gracefully; a second
    process delivers the rest; every task is delivered exactly once."""
    keys = [f"term-{i}" for i in range(10)]
    receiver.respond("/term", [Reply(200, delay=2)])
    first = start_service(batch_deadline_seconds="10", max_concurrency="5")
    at = time.time() + 1.5
    with first.client() as client:
        for key in keys:
            schedule(client, receiver.url("/term"), key, execute_at=at, timeout=5)
    receiver.wait_for_sync(5, timeout=15, path="/term")
    first.signal(signal.SIGTERM)
    code = first.stop(timeout=30)
    # A graceful exit; its exit status (0 per docs/api.md) is test_sigterm_exit_status_is_zero's.
    assert code == 0, first.log()
    assert "Application shutdown complete" in first.log()

    sent = {a.headers["webhook-id"] for a in receiver.arrivals_for("/term")}
    assert len(sent) == 5
    records = {key: raw_task(redis_server_e2e, key) for key in keys}
    assert {key: (r["status"], r["attempts"]) for key, r in records.items()} == {
        key: ("succeeded", "1") if key in sent else ("scheduled", "0") for key in keys}
    assert not any("claim" in r for r in records.values())
    assert leased(redis_server_e2e) == {}

    receiver.respond("/term", [200])
    second = start_service()
    with second.client() as client:
        views = wait_status(client, keys, "succeeded")
    assert {key: v["attempts"] for key, v in views.items()} == dict.fromkeys(keys, 1)
    grouped = by_key(receiver.arrivals_for("/term"))
    assert {key: attempt_numbers(hits) for key, hits in grouped.items()} == {
        key: ["1"] for key in keys}


def test_sigterm_exit_status_is_zero(start_service, receiver: ThreadedReceiver,
                                     redis_server_e2e: RedisServer) -> None:
    """docs/api.md: SIGTERM with an attempt in flight finishes it and exits with status 0."""
    receiver.respond("/bye", [Reply(200, delay=1)])
    service = start_service(batch_deadline_seconds="10")
    with service.client() as client:
        schedule(client, receiver.url("/bye"), "bye-1", timeout=5)
    receiver.wait_for_sync(1, timeout=15, path="/bye")
    service.signal(signal.SIGTERM)
    code = service.stop(timeout=30)
    assert raw_task(redis_server_e2e, "bye-1")["status"] == "succeeded"
    assert code == 0, service.log()


def test_sigterm_stops_claiming_while_an_api_request_is_still_open(
        start_service, receiver: ThreadedReceiver, redis_server_e2e: RedisServer) -> None:
    """docs/deploy.md: "On SIGTERM a `timewheel serve` process stops claiming". uvicorn first
    waits for the API connections with a request under way (a slow upload, up to the batch
    deadline + 5 s) and only then runs the lifespan's shutdown: a process that kept ticking
    meanwhile claimed and sent tasks after its SIGTERM, and the attempts it started late could
    run past the grace period (35 s of waiting + a 30 s deadline against docs/deploy.md's 45 s)."""
    receiver.respond("/late", [200])
    service = start_service(batch_deadline_seconds="10")
    with service.client() as client:
        # Due after the SIGTERM, beyond a tick's look-ahead: not claimed before it.
        schedule(client, receiver.url("/late"), "late-1", delay=4)
    upload = socket.create_connection(("127.0.0.1", service.port))
    try:
        body = b'{"key": "slow-upload", "callback_url": "http://127.0.0.1:9/x"}'
        upload.sendall(b"POST /tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:10]))
        time.sleep(0.3)  # the head is read: a request under way
        service.signal(signal.SIGTERM)
        time.sleep(6.5)  # past the task's due time, the upload still open
        assert receiver.arrivals_for("/late") == [], "claimed and sent after its SIGTERM"
    finally:
        upload.close()
    code = service.stop(timeout=60)
    assert code == 0, service.log()
    record = raw_task(redis_server_e2e, "late-1")
    assert record["status"] == "scheduled" and "claim" not in record, record


# -- Redis faults ----------------------------------------------------------------------------

def test_redis_crash_and_restart_keeps_acknowledged_tasks(
        start_service, receiver: ThreadedReceiver, redis_server_e2e: RedisServer) -> None:
    """Redis SIGKILLed right after the last 201 and restarted from its AOF: every acknowledged
    task still fires, and the same service process recovers by itself."""
    keys = [f"aof-{i}" for i in range(50)]
    service = start_service()
    at = time.time() + 4
    with service.client() as client:
        for key in keys:
            schedule(client, receiver.url("/aof"), key, execute_at=at)
        redis_server_e2e.kill()
        assert client.get("/healthz").status_code == 503
        redis_server_e2e.restart()

        receiver.wait_for_sync(50, timeout=30, path="/aof")
        views = wait_status(client, keys, "succeeded")
        assert client.get("/healthz").status_code == 200

    assert {key: (v["attempts"], v["last_status_code"]) for key, v in views.items()} == (
        dict.fromkeys(keys, (1, 200)))
    grouped = by_key(receiver.arrivals_for("/aof"))
    assert {key: attempt_numbers(hits) for key, hits in grouped.items()} == {
        key: ["1"] for key in keys}
    assert service.process is not None and service.process.poll() is None

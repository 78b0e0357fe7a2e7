"""End to end: real `timewheel serve` processes, a real Redis and a real local receiver.

Time assertions here are ordering invariants only (a callback never arrives before its
`execute_at`); every wait is a bounded poll for a condition, never a speed limit.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.receiver import Arrival, Reply, ThreadedReceiver
from tests.support.waiting import settle
from timewheel import __version__

pytestmark = pytest.mark.e2e
log = logging.getLogger(__name__)

USER_AGENT = f"timewheel/{__version__}"


# -- helpers ------------------------------------------------------------------------------------



def ahead_ms(seconds: float) -> int:
    """Epoch milliseconds `seconds` from now (the host's clock, which is Redis's here)."""
    return int((time.time() + seconds) * 1000)


def rfc3339(ms: int) -> str:
    moment = datetime.fromtimestamp(ms // 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def task_body(receiver: ThreadedReceiver, path: str, due_ms: int, **extra: Any) -> dict[str, Any]:
    """A request body firing at `due_ms`, given as epoch seconds with milliseconds."""
    return {"callback_url": receiver.url(path), "execute_at": due_ms / 1000, **extra}


def schedule(client: httpx.Client, key: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/tasks", json={"key": key, **body})
    assert response.status_code == 201, response.text
    assert response.headers["location"] == f"/tasks/{key}"
    view: dict[str, Any] = response.json()
    assert view["key"] == key and view["status"] == "scheduled"
    return view


def get_view(client: httpx.Client, key: str) -> dict[str, Any]:
    response = client.get(f"/tasks/{key}")
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def wait_finished(client: httpx.Client, key: str, timeout: float = 15) -> dict[str, Any]:
    """The view once the outcome is stored (the callback arrives before it is recorded)."""
    seen: dict[str, Any] = {}

    def finished() -> bool:
        seen.update(get_view(client, key))
        return seen["status"] in ("succeeded", "failed", "cancelled")

    settle(finished, timeout, f"task {key} finished (last seen {seen})")
    return seen


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    """Sum of the samples of `name` (exact sample name) matching `labels` in /metrics."""
    response = client.get("/metrics")
    assert response.status_code == 200
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$")
    for line in response.text.splitlines():
        match = pattern.match(line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def by_webhook_id(arrivals: list[Arrival]) -> Counter[str]:
    return Counter(a.headers["webhook-id"] for a in arrivals)


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


# -- tests --------------------------------------------------------------------------------------

def test_task_fires_once_on_time_with_method_headers_and_body(start_service, receiver) -> None:
    """A PATCH with custom headers and a JSON body arrives once, never before execute_at, with
    every contract header; a string body with its own Content-Type is sent as is."""
    service = start_service()
    due = ahead_ms(2.0)
    payload = {"order": 42, "items": ["a", "b"], "note": "Zoë", "nested": {"ok": True}}
    raw = "id,name\n1,Zoë\n"
    with service.client() as client:
        schedule(client, "json-task", task_body(
            receiver, "/orders/42", due, method="patch", body=payload,
            headers={"X-Trace-Id": "trace-123", "Authorization": "Bearer for-the-receiver"}))
        schedule(client, "raw-task", task_body(
            receiver, "/raw", due, body=raw, headers={"Content-Type": "text/csv; charset=utf-8"}))
        receiver.wait_for_sync(2, timeout=20)
        json_view = wait_finished(client, "json-task")
        raw_view = wait_finished(client, "raw-task")

    arrivals = receiver.arrivals
    assert sorted(a.path for a in arrivals) == ["/orders/42", "/raw"]
    hit = receiver.arrivals_for("/orders/42")[0]
    assert hit.received_at * 1000 >= due  # never early
    assert hit.method == "PATCH"
    assert hit.headers["x-trace-id"] == "trace-123"
    assert hit.headers["authorization"] == "Bearer for-the-receiver"
    assert hit.headers["webhook-id"] == "json-task"
    assert hit.headers["timewheel-attempt"] == "1"
    assert hit.headers["timewheel-scheduled-at"] == rfc3339(due)
    assert hit.headers["user-agent"] == USER_AGENT
    assert hit.headers["content-type"] == "application/json"
    assert "webhook-signature" not in hit.headers  # no signing secret configured
    stamp = int(hit.headers["webhook-timestamp"])
    assert due // 1000 <= stamp <= hit.received_at
    assert hit.body == json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    assert json.loads(hit.body) == payload

    plain = receiver.arrivals_for("/raw")[0]
    assert plain.received_at * 1000 >= due
    assert plain.method == "POST"
    assert plain.headers["content-type"] == "text/csv; charset=utf-8"
    assert plain.headers["webhook-id"] == "raw-task"
    assert plain.body == raw.encode()

    requests = {
        "/orders/42": ({"X-Trace-Id": "trace-123", "Authorization": "Bearer for-the-receiver",
                        "Content-Type": "application/json"}, payload),
        "/raw": ({"Content-Type": "text/csv; charset=utf-8"}, raw)}
    for view, path, method in ((json_view, "/orders/42", "PATCH"), (raw_view, "/raw", "POST")):
        assert view | {"created_at": None, "last_attempt_at": None, "finished_at": None} == {
            "key": view["key"], "status": "succeeded", "execute_at": rfc3339(due),
            "callback_url": receiver.url(path), "method": method, "attempts": 1,
            "max_attempts": 5, "next_attempt_at": None, "last_attempt_at": None,
            "last_status_code": 200, "last_error": None, "created_at": None, "finished_at": None,
            "headers": requests[path][0], "body": requests[path][1], "timeout": 10.0,
            "retry_backoff": 1.0, "flow_key": f"127.0.0.1:{receiver.port}",
            "attempts_url": f"/tasks/{view['key']}/attempts", "on_success": None,
            "on_failure": None,
        }
        assert view["last_attempt_at"] >= rfc3339(due)
        assert view["finished_at"] >= view["last_attempt_at"]
    assert len(receiver.arrivals) == 2  # still exactly one each


def test_sigkill_with_embedded_redis_then_restart_fires_every_task(
        start_service, receiver, tmp_path: Path) -> None:
    """SIGKILL a service (embedded Redis) holding 20 pending tasks; a new service on the same
    data dir restarts cleanly and fires each of them, late but exactly once."""
    first = start_service(redis_url=None)
    pid_file = tmp_path / "data" / "redis.pid"
    old_redis_pid = int(pid_file.read_text().strip())
    dues = {f"crash-{i:02d}": ahead_ms(3.0 + 3.0 * i / 19) for i in range(20)}
    with first.client() as client:
        for key, due in dues.items():
            schedule(client, key, task_body(receiver, f"/crash/{key}", due, body={"k": key}))
        claimed_before_kill = metric(client, "timewheel_tasks_claimed_total")
    first.kill()
    try:
        # The orphaned redis-server must not outlive its service (it would hold the AOF).
        settle(lambda: not pid_alive(old_redis_pid), 15,
                   f"embedded redis-server {old_redis_pid} exits after its service was killed")
        last_due = max(dues.values())
        settle(lambda: time.time() * 1000 > last_due + 500, 15, "every task is overdue")
        assert receiver.arrivals == []  # nobody was running to fire them

        second = start_service(redis_url=None)
        new_redis_pid = int(pid_file.read_text().strip())
        assert new_redis_pid != old_redis_pid and pid_alive(new_redis_pid)
        receiver.wait_for_sync(len(dues), timeout=30)
        with second.client() as client:
            views = {key: wait_finished(client, key) for key in dues}
    finally:
        if pid_alive(old_redis_pid):  # only on failure: never leave the orphan running
            os.kill(old_redis_pid, signal.SIGKILL)

    counts = by_webhook_id(receiver.arrivals)
    assert set(counts) == set(dues)
    duplicates = {key: n for key, n in counts.items() if n > 1}
    if claimed_before_kill == 0:
        assert duplicates == {}  # nothing was claimed before the crash: exactly once
    elif duplicates:
        log.warning("at-least-once duplicates after the crash (claimed %d before it): %s",
                    claimed_before_kill, duplicates)
    for arrival in receiver.arrivals:
        key = arrival.headers["webhook-id"]
        assert arrival.path == f"/crash/{key}"
        assert arrival.received_at * 1000 >= dues[key]
        assert arrival.headers["timewheel-scheduled-at"] == rfc3339(dues[key])
        assert json.loads(arrival.body) == {"k": key}
    for key, view in views.items():
        assert (view["status"], view["last_status_code"], view["execute_at"]) == (
            "succeeded", 200, rfc3339(dues[key]))
        assert view["attempts"] == counts[key]
    assert second.stop() == 0
    settle(lambda: not pid_alive(new_redis_pid), 15, "the embedded Redis stops with it")


def test_two_processes_share_one_redis_and_deliver_each_task_once(
        start_service, receiver) -> None:
    """Two services on one Redis fire 500 tasks: every webhook-id arrives exactly once, every
    task succeeded on its first attempt, and the claims of both add up to 500."""
    services = [start_service(), start_service()]
    base = ahead_ms(3.0)
    dues = {f"pair-{i:03d}": base + i * 4 for i in range(500)}  # spread over 2 s
    clients = [service.client() for service in services]
    try:
        # Posted by 8 threads (httpx.Client is thread-safe), alternating between the two
        # processes (any of them accepts tasks), so the posting ends before the first is due.
        def post(item: tuple[int, tuple[str, int]]) -> None:
            n, (key, due) = item
            schedule(clients[n % 2], key, task_body(receiver, "/pair", due))

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(post, enumerate(dues.items())))
        receiver.wait_for_sync(len(dues), timeout=40)

        def succeeded() -> float:
            return sum(metric(c, "timewheel_callbacks_total", outcome="succeeded")
                       for c in clients)

        settle(lambda: succeeded() >= len(dues), 20, "every outcome recorded")

        def claim_counts() -> list[float]:
            return [metric(c, "timewheel_tasks_claimed_total") for c in clients]

        dropped = sum(metric(c, "timewheel_claims_dropped_total") for c in clients)
        # The claim counter is bumped after a tick's claims; wait for the last tick to count.
        settle(lambda: sum(claim_counts()) == len(dues) + dropped, 10,
                   f"claims {claim_counts()} add up to {len(dues)} + {dropped} handed back")
        views = [get_view(clients[0], key) for key in dues]
        assert succeeded() == len(dues)  # no task was sent twice
        split = claim_counts()
    finally:
        for client in clients:
            client.close()

    counts = by_webhook_id(receiver.arrivals)
    assert set(counts) == set(dues)
    assert {key: n for key, n in counts.items() if n != 1} == {}
    assert len(receiver.arrivals) == len(dues)
    for arrival in receiver.arrivals:
        assert arrival.received_at * 1000 >= dues[arrival.headers["webhook-id"]]
    assert {(v["status"], v["attempts"], v["last_status_code"]) for v in views} == {
        ("succeeded", 1, 200)}
    # Which process claims what depends on the phase of their tickers: a lopsided split is
    # legitimate, so only the sum is asserted; the split is logged.
    log.info("claims per process: %s (handed back: %s)", split, dropped)


def test_cancelled_task_never_fires_and_rescheduled_one_fires_at_new_time(
        start_service, receiver) -> None:
    """DELETE before its time: the task never arrives. PUT to a later time: it arrives once,
    at or after the new time."""
    service = start_service()
    old_due = ahead_ms(2.5)
    with service.client() as client:
        schedule(client, "doomed", task_body(receiver, "/doomed", old_due))
        schedule(client, "moved", task_body(receiver, "/moved", old_due))
        assert client.delete("/tasks/doomed").status_code == 204
        new_due = old_due + 2000
        replaced = client.put("/tasks/moved", json=task_body(receiver, "/moved", new_due))
        assert replaced.status_code == 200, replaced.text
        assert replaced.json()["execute_at"] == rfc3339(new_due)

        receiver.wait_for_sync(1, timeout=20, path="/moved")
        moved = wait_finished(client, "moved")
        doomed = get_view(client, "doomed")
        again = client.delete("/tasks/doomed")
        assert again.status_code == 409
        assert again.json()["status"] == "cancelled"

    assert [a.path for a in receiver.arrivals] == ["/moved"]
    arrival = receiver.arrivals[0]
    assert arrival.received_at * 1000 >= new_due
    assert arrival.headers["timewheel-scheduled-at"] == rfc3339(new_due)
    assert (moved["status"], moved["attempts"], moved["execute_at"]) == (
        "succeeded", 1, rfc3339(new_due))
    assert (doomed["status"], doomed["attempts"], doomed["last_attempt_at"]) == (
        "cancelled", 0, None)
    assert doomed["finished_at"] is not None


def test_a_callback_awaiting_its_answer_counts_in_flight_until_answered(
        start_service, receiver) -> None:
    """/stats and /metrics count the attempt whose request is out and unanswered, and stop
    counting it once it is answered (both read the dispatcher's books when asked)."""
    receiver.respond("/slow", [Reply(200, delay=3.0)])
    service = start_service()
    with service.client() as client:
        schedule(client, "slow-1", task_body(receiver, "/slow", ahead_ms(0.5)))
        receiver.wait_for_sync(1, timeout=20, path="/slow")
        assert client.get("/stats").json()["in_flight"] == 1
        assert metric(client, "timewheel_callbacks_in_flight") == 1
        assert wait_finished(client, "slow-1")["status"] == "succeeded"
        assert client.get("/stats").json()["in_flight"] == 0
        assert metric(client, "timewheel_callbacks_in_flight") == 0


def test_sigterm_on_idle_service_exits_zero(start_service) -> None:
    """SIGTERM on an idle service: a clean shutdown with exit code 0."""
    service = start_service()
    service.signal(signal.SIGTERM)
    code = service.stop(timeout=60)
    log_text = service.log()
    assert "Application shutdown complete." in log_text  # the lifespan's close() ran
    assert "Traceback" not in log_text
    assert code == 0

"""Flow control end to end: real `timewheel serve` processes on one Redis, real receivers.

Limits hold over both processes together; a hanging destination makes only its own tasks
wait; a process killed while holding permits gives them back with their leases."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

from tests.e2e.conftest import Service
from tests.support.receiver import Reply, ThreadedReceiver
from tests.support.waiting import settle


def post_all(service: Service, tasks: list[dict[str, object]]) -> None:
    """Create the tasks through POST /tasks/batch (quick: the due times stay ahead)."""
    with service.client() as client:
        for i in range(0, len(tasks), 1000):
            response = client.post("/tasks/batch", json={"tasks": tasks[i:i + 1000]})
            assert response.status_code == 200, response.text
            assert {r["status"] for r in response.json()["results"]} == {201}, response.text


def scheduled_at(arrival_headers: dict[str, str]) -> float:
    return datetime.fromisoformat(arrival_headers["timewheel-scheduled-at"].replace(
        "Z", "+00:00")).astimezone(UTC).timestamp()


def test_hanging_destination_delays_no_one_else(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """Issue #7's scenario: 600 callbacks to a receiver that hangs (2 s each; more than one
    process's 512 dispatch slots), 50 to a healthy receiver due 1 s later. The healthy ones
    arrive on time, the hanging one never sees more than the default parallelism (100) at
    once over both processes, and each of the 600 arrives once, as attempt 1."""
    first, second = start_service(), start_service()
    receiver.respond("/hang", [Reply(200, delay=2.0)])
    with ThreadedReceiver() as healthy:
        due = time.time() + 4.0
        post_all(first, [{"key": f"hang-{i}", "callback_url": receiver.url("/hang"),
                          "execute_at": due} for i in range(600)])
        post_all(second, [{"key": f"ok-{i}", "callback_url": healthy.url("/ok"),
                           "execute_at": due + 1.0 + i / 1000} for i in range(50)])
        healthy.wait_for_sync(50, timeout=30)
        receiver.wait_for_sync(600, timeout=60, path="/hang")

        lateness = sorted(a.received_at - scheduled_at(a.headers) for a in healthy.arrivals)
        assert lateness[0] >= 0, "a healthy callback came early"
        assert lateness[-1] <= 0.25, (
            f"healthy callbacks were held up by the hanging destination: {lateness[-5:]}")

    hung = receiver.arrivals_for("/hang")
    assert receiver.peak_in_flight("/hang") <= 100
    assert Counter(a.headers["webhook-id"] for a in hung) == {f"hang-{i}": 1 for i in range(600)}
    assert {a.headers["timewheel-attempt"] for a in hung} == {"1"}
    with first.client() as client:
        flow = client.get(f"/flows/127.0.0.1:{receiver.port}").json()
    assert flow["waiting"] == 0


def test_parallelism_and_rate_hold_over_two_processes(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """parallelism 3: never more than 3 at the receiver; rate 10/s: no window of one second
    holds more than 10 starts, up to 5 ms (each process reads the wheel's clock a little off
    Redis's, and a request takes a moment to reach the receiver). An attempt starts up to
    RATE_SLACK_MS after its logged start; the rate log keeps logged starts that much further
    apart, so that drift is not allowed for here (it was, 20 ms, before)."""
    first, second = start_service(), start_service()
    with first.client() as client:
        assert client.put("/flows/p3", json={"parallelism": 3}).status_code == 200
        assert client.put("/flows/r10", json={"rate": 10}).status_code == 200
    receiver.respond("/slow", [Reply(200, delay=0.3)])
    due = time.time() + 3.0
    tasks = [{"key": f"p-{i}", "callback_url": receiver.url("/slow"), "flow_key": "p3",
              "execute_at": due} for i in range(24)]
    tasks += [{"key": f"r-{i}", "callback_url": receiver.url("/fast"), "flow_key": "r10",
               "execute_at": due} for i in range(40)]
    post_all(first, tasks[::2])
    post_all(second, tasks[1::2])
    receiver.wait_for_sync(64, timeout=60)

    assert receiver.peak_in_flight("/slow") <= 3
    starts = sorted(a.received_at for a in receiver.arrivals_for("/fast"))
    busiest = max(sum(1 for t in starts if s <= t < s + 0.995) for s in starts)
    assert busiest <= 10, f"{busiest} starts within 0.995 s at rate 10"
    assert starts[-1] - starts[0] >= 2.9  # 40 starts at 10/s take at least three windows
    ids = Counter(a.headers["webhook-id"] for a in receiver.arrivals)
    assert ids == {task["key"]: 1 for task in tasks}


def test_permits_of_a_killed_process_come_back(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """SIGKILL a process while it holds both permits of a parallelism-2 flow: once their
    leases run out (timeout 2 s + lease margin 2 s + the 10 s a permit may be handed on
    within its process), the other process delivers everything (the two cut off at least
    once)."""
    first = start_service()
    with first.client() as client:
        assert client.put("/flows/k2", json={"parallelism": 2}).status_code == 200
    receiver.respond("/slow", [Reply(200, delay=1.0)])
    keys = [f"k-{i}" for i in range(6)]
    post_all(first, [{"key": key, "callback_url": receiver.url("/slow"), "flow_key": "k2",
                      "timeout": 2} for key in keys])
    receiver.wait_for_sync(2, timeout=15)
    first.kill()
    second = start_service()
    receiver.wait_for_sync(8, timeout=60)  # the 2 cut off come again, then the other 4
    arrived = Counter(a.headers["webhook-id"] for a in receiver.arrivals)
    assert set(arrived) == set(keys)
    # The cut-off attempts ended (1 s) long before their leases (timeout 2 s + margin 2 s).
    assert receiver.peak_in_flight("/slow") <= 2
    with second.client() as client:
        statuses: dict[str, str] = {}

        def all_succeeded() -> bool:
            statuses.update({key: client.get(f"/tasks/{key}").json()["status"] for key in keys})
            return set(statuses.values()) == {"succeeded"}

        settle(all_succeeded, 20, lambda: f"every task succeeded (statuses: {statuses})")

        def flow_idle() -> bool:
            flow = client.get("/flows/k2").json()
            return (flow["in_flight"], flow["waiting"]) == (0, 0)
        # The last permit goes back within RELEASE_LINGER_S of its answer (10 ms); a leaked
        # one would be held for its lease (timeout 2 s + margin + 10 s).
        settle(flow_idle, 2, "the flow holding no permit and nothing waiting")

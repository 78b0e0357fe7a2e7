"""Result callbacks end to end (docs/api.md v3, "Result callbacks"): real `timewheel serve`
processes, a real Redis, a real receiver for both the task and its result."""

from __future__ import annotations

import json
import signal
from datetime import datetime

import httpx
import pytest

from tests.e2e.test_delivery import schedule, view
from tests.support.receiver import Reply, ThreadedReceiver
from tests.support.redis_server import RedisServer
from tests.support.waiting import settle

pytestmark = pytest.mark.e2e


def seconds(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def wait_result(client: httpx.Client, key: str, status: str, timeout: float = 30.0) -> None:
    """Wait until the result task ``key`` exists (it appears when its parent finishes) and
    has ``status``."""
    def probe() -> bool:
        r = client.get(f"/tasks/{key}")
        return r.status_code == 200 and r.json()["status"] == status
    settle(probe, timeout, f"{key} to be {status}")


def test_delivered_task_posts_its_result_once(start_service,
                                              receiver: ThreadedReceiver) -> None:
    service = start_service()
    receiver.respond("/h", [Reply(200, {"Content-Type": "application/json",
                                        "X-Request-Id": "rq-7"}, body=b'{"order":"ok"}')])
    with service.client() as client:
        schedule(client, receiver.url("/h"), "res-1", on_success=receiver.url("/ok"),
                 on_failure=receiver.url("/failed"))
        wait_result(client, "res-1.on_success", "succeeded")
        parent = view(client, "res-1")
        result = view(client, "res-1.on_success")
        listed = client.get("/tasks", params={"status": "succeeded",
                                              "key_prefix": "res-1"}).json()["tasks"]
        missing = client.get("/tasks/res-1.on_failure").status_code
    # Succeeded: no attempt of the result task is left to come, so one arrival is all.
    [arrival] = receiver.arrivals_for("/ok")
    assert receiver.arrivals_for("/failed") == [] and missing == 404
    assert arrival.method == "POST" and arrival.headers["webhook-id"] == "res-1.on_success"
    assert arrival.headers["content-type"] == "application/json"
    assert json.loads(arrival.body) == {
        "key": "res-1", "outcome": "delivered", "attempt": 1, "status_code": 200,
        "response_headers": {"content-type": "application/json", "content-length": "14",
                             "x-request-id": "rq-7"},
        "response_body": '{"order":"ok"}', "response_body_truncated": False,
        "scheduled_at": parent["execute_at"], "finished_at": parent["finished_at"]}
    assert parent["on_success"] == receiver.url("/ok")
    assert (result["callback_url"], result["method"]) == (receiver.url("/ok"), "POST")
    assert sorted(t["key"] for t in listed) == ["res-1", "res-1.on_success"]


def test_failed_task_posts_to_on_failure_after_its_last_attempt(
        start_service, receiver: ThreadedReceiver) -> None:
    service = start_service()
    receiver.respond("/h", [Reply(503, body=b"busy")])
    with service.client() as client:
        schedule(client, receiver.url("/h"), "res-2", max_attempts=3, retry_backoff=0.2,
                 on_success=receiver.url("/ok"), on_failure=receiver.url("/failed"))
        wait_result(client, "res-2.on_failure", "succeeded")
    attempts = receiver.arrivals_for("/h")
    [arrival] = receiver.arrivals_for("/failed")
    assert [a.headers["timewheel-attempt"] for a in attempts] == ["1", "2", "3"]
    assert arrival.received_at >= attempts[-1].received_at  # not before the last attempt
    assert receiver.arrivals_for("/ok") == []
    payload = json.loads(arrival.body)
    assert (payload["outcome"], payload["attempt"], payload["status_code"],
            payload["response_body"]) == ("failed", 3, 503, "busy")


def test_a_failing_result_calls_no_further_result(start_service,
                                                  receiver: ThreadedReceiver) -> None:
    """The result task is itself retried and dead-lettered; its failure creates nothing. It
    would be created by the very step that failed it, so once it shows failed, nothing more
    can come."""
    service = start_service()
    receiver.respond("/h", [400])
    receiver.respond("/failed", [500])
    with service.client() as client:
        schedule(client, receiver.url("/h"), "res-3", on_failure=receiver.url("/failed"))
        wait_result(client, "res-3.on_failure", "failed", timeout=60)
        result = view(client, "res-3.on_failure")
        keys = [t["key"] for status in ("failed", "scheduled", "succeeded")
                for t in client.get("/tasks", params={"status": status,
                                                      "key_prefix": "res-3"}).json()["tasks"]]
    assert result["attempts"] == 5  # retried like any task (the defaults of POST /tasks)
    assert len(receiver.arrivals_for("/failed")) == 5
    assert sorted(keys) == ["res-3", "res-3.on_failure"]


def test_killed_between_answer_and_record_gives_one_result(
        start_service, receiver: ThreadedReceiver, redis_server_e2e: RedisServer) -> None:
    """The receiver answers attempt 1 while its process is stopped, and the process is then
    SIGKILLed: the answer was given, its outcome never recorded. After the lease another
    process sends attempt 2, whose completion creates the result, once."""
    receiver.respond("/h", [Reply(200, delay=1.0, body=b"first"), Reply(200, body=b"second")])
    first = start_service()
    with first.client() as client:
        created = schedule(client, receiver.url("/h"), "res-4", timeout=3,
                           on_success=receiver.url("/ok"))
    receiver.wait_for_sync(1, timeout=15, path="/h")
    first.signal(signal.SIGSTOP)
    settle(lambda: receiver.answered("/h") == 1, 10, "the first answer to be given")
    first.kill()
    assert receiver.arrivals_for("/ok") == []

    second = start_service()
    with second.client() as client:
        wait_result(client, "res-4.on_success", "succeeded", timeout=60)
        attempts = client.get("/tasks/res-4/attempts").json()["attempts"]
    assert [a["outcome"] for a in attempts] == ["lost", "delivered"]
    assert [a.headers["timewheel-attempt"] for a in receiver.arrivals_for("/h")] == ["1", "2"]
    # The lost attempt has the time it was sent at (start.lua keeps it): not before the task's
    # due time, not after the receiver had it (one host's clock, which the service reads through
    # Redis's TIME: 5 ms for that reading's error).
    first_arrival = receiver.arrivals_for("/h")[0].received_at
    started = seconds(attempts[0]["started_at"])
    assert seconds(created["execute_at"]) <= started <= first_arrival + 0.005
    # Its next_attempt_at is when the process that found it lost took it: attempt 2 went then.
    assert started < seconds(attempts[0]["next_attempt_at"]) <= seconds(attempts[1]["started_at"])
    [arrival] = receiver.arrivals_for("/ok")
    payload = json.loads(arrival.body)
    assert (payload["attempt"], payload["response_body"]) == (2, "second")

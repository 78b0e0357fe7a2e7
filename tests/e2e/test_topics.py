"""Topics end to end: a real `timewheel serve`, real receivers, one publish to five endpoints."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

from tests.e2e.conftest import Service
from tests.support.receiver import Reply, ThreadedReceiver
from tests.support.waiting import settle

HEALTHY = ["billing", "email", "analytics", "audit"]


def scheduled_at(headers: dict[str, str]) -> float:
    return datetime.fromisoformat(headers["timewheel-scheduled-at"].replace(
        "Z", "+00:00")).astimezone(UTC).timestamp()


def test_a_hanging_endpoint_delays_no_other(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """Five endpoints, one of which hangs past its task's 1 s timeout twice: the four others
    arrive once each, while the fifth's first attempt is still hanging (each task has its own
    attempts and its own flow), never before their time; the fifth alone is retried, and
    delivered at its third attempt."""
    service = start_service()
    receiver.respond("/stuck", [Reply(200, delay=3.0), Reply(200, delay=3.0), Reply(200)])
    with ThreadedReceiver() as healthy, service.client() as client:
        endpoints = [{"name": name, "url": healthy.url(f"/{name}")} for name in HEALTHY]
        endpoints.append({"name": "stuck", "url": receiver.url("/stuck")})
        assert client.put("/topics/orders", json={"endpoints": endpoints}).status_code == 201
        answer = client.post("/topics/orders/publish", json={
            "key": "order-1", "delay": 1, "timeout": 1, "retry_backoff": 0.5,
            "body": {"order": 1}})
        assert answer.status_code == 201, answer.text
        assert [t["key"] for t in answer.json()["tasks"]] == [
            f"order-1.{name}" for name in [*HEALTHY, "stuck"]]

        healthy.wait_for_sync(4, timeout=20)
        receiver.wait_for_sync(3, timeout=30, path="/stuck")
        stuck = receiver.arrivals_for("/stuck")
        # All four arrived before the stuck endpoint's second attempt began: none of them
        # waited for its first to time out.
        assert max(a.received_at for a in healthy.arrivals) < stuck[1].received_at
        assert Counter(a.path for a in healthy.arrivals) == {f"/{n}": 1 for n in HEALTHY}
        assert {a.headers["timewheel-attempt"] for a in healthy.arrivals} == {"1"}
        assert all(a.received_at >= scheduled_at(a.headers) for a in healthy.arrivals)
        assert {a.headers["webhook-id"] for a in healthy.arrivals} == {
            f"order-1.{n}" for n in HEALTHY}
        assert [a.headers["timewheel-attempt"] for a in stuck] == ["1", "2", "3"]
        assert {a.headers["webhook-id"] for a in stuck} == {"order-1.stuck"}

        settle(lambda: client.get("/tasks/order-1.stuck").json()["status"] == "succeeded",
               20, "the stuck endpoint's task to succeed")
        views = {name: client.get(f"/tasks/order-1.{name}").json()
                 for name in [*HEALTHY, "stuck"]}
        assert {n: (v["status"], v["attempts"]) for n, v in views.items()} == {
            **dict.fromkeys(HEALTHY, ("succeeded", 1)), "stuck": ("succeeded", 3)}
        assert views["stuck"]["flow_key"] == f"127.0.0.1:{receiver.port}"
        assert views["billing"]["flow_key"] == f"127.0.0.1:{healthy.port}"


def test_each_published_task_posts_its_own_result(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """A publish with on_success: every endpoint's task, once delivered, posts its result to
    on_success as the task <key>.<endpoint>.on_success (docs/api.md, "Result callbacks")."""
    service = start_service()
    with service.client() as client:
        endpoints = [{"name": name, "url": receiver.url(f"/{name}")} for name in HEALTHY]
        assert client.put("/topics/results", json={"endpoints": endpoints}).status_code == 201
        answer = client.post("/topics/results/publish", json={
            "key": "r-1", "body": {"n": 1}, "on_success": receiver.url("/result")})
        assert answer.status_code == 201, answer.text
    receiver.wait_for_sync(len(HEALTHY), timeout=20, path="/result")
    results = receiver.arrivals_for("/result")
    assert sorted(a.headers["webhook-id"] for a in results) == sorted(
        f"r-1.{name}.on_success" for name in HEALTHY)
    assert sorted(json.loads(a.body)["key"] for a in results) == sorted(
        f"r-1.{name}" for name in HEALTHY)

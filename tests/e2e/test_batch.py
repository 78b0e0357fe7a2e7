"""POST /tasks/batch end to end: a real `timewheel serve`, a real Redis, a real receiver.
A mixed batch delivers exactly its valid items, each once, with its own method and body."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.test_delivery import by_key, schedule, view, wait_status
from tests.support.receiver import ThreadedReceiver

pytestmark = pytest.mark.e2e


def test_mixed_batch_delivers_exactly_the_valid_items_once(
        start_service: Any, receiver: ThreadedReceiver) -> None:
    service = start_service()
    hook, other = receiver.url("/hook"), receiver.url("/other")
    with service.client() as client:
        schedule(client, hook, "old", delay=0.5, body={"n": "old"})
        items: list[Any] = [
            {"key": f"new-{i}", "callback_url": hook, "delay": 0.5, "body": {"n": i}}
            for i in range(20)]
        items += [
            {"key": "old", "callback_url": hook, "delay": 0.5, "body": {"n": "old"}},  # 200
            {"key": "old", "callback_url": other, "delay": 0.5},                       # 409
            {"key": "bad", "callback_url": other, "delay": -1},                        # 422
            {"key": "new-3", "callback_url": other},                                   # 409
            {"callback_url": hook, "method": "put", "body": "generated",               # 201
             "headers": {"Content-Type": "text/plain"}},
            ["not", "an", "object"],                                                   # 422
        ]
        reply = client.post("/tasks/batch", json={"tasks": items})
        assert reply.status_code == 200, reply.text
        results = reply.json()["results"]
        generated = results[24]["key"]
        assert [(r["key"], r["status"]) for r in results] == [
            *((f"new-{i}", 201) for i in range(20)),
            ("old", 200), ("old", 409), ("bad", 422), ("new-3", 409), (generated, 201),
            (None, 422)]
        valid = ["old", *(f"new-{i}" for i in range(20)), generated]
        views = wait_status(client, valid, "succeeded")
        assert {key: v["attempts"] for key, v in views.items()} == dict.fromkeys(valid, 1)
        assert client.get("/tasks/bad").status_code == 404

    arrivals = by_key(receiver.arrivals)
    assert sorted(arrivals) == sorted(valid)
    assert {key: len(got) for key, got in arrivals.items()} == dict.fromkeys(valid, 1)
    assert receiver.arrivals_for("/other") == []
    for i in range(20):
        assert json.loads(arrivals[f"new-{i}"][0].body) == {"n": i}
    sent = arrivals[generated][0]
    assert (sent.method, sent.body, sent.headers["content-type"]) == (
        "PUT", b"generated", "text/plain")
    with service.client() as client:
        assert view(client, generated)["method"] == "PUT"

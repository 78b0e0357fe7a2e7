"""The attempt history end to end: a real `timewheel serve`, a real Redis, a real receiver that
answers 503, 503, then 200; GET /tasks/{key}/attempts shows the three attempts as they were
made (docs/api.md v3)."""

from __future__ import annotations

import re
import socket
from itertools import pairwise

import pytest

from tests.e2e.test_delivery import schedule, view, wait_status
from tests.support.receiver import Reply, ThreadedReceiver
from timewheel.models import parse_execute_at

pytestmark = pytest.mark.e2e

BODY_BYTES = 16  # TIMEWHEEL_ATTEMPT_BODY_BYTES, small so that one answer is cut


def test_503_503_200_shows_three_attempts(start_service, receiver: ThreadedReceiver) -> None:
    service = start_service(attempt_body_bytes=str(BODY_BYTES))
    long_body = b"overloaded: " + b"x" * 100
    receiver.respond("/h", [
        Reply(503, {"Content-Type": "text/plain", "Retry-After": "1", "X-Request-Id": "r-1"},
              body=b"busy"),
        Reply(503, {"Content-Type": "text/plain"}, body=long_body),
        Reply(200, {"Content-Type": "application/json"}, body=b'{"ok":true}'),
    ])
    with service.client() as client:
        schedule(client, receiver.url("/h"), "hist-1", retry_backoff=0.2)
        wait_status(client, ["hist-1"], "succeeded")
        r = client.get("/tasks/hist-1/attempts")
        task = view(client, "hist-1")
    assert r.status_code == 200, r.text
    shown = r.json()["attempts"]
    assert len(receiver.arrivals_for("/h")) == 3

    assert [a["attempt"] for a in shown] == [1, 2, 3]
    assert [a["outcome"] for a in shown] == ["retry", "retry", "delivered"]
    assert [a["status_code"] for a in shown] == [503, 503, 200]
    assert [a["error"] for a in shown] == [None, None, None]
    assert task["attempts"] == 3 and task["last_status_code"] == 200

    # The answers as the receiver sent them: headers of the subset, bodies cut at BODY_BYTES.
    assert shown[0]["response_headers"]["retry-after"] == "1"
    assert shown[0]["response_headers"]["x-request-id"] == "r-1"
    assert shown[0]["response_headers"]["content-type"] == "text/plain"
    assert (shown[0]["response_body"], shown[0]["response_body_truncated"]) == ("busy", False)
    assert (shown[1]["response_body"], shown[1]["response_body_truncated"]) == (
        long_body[:BODY_BYTES].decode(), True)
    assert shown[2]["response_headers"]["content-type"] == "application/json"
    assert (shown[2]["response_body"], shown[2]["response_body_truncated"]) == (
        '{"ok":true}', False)

    # Who and when: this process; each retry announced before it started and never early;
    # the delivered attempt has no next one.
    assert service.process is not None
    host = socket.gethostname()
    for a in shown:
        assert a["process"] == f"{host}:{service.process.pid}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", a["started_at"])
        assert isinstance(a["duration_ms"], int) and a["duration_ms"] >= 0
    started = [parse_execute_at(a["started_at"]) for a in shown]
    assert started == sorted(started)
    for earlier, later in pairwise(shown):
        assert earlier["next_attempt_at"] is not None
        assert parse_execute_at(earlier["next_attempt_at"]) <= parse_execute_at(
            later["started_at"])
    assert shown[2]["next_attempt_at"] is None


def test_a_pending_task_has_no_history(start_service, receiver: ThreadedReceiver) -> None:
    """Scheduled an hour ahead: an empty history; the control (a task due now, delivered)
    shows one attempt through the same service."""
    service = start_service()
    with service.client() as client:
        schedule(client, receiver.url("/later"), "later-1", delay=3600)
        schedule(client, receiver.url("/now"), "now-1")
        wait_status(client, ["now-1"], "succeeded")
        assert client.get("/tasks/later-1/attempts").json() == {"attempts": []}
        now = client.get("/tasks/now-1/attempts").json()["attempts"]
        assert [(a["outcome"], a["status_code"]) for a in now] == [("delivered", 200)]
        assert client.get("/tasks/nope/attempts").status_code == 404

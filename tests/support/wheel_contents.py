"""A wheel with one of everything, to carry through a backup and restore or a move between
Redis setups, and the checks that it came through whole.

``Contents.create`` puts, through the API of a running `timewheel serve`:

- tasks due soon (``soon_s`` from now, on ``/soon``) and one due in 30 days (``/far``);
- a task delivered before the copy (``/done``, waited for) and a cancelled one;
- a flow with limits and retry defaults, and a task in it due soon (``/flow``);
- a paused flow and a task of it due soon (``/held``): it must wait on the target until the
  flow is resumed;
- a schedule every 2 s (``/sched``), and a topic of two endpoints (``/topic/a``, ``/topic/b``)
  with a publish due soon.

``snapshot`` reads back everything a client can see of those; the target service must show
the same (``Contents.compare``). The receiver's arrivals then tell what was delivered, how
often and whether early (``early``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.receiver import Arrival, ThreadedReceiver
from tests.support.waiting import settle
from timewheel.models import parse_execute_at

FAR_S = 30 * 86_400
FLOW = "bk-partner"
PAUSED = "bk-paused"
SCHEDULE = "bk-every"
TOPIC = "bk-topic"
ENDPOINTS = ("a", "b")
# A task's fields its delivery changes (GET /tasks/{key}).
DELIVERY_FIELDS = ("status", "attempts", "next_attempt_at", "last_attempt_at",
                   "last_status_code", "last_error", "finished_at")


@dataclass
class Contents:
    receiver: ThreadedReceiver
    soon_s: float
    soon: list[str] = field(default_factory=lambda: [f"bk-soon-{i}" for i in range(4)])

    @property
    def published(self) -> list[str]:
        return [f"bk-pub.{name}" for name in ENDPOINTS]

    @property
    def due(self) -> list[str]:
        """The tasks due soon, each to be delivered once, by the target (the paused flow's
        task aside)."""
        return [*self.soon, "bk-flow-1", *self.published]

    @property
    def keys(self) -> list[str]:
        return [*self.due, "bk-far", "bk-done", "bk-cancelled", "bk-held"]

    def create(self, http: httpx.Client) -> None:
        url = self.receiver.url
        for i, key in enumerate(self.soon):
            post(http, {"key": key, "callback_url": url("/soon"), "delay": self.soon_s + i / 4,
                        "body": {"n": i}, "headers": {"x-n": str(i)}})
        post(http, {"key": "bk-far", "callback_url": url("/far"), "delay": FAR_S})
        post(http, {"key": "bk-cancelled", "callback_url": url("/cancelled"), "delay": 3600})
        assert http.delete("/tasks/bk-cancelled").status_code == 204
        post(http, {"key": "bk-done", "callback_url": url("/done")})
        self.receiver.wait_for_sync(1, timeout=20, path="/done")
        settle(lambda: http.get("/tasks/bk-done").json()["status"] == "succeeded", 20,
               "bk-done to succeed")

        ok(http.put(f"/flows/{FLOW}", json={"parallelism": 2, "rate": 50, "max_attempts": 7}))
        post(http, {"key": "bk-flow-1", "callback_url": url("/flow"), "delay": self.soon_s,
                    "flow_key": FLOW})
        ok(http.put(f"/flows/{PAUSED}", json={"paused": True}))
        post(http, {"key": "bk-held", "callback_url": url("/held"), "delay": self.soon_s,
                    "flow_key": PAUSED})

        ok(http.put(f"/schedules/{SCHEDULE}",
                    json={"every": 2, "task": {"callback_url": url("/sched")}}))
        endpoints = [{"name": n, "url": url(f"/topic/{n}"), "headers": {"x-endpoint": n}}
                     for n in ENDPOINTS]
        ok(http.put(f"/topics/{TOPIC}", json={"endpoints": endpoints}))
        ok(http.post(f"/topics/{TOPIC}/publish",
                     json={"key": "bk-pub", "delay": self.soon_s, "body": {"published": 1}}))

    def snapshot(self, http: httpx.Client) -> dict[str, Any]:
        """What a client sees of the contents (a flow's ``in_flight`` and ``waiting`` are left
        out: they are what processes are doing, not what is stored)."""
        seen: dict[str, Any] = {}
        for key in self.keys:
            reply = http.get(f"/tasks/{key}")
            assert reply.status_code == 200, (key, reply.text)
            seen[f"task {key}"] = reply.json()
        for flow in (FLOW, PAUSED):
            view = ok(http.get(f"/flows/{flow}"))
            seen[f"flow {flow}"] = {k: v for k, v in view.items()
                                    if k not in ("in_flight", "waiting")}
        schedule = ok(http.get(f"/schedules/{SCHEDULE}"))
        # next_run_at and last_run_at move with the schedule; the rest is what was put
        seen[f"schedule {SCHEDULE}"] = {k: v for k, v in schedule.items()
                                        if k not in ("next_run_at", "last_run_at")}
        seen[f"topic {TOPIC}"] = ok(http.get(f"/topics/{TOPIC}"))
        return seen

    def compare(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        """``after`` shows what ``before`` did. A task due soon that has fallen due by now (the
        machine was slow: the copy took longer than ``soon_s``) may be out already: its
        delivery's fields are left out of its comparison; the arrivals check those (each
        due task delivered once, none early)."""
        now_ms = time.time() * 1000

        def stored(name: str, view: Any) -> Any:
            key = name.removeprefix("task ")
            if (view is None or not name.startswith("task ") or key not in self.due
                    or parse_execute_at(view["execute_at"]) > now_ms):
                return view
            return {k: v for k, v in view.items() if k not in DELIVERY_FIELDS}

        differ = {name: (before[name], after.get(name)) for name in before
                  if stored(name, before[name]) != stored(name, after.get(name))}
        assert differ == {}, differ

    def wait_delivered(self, timeout: float = 60) -> None:
        """Wait until every due task has arrived (the paused flow's excepted)."""
        paths = ["/soon"] * len(self.soon) + ["/flow"] + [f"/topic/{n}" for n in ENDPOINTS]
        for path in set(paths):
            self.receiver.wait_for_sync(paths.count(path), timeout=timeout, path=path)

    def arrivals(self, key: str) -> list[Arrival]:
        return [a for a in self.receiver.arrivals if a.headers.get("webhook-id") == key]


def early(arrivals: list[Arrival]) -> list[tuple[str, float, str]]:
    """Arrivals before their task's execute_at (timewheel-scheduled-at): must be none."""
    return [(a.headers["webhook-id"], a.received_at, a.headers["timewheel-scheduled-at"])
            for a in arrivals
            if a.received_at * 1000 < parse_execute_at(a.headers["timewheel-scheduled-at"])]


def post(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    reply = http.post("/tasks", json=body)
    assert reply.status_code == 201, reply.text
    view: dict[str, Any] = reply.json()
    return view


def ok(reply: httpx.Response) -> Any:
    assert reply.status_code in (200, 201), (reply.request.url, reply.status_code, reply.text)
    return reply.json()

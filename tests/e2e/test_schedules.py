"""Recurring schedules end to end: real `timewheel serve` processes, a real Redis, a real
receiver. Time assertions are ordering invariants only: an occurrence never arrives before its
time, and one that was stopped never arrives at all. Waits are bounded polls."""

from __future__ import annotations

import time
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from redis import Redis

from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer
from tests.support.waiting import settle

pytestmark = pytest.mark.e2e

StartService = Callable[..., Service]




def occurrences(receiver: ThreadedReceiver, schedule_id: str) -> list[tuple[int, float]]:
    """(occurrence ms, arrival ms) of every callback of the schedule, in arrival order."""
    found = []
    for arrival in receiver.arrivals_for(f"/s/{schedule_id}"):
        name, _, occ = arrival.headers["webhook-id"].rpartition(".")
        assert name == schedule_id
        found.append((int(occ), arrival.received_at * 1000))
    return found


def put(service: Service, receiver: ThreadedReceiver, schedule_id: str,
        **spec: Any) -> dict[str, Any]:
    with service.client() as client:
        r = client.put(f"/schedules/{schedule_id}",
                       json={"task": {"callback_url": receiver.url(f"/s/{schedule_id}")}, **spec})
    assert r.status_code == 201, r.text
    view: dict[str, Any] = r.json()
    return view


def call(service: Service, method: str, path: str) -> int:
    with service.client() as client:
        return client.request(method, path).status_code


def assert_once_and_never_early(found: list[tuple[int, float]]) -> None:
    counts = Counter(occ for occ, _ in found)
    again = [(occ, at) for occ, at in found if counts[occ] > 1]
    assert again == [], again  # (occurrence, arrival) of each repeated one
    assert_never_early(found)


def assert_never_early(found: list[tuple[int, float]]) -> None:
    early = [(occ, at) for occ, at in found if at < occ]
    assert early == [], early


def count_after(receiver: ThreadedReceiver, schedule_id: str, after_ms: float) -> int:
    return sum(1 for occ, _ in occurrences(receiver, schedule_id) if occ > after_ms)


# -- exactly once across processes ------------------------------------------------------------

def test_every_second_on_two_processes_fires_each_occurrence_once(
        start_service: StartService, receiver: ThreadedReceiver) -> None:
    """Each occurrence once across two processes, none missing; once deleted, none after.
    Control: a second schedule, the same but not deleted, fires past the wait's end."""
    first, second = start_service(), start_service()
    put(first, receiver, "hb", every=1)
    put(first, receiver, "control", every=1)
    settle(lambda: len(occurrences(receiver, "hb")) >= 6, 15, "six occurrences")
    assert call(second, "DELETE", "/schedules/hb") == 204
    stopped = time.time() * 1000
    found = occurrences(receiver, "hb")
    assert_once_and_never_early(found)
    seen = sorted(occ for occ, _ in found)
    assert seen == list(range(seen[0], seen[-1] + 1, 1000))  # none missing in between
    assert all(occ % 1000 == 0 for occ in seen)
    # Occurrences are materialized two ticks (2 s) ahead: once the control's first occurrence
    # after that has arrived, every one of "hb" materialized before the delete was due a
    # second before it.
    settle(lambda: count_after(receiver, "control", stopped + 2000) >= 1, 30,
           "an occurrence of the control past the materialized ones")
    assert count_after(receiver, "hb", stopped) == 0


def test_six_field_cron_fires_on_even_seconds(start_service: StartService,
                                              receiver: ThreadedReceiver) -> None:
    service = start_service()
    view = put(service, receiver, "even", cron="*/2 * * * * *")
    assert view["next_run_at"][17:19] in {f"{s:02d}" for s in range(0, 60, 2)}
    settle(lambda: len(occurrences(receiver, "even")) >= 3, 15, "three occurrences")
    found = occurrences(receiver, "even")
    assert_once_and_never_early(found)
    seen = sorted(occ for occ, _ in found)
    assert all(occ % 2000 == 0 for occ in seen), seen
    assert seen == list(range(seen[0], seen[-1] + 1, 2000)), seen
    for occ, _ in found:
        arrival = next(a for a in receiver.arrivals_for("/s/even")
                       if a.headers["webhook-id"] == f"even.{occ}")
        assert arrival.headers["timewheel-scheduled-at"].endswith(
            f"{occ // 1000 % 60:02d}.000Z")


# -- pause, resume, delete stop at once -------------------------------------------------------

def test_pause_and_delete_stop_occurrences_at_once_and_resume_restarts(
        start_service: StartService, receiver: ThreadedReceiver) -> None:
    service = start_service()
    put(service, receiver, "p", every=1)
    settle(lambda: len(occurrences(receiver, "p")) >= 2, 10, "two occurrences")

    assert call(service, "POST", "/schedules/p/pause") == 200
    paused = time.time() * 1000
    time.sleep(2.5)  # every occurrence materialized before the pause is due by now
    assert count_after(receiver, "p", paused) == 0

    resuming = time.time() * 1000  # the resume takes effect at or after this
    assert call(service, "POST", "/schedules/p/resume") == 200
    resumed = time.time() * 1000  # ... and at or before this
    settle(lambda: count_after(receiver, "p", resumed) >= 2, 10, "occurrences again")
    # Nothing of the paused stretch was made up for. An occurrence between the two readings may
    # be the first after the resume (the POST took that long: under load, past a second's
    # boundary), so the stretch ends where the resume certainly had not yet happened.
    assert [occ for occ, _ in occurrences(receiver, "p") if paused < occ <= resuming] == []

    assert call(service, "DELETE", "/schedules/p") == 204
    deleted = time.time() * 1000
    time.sleep(2.5)
    assert count_after(receiver, "p", deleted) == 0
    assert_once_and_never_early(occurrences(receiver, "p"))


# -- downtime: only the latest missed occurrence ----------------------------------------------

def test_after_every_process_was_down_only_the_latest_missed_fires(
        start_service: StartService, receiver: ThreadedReceiver,
        redis_server_e2e: RedisServer) -> None:
    first, second = start_service(), start_service()
    put(first, receiver, "d", every=1)
    settle(lambda: len(occurrences(receiver, "d")) >= 2, 10, "two occurrences")
    first.kill()
    second.kill()
    # The latest occurrence materialized before the crash: everything up to it was a task.
    record = f"{{tw:{zlib.crc32(b'd') % 16}}}:s:d"
    with Redis.from_url(redis_server_e2e.url) as redis:
        hi = int(redis.hget(record, "hi") or 0)
    assert hi > 0
    time.sleep(5)
    restarted = time.time() * 1000
    first.start()
    second.start()
    settle(lambda: count_after(receiver, "d", restarted) >= 2, 15, "occurrences again")

    found = occurrences(receiver, "d")
    # At least once across crashes: one being sent at the SIGKILL (its outcome never recorded)
    # is sent again after the restart, once; what arrived before the restart was sent before
    # the kill. Any other repeat is a double fire.
    for occ, n in Counter(occ for occ, _ in found).items():
        if n > 1:
            times = sorted(at for o, at in found if o == occ)
            assert n == 2 and times[0] < restarted <= times[1], (occ, times, restarted)
    assert_never_early(found)
    after_crash = sorted(occ for occ, _ in found if occ > hi)
    latest_missed = after_crash[0]
    # Older missed occurrences are skipped: the first one fired is the latest at or before the
    # first pass after the restart (a second of slack for the wheel's clock, which may trail
    # the host's by a few ms), so every one from hi to about the restart was skipped.
    assert latest_missed >= restarted - 2000, (hi, latest_missed, restarted)
    assert latest_missed - hi >= 3000
    assert after_crash == list(range(latest_missed, after_crash[-1] + 1, 1000))

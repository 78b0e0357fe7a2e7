"""The soak's checker (bench/soak_check.py) on small hand-made histories: each category fires
on the history that has it, and stays at zero on the same history without the fault."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from bench.soak_check import check
from bench.soak_history import logged_late_writes, logged_timeouts

T0 = 1_800_000_000.0
META = {"type": "meta", "task_timeout_s": 2.0, "lease_margin_s": 2.0, "tick_s": 1.0,
        "early_slack_s": 0.02, "bound_s": 30.0}


def create(key: str, due: float, status: int | None = 201, t0: float = T0) -> dict[str, Any]:
    return {"type": "op", "op": "create", "key": key, "t0": t0, "t1": t0 + 0.01,
            "status": status, "requested_at": due, "execute_at": due if status else None}


def cancel(key: str, t1: float, status: int | None = 204) -> dict[str, Any]:
    return {"type": "op", "op": "cancel", "key": key, "t0": t1 - 0.01, "t1": t1,
            "status": status}


def arrival(key: str, t: float, scheduled: float, answered: int = 200, pid: int | None = 1,
            attempt: int = 1) -> dict[str, Any]:
    return {"type": "arrival", "key": key, "t": t, "scheduled_at": scheduled,
            "answered": answered, "pid": pid, "attempt": attempt}


def proc(name: str, pid: int) -> dict[str, Any]:
    return {"type": "proc", "name": name, "pid": pid, "start": T0}


def fault(kind: str, start: float, end: float, pid: int | None = None) -> dict[str, Any]:
    return {"type": "fault", "kind": kind, "start": start, "end": end, "target": kind,
            "pid": pid}


def end(t: float) -> dict[str, Any]:
    return {"type": "end", "t": t}


def run(*events: dict[str, Any]) -> dict[str, Any]:
    return check([META, proc("p0", 1), proc("p1", 2), *events])


def counts(*events: dict[str, Any]) -> dict[str, int]:
    return run(*events)["counts"]  # type: ignore[no-any-return]


def test_a_delivered_task_is_clean() -> None:
    summary = run(create("a", T0 + 5), arrival("a", T0 + 5.001, T0 + 5), end(T0 + 60))
    assert summary["failed"] == []
    assert summary["tasks_acknowledged"] == summary["tasks_delivered"] == 1


def test_lost_fires_when_an_acknowledged_task_never_arrives_with_a_2xx() -> None:
    history = [create("a", T0 + 5), arrival("a", T0 + 5.001, T0 + 5, answered=503),
               end(T0 + 60)]
    summary = run(*history)
    assert summary["counts"]["lost"] == 1 and "lost" in summary["failed"]
    # control: the retry that succeeds
    assert counts(*history, arrival("a", T0 + 6, T0 + 5, attempt=2))["lost"] == 0


def test_an_indeterminate_create_or_cancel_is_never_lost() -> None:
    assert counts(create("a", T0 + 5, status=None), end(T0 + 60))["lost"] == 0
    assert counts(create("a", T0 + 5, status=503), end(T0 + 60))["lost"] == 0
    assert counts(create("a", T0 + 5), cancel("a", T0 + 1, status=None),
                  end(T0 + 60))["lost"] == 0
    assert counts(create("a", T0 + 5), end(T0 + 60))["lost"] == 1  # control


def test_early_fires_beyond_the_clock_slack_only() -> None:
    early = counts(create("a", T0 + 5), arrival("a", T0 + 4.97, T0 + 5), end(T0 + 60))
    assert early["early"] == 1
    within = counts(create("a", T0 + 5), arrival("a", T0 + 4.99, T0 + 5), end(T0 + 60))
    assert within["early"] == 0


def test_an_execute_at_rounded_down_is_reported() -> None:
    op = create("a", T0 + 5)
    op["requested_at"], op["execute_at"] = T0 + 5.0004, T0 + 5.0
    assert counts(op, arrival("a", T0 + 5.01, T0 + 5), end(T0 + 60))["rounded_down"] == 1
    op["execute_at"] = T0 + 5.001  # rounded up: fine
    assert counts(op, arrival("a", T0 + 5.01, T0 + 5.001), end(T0 + 60))["rounded_down"] == 0


def test_a_duplicate_without_a_fault_is_unexplained() -> None:
    summary = run(create("a", T0 + 5), arrival("a", T0 + 5.001, T0 + 5, pid=1),
                  arrival("a", T0 + 9.5, T0 + 5, pid=2, attempt=2), end(T0 + 60))
    assert summary["counts"]["duplicates_unexplained"] == 1
    assert "duplicates_unexplained" in summary["failed"]


def test_the_stopped_process_that_sends_after_another_delivered_is_unexplained() -> None:
    """p0 stopped while its attempt was started, p1 re-claims after the lease and delivers,
    p0 resumes and sends: the duplicate is unexplained, as the first 2xx came from p1, which
    no fault hit (a process fault explains a duplicate only when it hit the first sender)."""
    summary = run(create("a", T0 + 5), fault("proc_stop", T0 + 5.002, T0 + 13, pid=1),
                  arrival("a", T0 + 9.5, T0 + 5, pid=2, attempt=2),
                  arrival("a", T0 + 13.01, T0 + 5, pid=1, attempt=1), end(T0 + 60))
    dup = summary["details"]["duplicates_unexplained"]
    assert len(dup) == 1 and dup[0]["again_sender_faults"]


def test_a_duplicate_its_sender_logged_as_written_after_its_send_by_is_explained() -> None:
    """The same stop, landing between p0's last check and its write: p0 logs the write as late
    (late_write), which explains the duplicate. A late write logged for another attempt or by
    another process explains nothing."""
    events = [create("a", T0 + 5), fault("proc_stop", T0 + 5.002, T0 + 13, pid=1),
              arrival("a", T0 + 9.5, T0 + 5, pid=2, attempt=2),
              arrival("a", T0 + 13.01, T0 + 5, pid=1, attempt=1), end(T0 + 60)]
    logged = {"type": "late_write", "pid": 1, "key": "a", "attempt": 1, "late_ms": 7980}
    summary = run(*events, logged)
    [dup] = summary["details"]["duplicates_explained"]
    assert "written 7980 ms after its send-by" in dup["explained_by"]
    assert summary["counts"]["duplicates_unexplained"] == 0
    # another attempt, another process, another key; or a write so little late that p0's lease
    # still ran when p1 delivered (written at 13.01, 1 ms past its send-by: the lease ran
    # until ~16.0; p1's 2xx at 9.5 means both held the task: a double claim, no pause)
    for other in ({"attempt": 2}, {"pid": 2}, {"key": "b"}, {"late_ms": 1}):
        c = counts(*events, {**logged, **other})
        assert (c["duplicates_explained"], c["duplicates_unexplained"]) == (0, 1), other


def test_late_writes_are_read_from_a_serve_log(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text(
        "2026-11-27 10:00:00,000 INFO timewheel.engine.ticker: tick\n"
        "2026-11-27 10:00:01,000 WARNING timewheel.engine.dispatcher: callback b15-120 "
        "attempt=1 written 9812 ms after its send-by; its last check, 3 ms before the "
        "send-by, said yes (paused between the check and the write): another process may "
        "send it too\n"
        "2026-11-27 10:00:02,000 ERROR timewheel.engine.dispatcher: callback b15-121 "
        "attempt=1 written 9000 ms after its send-by with no last check in time before it "
        "(a bug): another process may send it too\n")
    assert logged_late_writes(log) == [("b15-120", 1, 9812)]  # not the bug's
    assert logged_late_writes(tmp_path / "none.log") == []
    # a later process on the same port appends: each reads its own bytes
    first_end = log.stat().st_size
    with log.open("a") as fh:
        fh.write("2026-11-27 10:05:00,000 WARNING timewheel.engine.dispatcher: callback c-1 "
                 "attempt=2 written 5 ms after its send-by; its last check, 0 ms before the "
                 "send-by, said yes (paused between the check and the write): another process "
                 "may send it too\n")
    assert logged_late_writes(log, 0, first_end) == [("b15-120", 1, 9812)]
    assert logged_late_writes(log, first_end) == [("c-1", 2, 5)]


def timed_out(key: str, attempt: int, t: float, pid: int = 1) -> dict[str, Any]:
    return {"type": "timed_out", "pid": pid, "key": key, "attempt": attempt, "t": t}


def test_a_duplicate_of_an_attempt_its_sender_logged_as_timed_out_is_explained() -> None:
    """p0's attempt 1 (due at 5) waits in a receiver behind on its backlog (no single long
    stall) past the 2 s timeout: p0 logs the timeout at 7.0 and retries, and the receiver reads
    attempt 1 after p0 closed the connection (no sender to name), before or after attempt 2.
    A timeout logged for another attempt, key or process, or an attempt 1 the receiver saw
    from another process, explains nothing."""
    logged = timed_out("a", 1, T0 + 7.0)
    for late_first in (True, False):  # attempt 1 read before, or after, attempt 2
        events = [create("a", T0 + 5),
                  arrival("a", T0 + 7.4 if late_first else T0 + 7.9, T0 + 5, pid=None),
                  arrival("a", T0 + 7.6, T0 + 5, pid=1, attempt=2), end(T0 + 60)]
        summary = run(*events, logged)
        [dup] = summary["details"]["duplicates_explained"]
        assert "attempt 1 timed out at p0" in dup["explained_by"], late_first
        assert summary["counts"]["duplicates_unexplained"] == 0
        assert counts(*events)["duplicates_unexplained"] == 1  # no timeout logged
        for other in ({"attempt": 2}, {"key": "b"}):
            c = counts(*events, {**logged, **other})
            assert (c["duplicates_explained"], c["duplicates_unexplained"]) == (0, 1), other
        seen_from_p1 = [events[0], {**events[1], "pid": 2}, *events[2:]]
        assert counts(*seen_from_p1, logged)["duplicates_unexplained"] == 1


def test_a_timeout_does_not_explain_a_double_send() -> None:
    """What a retry after a timeout cannot look like: the same attempt twice; a retry that
    arrived before its predecessor timed out (a double claim: p1 sent attempt 2 while p0 still
    waited); a timeout of that attempt logged by two processes; one logged before the task was
    due (an earlier task under the key); a gap (attempt 3 after attempt 1 timed out and
    attempt 2 was answered 2xx)."""
    create_a, due = create("a", T0 + 5), T0 + 5
    read_late = arrival("a", T0 + 7.4, due, pid=None)
    retry = arrival("a", T0 + 7.6, due, pid=2, attempt=2)
    for events in (
            [read_late, arrival("a", T0 + 7.6, due, pid=2), timed_out("a", 1, T0 + 7.0)],
            [read_late, arrival("a", T0 + 5.2, due, pid=2, attempt=2),
             timed_out("a", 1, T0 + 7.0)],
            [read_late, retry, timed_out("a", 1, T0 + 7.0), timed_out("a", 1, T0 + 7.1, pid=2)],
            [read_late, retry, timed_out("a", 1, T0 + 1.0)],
            [read_late, arrival("a", T0 + 9.7, due, pid=2, attempt=2),
             arrival("a", T0 + 12.0, due, pid=2, attempt=3), timed_out("a", 1, T0 + 7.0)]):
        c = counts(create_a, *events, end(T0 + 60))
        assert c["duplicates_unexplained"] >= 1, events
    # control for the gap: attempt 2 answered 503 and was retried, which explains attempt 3
    # (both arrivals after attempt 1's 2xx count as duplicates, both explained)
    c = counts(create_a, read_late, arrival("a", T0 + 9.7, due, pid=2, attempt=2, answered=503),
               arrival("a", T0 + 12.0, due, pid=2, attempt=3), timed_out("a", 1, T0 + 7.0),
               end(T0 + 60))
    assert (c["duplicates_explained"], c["duplicates_unexplained"]) == (2, 0)


def test_timeouts_are_read_from_a_serve_log(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text(
        "2026-11-27 21:26:10,376 INFO timewheel.engine.executor: callback t453 attempt=1 "
        "timeout: no answer within 2s 2.000s -> retry\n"
        "2026-11-27 21:26:10,400 INFO timewheel.engine.executor: callback t454 attempt=2 "
        "HTTP 503 0.004s -> retry\n"
        "2026-11-27 21:26:11,001 INFO timewheel.engine.executor: callback every2.17 attempt=3 "
        "timeout: no answer within 2s 2.001s -> fail\n")
    at = datetime(2026, 11, 27, 21, 26, 10, 376000).astimezone().timestamp()  # local time
    assert logged_timeouts(log) == [("t453", 1, at), ("every2.17", 3, at + 0.625)]
    assert logged_timeouts(tmp_path / "none.log") == []


def test_a_duplicate_after_the_first_senders_kill_or_stop_is_explained() -> None:
    for kind in ("proc_kill", "proc_stop"):
        c = counts(create("a", T0 + 5), arrival("a", T0 + 5.001, T0 + 5, pid=1),
                   fault(kind, T0 + 5.002, T0 + 13, pid=1),
                   arrival("a", T0 + 9.5, T0 + 5, pid=2, attempt=2), end(T0 + 60))
        assert (c["duplicates_explained"], c["duplicates_unexplained"]) == (1, 0), kind
    # the sender died before the receiver could name it (pid None): a SIGKILL in the window
    c = counts(create("a", T0 + 5), arrival("a", T0 + 5.001, T0 + 5, pid=None),
               fault("proc_kill", T0 + 5.003, T0 + 7, pid=1),
               arrival("a", T0 + 9.5, T0 + 5, pid=2, attempt=2), end(T0 + 60))
    assert (c["duplicates_explained"], c["duplicates_unexplained"]) == (1, 0)
    c = counts(create("a", T0 + 5), arrival("a", T0 + 5.001, T0 + 5, pid=None),
               fault("proc_stop", T0 + 5.003, T0 + 13, pid=1),
               arrival("a", T0 + 9.5, T0 + 5, pid=2, attempt=2), end(T0 + 60))
    assert c["duplicates_unexplained"] == 1  # a stopped process still holds its sockets
    # control: the fault hit the other process
    c = counts(create("a", T0 + 5), arrival("a", T0 + 5.001, T0 + 5, pid=1),
               fault("proc_kill", T0 + 5.002, T0 + 13, pid=2),
               arrival("a", T0 + 9.5, T0 + 5, pid=2, attempt=2), end(T0 + 60))
    assert c["duplicates_unexplained"] == 1


def test_a_duplicate_after_the_first_senders_partition_is_explained() -> None:
    """p0 sent at 5.001 and was cut from Redis from before its send (it could not record the
    outcome; a cut process still sends what it had started) or from just after it; p1
    re-sends once the lease ran out. Not explained when the partition hit p1, or ended before
    p0's attempt could have been sent."""
    def dup_with(partition: dict[str, Any]) -> dict[str, int]:
        return counts(create("a", T0 + 5), partition,
                      arrival("a", T0 + 5.001, T0 + 5, pid=1),
                      arrival("a", T0 + 9.5, T0 + 5, pid=2, attempt=2), end(T0 + 60))

    for start in (T0 - 1.0, T0 + 4.99, T0 + 5.5):  # began 6 s before, just before, after
        c = dup_with(fault("proc_partition", start, T0 + 14, pid=1))
        assert (c["duplicates_explained"], c["duplicates_unexplained"]) == (1, 0), start
    c = dup_with(fault("proc_partition", T0 + 4.99, T0 + 14, pid=2))
    assert c["duplicates_unexplained"] == 1
    c = dup_with(fault("proc_partition", T0 - 9.0, T0 + 2.5, pid=1))  # over before t - timeout
    assert c["duplicates_unexplained"] == 1
    # began after the attempt's outcome was recorded (t + timeout + margin + tick = 10.001)
    c = dup_with(fault("proc_partition", T0 + 10.5, T0 + 20, pid=1))
    assert c["duplicates_unexplained"] == 1
    # a stop that began 6 s before the send explains nothing: a stopped process sends nothing
    c = dup_with(fault("proc_stop", T0 - 1.0, T0 + 14, pid=1))
    assert c["duplicates_unexplained"] == 1


def test_a_put_that_created_the_task_again_after_its_delivery_is_no_duplicate() -> None:
    """A PUT sent before the task was due, held up by a fault until after it was delivered:
    it found the task finished and created it again (201), due at 9. That task's delivery is
    its own first one; a delivery of it again is a duplicate of it."""
    def replace(status: int, t1: float) -> dict[str, Any]:
        return {"type": "op", "op": "replace", "key": "a", "t0": T0 + 1, "t1": t1,
                "status": status, "requested_at": T0 + 9, "execute_at": T0 + 9}

    first, again = arrival("a", T0 + 5.001, T0 + 5), arrival("a", T0 + 9.001, T0 + 9, pid=2)
    c = counts(create("a", T0 + 5), replace(201, T0 + 8), first, again, end(T0 + 60))
    assert (c["duplicates_explained"], c["duplicates_unexplained"]) == (0, 0)
    c = counts(create("a", T0 + 5), replace(201, T0 + 8), first, again,
               arrival("a", T0 + 12, T0 + 9, pid=1, attempt=2), end(T0 + 60))
    assert c["duplicates_unexplained"] == 1  # the new task's own duplicate
    # controls: answered 200 after the first delivery (it replaced a task that had not
    # finished although delivered: the first delivery and this one are the same task's), or
    # 201 before the first delivery
    for write in (replace(200, T0 + 8), replace(201, T0 + 4)):
        c = counts(create("a", T0 + 5), write, first, again, end(T0 + 60))
        assert c["duplicates_unexplained"] == 1, write


def test_a_put_that_replaced_a_task_in_flight_is_no_duplicate() -> None:
    """Seen in a soak (session 22): a PUT held up by a Redis stall replaced the task just as
    its attempt was in flight (its start check passed), answering 200 0.4 ms before that
    attempt reached the receiver. The old version's delivery and the new one's, due at 9, are
    two versions', not a duplicate; the new one delivered again is."""
    put = {"type": "op", "op": "replace", "key": "a", "t0": T0 + 1, "t1": T0 + 5.0006,
           "status": 200, "requested_at": T0 + 9, "execute_at": T0 + 9}
    first, again = arrival("a", T0 + 5.001, T0 + 5), arrival("a", T0 + 9.001, T0 + 9)
    c = counts(create("a", T0 + 5), put, first, again, end(T0 + 60))
    assert (c["duplicates_unexplained"], c["delivered_superseded"]) == (0, 0)
    c = counts(create("a", T0 + 5), put, first, again,
               arrival("a", T0 + 12, T0 + 9, pid=2, attempt=2), end(T0 + 60))
    assert c["duplicates_unexplained"] == 1
    # control: the same version delivered twice is a duplicate, whatever the PUT
    c = counts(create("a", T0 + 5), put, first, arrival("a", T0 + 7, T0 + 5, pid=2, attempt=2),
               end(T0 + 60))
    assert c["duplicates_unexplained"] == 1


def test_a_duplicate_after_a_redis_fault_or_a_receiver_stall_is_explained() -> None:
    base = [create("a", T0 + 5), arrival("a", T0 + 5.001, T0 + 5, pid=1),
            arrival("a", T0 + 12, T0 + 5, pid=2, attempt=2), end(T0 + 60)]
    assert counts(*base, fault("redis_restart", T0 + 5.1, T0 + 6))["duplicates_explained"] == 1
    stall = {"type": "receiver_stall", "start": T0 + 2.9, "end": T0 + 5.0}
    assert counts(*base, stall)["duplicates_explained"] == 1
    short = {"type": "receiver_stall", "start": T0 + 4.5, "end": T0 + 5.0}  # < a timeout
    assert counts(*base, short)["duplicates_unexplained"] == 1
    late = fault("redis_restart", T0 + 30, T0 + 31)  # long after the first was recorded
    assert counts(*base, late)["duplicates_unexplained"] == 1


def test_an_occurrence_fired_twice_is_counted() -> None:
    put = {"type": "op", "op": "schedule_put", "key": "s", "t0": T0, "t1": T0, "status": 201}
    key = f"s.{int((T0 + 4) * 1000)}"
    c = counts(put, arrival(key, T0 + 4.001, T0 + 4),
               arrival(key, T0 + 8, T0 + 4, pid=2), end(T0 + 60))
    assert c["occurrences_fired_twice"] == 1 and c["duplicates_unexplained"] == 1
    assert counts(put, arrival(key, T0 + 4.001, T0 + 4), end(T0 + 60))["phantom"] == 0


def test_delivered_after_a_cancel_unless_in_flight() -> None:
    after = counts(create("a", T0 + 5), cancel("a", T0 + 3), arrival("a", T0 + 5, T0 + 5),
                   end(T0 + 60))
    assert after["delivered_after_cancel"] == 1
    # in flight: due before the DELETE's answer and arriving within a timeout of it
    in_flight = counts(create("a", T0 + 5), cancel("a", T0 + 5.01),
                       arrival("a", T0 + 5.02, T0 + 5), end(T0 + 60))
    assert in_flight["delivered_after_cancel"] == 0
    # due before, but arriving later than a timeout after: it started after the answer
    late = counts(create("a", T0 + 5), cancel("a", T0 + 5.01),
                  arrival("a", T0 + 9, T0 + 5), end(T0 + 60))
    assert late["delivered_after_cancel"] == 1


def test_an_occurrence_after_its_schedules_delete_is_delivered_after_cancel() -> None:
    put = {"type": "op", "op": "schedule_put", "key": "s", "t0": T0, "t1": T0, "status": 201}
    gone = {"type": "op", "op": "schedule_delete", "key": "s", "t0": T0 + 9, "t1": T0 + 10,
            "status": 204}
    key = f"s.{int((T0 + 12) * 1000)}"
    assert counts(put, gone, arrival(key, T0 + 12, T0 + 12),
                  end(T0 + 60))["delivered_after_cancel"] == 1
    before = f"s.{int((T0 + 8) * 1000)}"
    assert counts(put, gone, arrival(before, T0 + 8, T0 + 8),
                  end(T0 + 60))["delivered_after_cancel"] == 0


def test_a_delivery_of_a_key_never_written_is_a_phantom() -> None:
    assert counts(arrival("z", T0 + 1, T0 + 1), end(T0 + 60))["phantom"] == 1
    refused = create("z", T0 + 1, status=422)
    assert counts(refused, arrival("z", T0 + 1, T0 + 1), end(T0 + 60))["phantom"] == 1
    unsure = create("z", T0 + 1, status=None)
    assert counts(unsure, arrival("z", T0 + 1, T0 + 1), end(T0 + 60))["phantom"] == 0


def test_lateness_is_split_by_fault_windows_and_slow_recovery_is_reported() -> None:
    summary = run(create("a", T0 + 5), arrival("a", T0 + 5.010, T0 + 5),
                  create("b", T0 + 40), arrival("b", T0 + 44.5, T0 + 40),
                  fault("redis_restart", T0 + 39.9, T0 + 41), end(T0 + 90))
    assert summary["lateness_outside_faults"]["max_ms"] == 10.0
    assert summary["lateness_in_fault_windows"]["max_ms"] == 4500.0
    slow = summary["details"]["slow_recovery"]
    assert [s["key"] for s in slow] == ["b"] and summary["failed"] == []


def test_the_replaced_version_delivered_after_the_put_answered_is_reported() -> None:
    put = create("a", T0 + 9, t0=T0 + 2)
    put["op"], put["status"] = "replace", 200
    stale = counts(create("a", T0 + 5), put, arrival("a", T0 + 5, T0 + 5),
                   arrival("a", T0 + 9, T0 + 9), end(T0 + 60))
    assert stale["delivered_superseded"] == 1
    fine = counts(create("a", T0 + 5), put, arrival("a", T0 + 9, T0 + 9), end(T0 + 60))
    assert fine["delivered_superseded"] == 0 and fine["lost"] == 0


def test_a_newer_versions_duplicate_is_not_hidden_by_an_older_versions_late_arrival() -> None:
    """(A review's case.) V1, due 5, set by a PUT 200, is in flight when a PUT 200 at 7.5
    replaces it by V2, due 9. V2 arrives at 9.0, V1's attempt at 9.2 (within a timeout of the
    PUT: not superseded), and V2 again at 9.5 from another process: a duplicate of V2."""
    def put200(t1: float, due: float) -> dict[str, Any]:
        return {"type": "op", "op": "replace", "key": "a", "t0": t1 - 0.5, "t1": t1,
                "status": 200, "requested_at": due, "execute_at": due}

    c = counts(create("a", T0 + 20), put200(T0 + 2, T0 + 5), put200(T0 + 7.5, T0 + 9),
               arrival("a", T0 + 9.0, T0 + 9),
               arrival("a", T0 + 9.2, T0 + 5, pid=1, attempt=2),
               arrival("a", T0 + 9.5, T0 + 9, pid=2, attempt=2), end(T0 + 60))
    assert (c["delivered_superseded"], c["duplicates_unexplained"]) == (0, 1)


def test_a_newer_versions_duplicate_is_explained_only_by_its_own_first_delivery() -> None:
    """(A review's case.) V2's second arrival came after V1's late one: it was judged against
    V1's arrival, so V1's sender's stop explained a duplicate sent by another process."""
    def put200(t1: float, due: float) -> dict[str, Any]:
        return {"type": "op", "op": "replace", "key": "a", "t0": t1 - 0.5, "t1": t1,
                "status": 200, "requested_at": due, "execute_at": due}

    base = [create("a", T0 + 20), put200(T0 + 2, T0 + 5), put200(T0 + 7.5, T0 + 9),
            arrival("a", T0 + 9.0, T0 + 9, pid=2, attempt=1),
            arrival("a", T0 + 9.2, T0 + 5, pid=1, attempt=2),
            arrival("a", T0 + 9.5, T0 + 9, pid=2, attempt=2), end(T0 + 60)]
    assert counts(*base)["duplicates_unexplained"] == 1
    c = counts(*base, fault("proc_stop", T0 + 7.6, T0 + 9.15, pid=1))
    assert (c["duplicates_unexplained"], c["duplicates_explained"]) == (1, 0)


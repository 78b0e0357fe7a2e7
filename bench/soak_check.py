"""The soak's checker: reads a history (bench/soak_history.py) and says what went wrong.

    python -m bench.soak_check HISTORY.jsonl [--json OUT.json]

Definitions (every bound comes from the run's settings in the ``meta`` record):

- acknowledged: a create/replace answered 201 or 200. A write with no answer or a 5xx is
  *indeterminate* (it may or may not have been stored): its key is never counted lost, and a
  delivery of it is no surprise.
- LOST: acknowledged, no acknowledged or indeterminate cancel after its last acknowledged
  write, and no arrival answered 2xx by the end of the history, which runs at least
  ``bound_s`` past the task's due time.
- EARLY: an arrival before its ``timewheel-scheduled-at`` by more than ``early_slack_s`` (the
  receiver and the service read the same host clock; the service's estimate may lag by a
  Redis round trip). Also: an acknowledged execute_at below the requested one (the service must
  round up to the millisecond, never down).
- duplicate: an arrival of a webhook-id that was already answered 2xx, unless it is the
  first delivery of a new task under the same key (a PUT answered 201 after the first 2xx,
  due at the arrival's scheduled-at: the PUT found the task finished and created it again;
  that task's own duplicates are counted from it). Explained by a process
  fault when the process that sent the first 2xx-answered attempt was killed or stopped while
  that attempt could still be unrecorded: from one task timeout before its arrival (a process
  killed or stopped before the receiver read the request had sent it before) to ``timeout +
  lease margin + tick`` after (the dispatcher retries recording an outcome that long), or was
  cut from Redis (a partition) at any time in that window; when
  the sender is unknown (no live process owned the connection when the receiver looked, a
  few ms after the accept: it had died), by a SIGKILL in that same window; explained by a
  Redis fault when one (restart, stall, failover, migration) overlaps that window or the
  second before it (appendfsync everysec may lose the last second of writes); by the receiver when
  its loop did not run for about a task timeout or more right before it read the first 2xx
  attempt (the request waited in its socket; the sender may have timed out before the
  answer); by the sender of the duplicate itself when it logged that attempt as written after
  its send-by (a ``late_write`` record: it was paused between its last check and the write, a
  window no check can close) and the first 2xx came once that sender's lease could have run
  out (before it, another process held the task during the lease: a double claim). A stopped
  process that sends without having checked again logs nothing and stays unexplained; by a
  timeout when the lower-numbered attempt of the two was logged as timed out by its sender
  (a ``timed_out`` record) and the receiver named no other sender for it, and each attempt
  from it up to the higher one timed out (logged) or was answered non-2xx, each timeout
  logged by one process only, after the task was due and before the higher attempt arrived:
  the receiver read the attempt only after its sender had given up (a receiver behind on its
  backlog, with no single long stall), and the retry that at-least-once asks for arrived too.
  Otherwise UNEXPLAINED.
- delivered after cancel: an arrival after a DELETE answered 204, unless the attempt was in
  flight when the DELETE returned. In flight = it could have started before the answer (its
  scheduled-at is not after it) and it reached the receiver within one task timeout of it
  (an attempt sent before the answer arrives within its timeout or not at all). The same
  rule for occurrences after their schedule's DELETE.
- lateness: first arrival of each key minus its scheduled-at; "in a fault window" when the
  due time falls within [fault start - tick, fault end + timeout + lease margin + tick].
- slow recovery (reported, not a failure): a task due while Redis was away (restart, stall,
  failover, migration: due within [start - tick, end]) whose first attempt reached the
  receiver more than two ticks after Redis was back and it was due: it waited for a lease to
  run out instead of being sent once Redis answered.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench.common import summary_ms
from bench.soak_history import Event, read
from timewheel.engine.attempt import SEND_SAFETY_MS

PROCESS_FAULTS = {"proc_kill", "proc_stop", "proc_partition"}
# The receiver's clock against the service's estimate of Redis's (on this host): a margin for
# the lease end a late write's log line implies.
LEASE_END_SLACK_S = 0.05
# A logged timeout's time is its log line's (to the millisecond, written just after the
# timeout, on this host's clock): how far it may be from the arrivals' times.
TIMEOUT_LOG_SLACK_S = 0.05
ACKED = {200, 201}


def _is_indeterminate(status: int | None) -> bool:
    return status is None or status >= 500


def _occurrence_schedule(key: str, schedules: set[str]) -> str | None:
    head, dot, tail = key.rpartition(".")
    return head if dot and tail.isdigit() and head in schedules else None


class Checker:
    def __init__(self, events: list[Event]) -> None:
        self.writes_by_key: dict[str, list[Event]] = {}  # key -> its writes (run)
        self.meta: dict[str, Any] = next((e for e in events if e["type"] == "meta"), {})
        self.timeout = float(self.meta.get("task_timeout_s", 10.0))
        self.margin = float(self.meta.get("lease_margin_s", 5.0))
        self.tick = float(self.meta.get("tick_s", 1.0))
        self.slack = float(self.meta.get("early_slack_s", 0.02))
        self.bound = float(self.meta.get("bound_s", 60.0))
        self.ops = [e for e in events if e["type"] == "op"]
        self.arrivals = sorted((e for e in events if e["type"] == "arrival"), key=lambda e: e["t"])
        self.faults = sorted((e for e in events if e["type"] == "fault"),
                             key=lambda e: e["start"])
        self.procs = [e for e in events if e["type"] == "proc"]
        # the receiver's own stalls: a request read late may have been answered too late
        self.stalls = [e for e in events if e["type"] == "receiver_stall"
                       and e["end"] - e["start"] >= self.timeout - 0.2]
        ends = [e.get("t1") or e.get("t0") or 0 for e in self.ops]
        ends += [e["t"] for e in self.arrivals] + [e.get("end") or 0 for e in self.faults]
        ends += [e["t"] for e in events if e["type"] == "end"]
        self.end = float(self.meta.get("observed_until") or max(ends, default=0.0))
        self.proc_of_pid = {p["pid"]: p["name"] for p in self.procs}
        self.late_writes = {(e["pid"], e["key"], e["attempt"]): e for e in events
                            if e["type"] == "late_write"}
        self.timed_out: dict[tuple[str, int], list[Event]] = defaultdict(list)
        for e in events:
            if e["type"] == "timed_out":
                self.timed_out[e["key"], e["attempt"]].append(e)
        self.schedules = {e["key"] for e in self.ops if e["op"] == "schedule_put"}

    # -- helpers ---------------------------------------------------------------------------

    def _record_window(self, t: float) -> tuple[float, float]:
        """While the attempt that arrived at ``t`` may still be unrecorded."""
        return t, t + self.timeout + self.margin + self.tick

    def _explain(self, first: Event) -> str | None:
        for g in self.stalls:
            if g["start"] <= first["t"] <= g["end"] + 0.1:
                return (f"receiver_stall {g['start']:.3f}-{g['end']:.3f}: its 2xx may have "
                        "come after the sender's timeout")
        lo, hi = self._record_window(first["t"])
        pid = first.get("pid")
        for f in self.faults:
            if f["kind"] not in PROCESS_FAULTS or not self._overlaps(f, lo - self.timeout, hi):
                continue
            if pid is not None and f.get("pid") == pid:
                return f"{f['kind']} of {f['target']} at {f['start']:.3f}"
            if pid is None and f["kind"] == "proc_kill":
                return (f"proc_kill of {f['target']} at {f['start']:.3f} (sender unknown: no "
                        "live process owned the connection when the receiver looked)")
        for f in self.faults:
            end = f.get("end") or self.end
            if f["kind"] not in PROCESS_FAULTS and f["start"] <= hi and end >= lo - 1.0:
                return f"{f['kind']} {f['target']} {f['start']:.3f}-{end:.3f}"
        return None

    def _overlaps(self, fault: Event, lo: float, hi: float) -> bool:
        """A kill or stop began within [lo, hi] (a stopped process sends nothing until it
        resumes); a partition was on at any time in it (a process cut from Redis still sends
        what it had started, and cannot record its outcome)."""
        if fault["kind"] == "proc_partition":
            return bool(fault["start"] <= hi and (fault.get("end") or self.end) >= lo)
        return bool(lo <= fault["start"] <= hi)

    def _written_late(self, first: Event, dup: Event) -> str | None:
        """The duplicate's own sender logged it as written after its send-by, and the first
        2xx came when that sender's lease could have run out (another process may claim the
        task only then: an earlier one is a double claim, which no pause explains)."""
        late = self.late_writes.get((dup.get("pid"), dup["key"], dup.get("attempt")))
        if late is None:
            return None
        # The write was at about the arrival; the lease runs out this long after the send-by
        # (timewheel/engine/attempt.py ``Attempt.claimed``).
        send_by = dup["t"] - late["late_ms"] / 1000.0
        lease_end = send_by + self.timeout + min(self.margin / 2, SEND_SAFETY_MS / 1000.0)
        if first["t"] < lease_end - LEASE_END_SLACK_S:
            return None
        return (f"written {late['late_ms']} ms after its send-by by {self._who(dup)} (logged: "
                "paused between its last check and the write)")

    def _timed_out(self, first: Event, dup: Event, group: list[Event]) -> str | None:
        """A retry after a timeout: the lower-numbered attempt of the two timed out at its
        sender (logged), and so did each attempt after it up to the higher one, or answered
        non-2xx; each timeout logged by one process only, after the task was due and before
        the higher attempt arrived (a retry goes out only after its predecessor gave up); and
        the receiver named no other sender for the lower attempt (none: its sender had closed
        the connection when the receiver looked)."""
        early, late = sorted((first, dup), key=lambda a: a.get("attempt") or 0)
        if not early.get("attempt") or early["attempt"] >= late.get("attempt", 0):
            return None
        due = early.get("scheduled_at") or 0.0
        failed = {a.get("attempt") for a in group if not 200 <= a["answered"] < 300}
        sender = None
        for n in range(early["attempt"], late["attempt"]):
            senders = {e["pid"] for e in self.timed_out.get((early["key"], n), [])
                       if due - TIMEOUT_LOG_SLACK_S <= e["t"] <= late["t"] + TIMEOUT_LOG_SLACK_S}
            if len(senders) > 1:  # one attempt sent by two processes: a double claim
                return None
            if n == early["attempt"]:
                if not senders or early.get("pid") not in (None, *senders):
                    return None
                sender = senders.pop()
            elif not senders and n not in failed:
                return None
        return (f"attempt {early['attempt']} timed out at {self.proc_of_pid.get(sender, '?')} "
                f"(pid {sender}, logged) and was retried; the receiver read it after its sender "
                "had given up")

    def _in_fault_window(self, due: float) -> bool:
        after = self.timeout + self.margin + self.tick
        return any(f["start"] - self.tick <= due <= (f.get("end") or self.end) + after
                   for f in self.faults)

    def _slow_recovery(self, firsts: dict[str, Event]) -> list[dict[str, Any]]:
        out = []
        for f in self.faults:
            if f["kind"] in PROCESS_FAULTS:
                continue
            end = f.get("end") or self.end
            for key, a in firsts.items():
                due = a.get("scheduled_at")
                if due is None or not f["start"] - self.tick <= due <= end:
                    continue
                after = a["t"] - max(due, end)
                if after > 2 * self.tick:
                    out.append({"key": key, "fault": f"{f['kind']} {f['start']:.3f}-{end:.3f}",
                                "due": due, "first_arrival": round(a["t"], 3),
                                "after_redis_back_s": round(after, 3)})
        return out

    def _who(self, arrival: Event) -> str:
        pid = arrival.get("pid")
        return f"{self.proc_of_pid.get(pid, '?')}(pid {pid})"

    def _faults_of(self, pid: int | None, lo: float, hi: float) -> list[str]:
        return [f"{f['kind']} {f['start']:.3f}-{(f.get('end') or 0):.3f}" for f in self.faults
                if pid is not None and f.get("pid") == pid and f["start"] <= hi
                and (f.get("end") or self.end) >= lo]

    # -- the check -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        by_key: dict[str, list[Event]] = defaultdict(list)
        for op in self.ops:
            if op["op"] in ("create", "replace", "cancel"):
                by_key[op["key"]].append(op)
        arrivals: dict[str, list[Event]] = defaultdict(list)
        for a in self.arrivals:
            arrivals[a["key"]].append(a)
        out: dict[str, Any] = {"lost": [], "early": [], "rounded_down": [], "phantom": [],
                               "after_cancel": [], "superseded": [], "late_beyond_bound": [],
                               "duplicates_explained": [], "duplicates_unexplained": []}
        tally: Counter[str] = Counter()
        self.writes_by_key = by_key
        for key, ops in by_key.items():
            self._task(key, sorted(ops, key=lambda e: e["t0"]), arrivals.get(key, []), out,
                       tally)
        for op in self.ops:
            if op["op"] == "schedule_delete" and op.get("status") == 204:
                occ = [a for k, group in arrivals.items()
                       if _occurrence_schedule(k, {op["key"]}) for a in group]
                self._after_cancel(op["key"], op["t1"], sorted(occ, key=lambda a: a["t"]), out)
        late_in: list[float] = []
        late_out: list[float] = []
        for key, group in arrivals.items():
            is_occ = _occurrence_schedule(key, self.schedules) is not None
            tally["occurrences"] += is_occ
            if not is_occ and key not in by_key:
                out["phantom"].append({"key": key, "arrivals": len(group)})
            self._early(key, group, out)
            first = group[0]
            if first.get("scheduled_at") is not None:
                lateness = first["t"] - first["scheduled_at"]
                (late_in if self._in_fault_window(first["scheduled_at"]) else late_out).append(
                    lateness)
            tally["occurrence_dups"] += is_occ * self._duplicates(key, group, out)
        out["slow_recovery"] = self._slow_recovery({k: g[0] for k, g in arrivals.items()})
        return self._summary(out, tally, late_in, late_out)

    def _task(self, key: str, ops: list[Event], arrivals: list[Event], out: dict[str, Any],
              tally: Counter[str]) -> None:
        """Lost, cancelled, indeterminate, phantom and rounded-down, for one task key."""
        writes = [o for o in ops if o["op"] != "cancel"]
        acked_writes = [o for o in writes if o.get("status") in ACKED]
        for o in acked_writes:
            req, got = o.get("requested_at"), o.get("execute_at")
            if req is not None and got is not None and got < req - 1e-9:
                out["rounded_down"].append({"key": key, "requested_at": req, "execute_at": got})
        got_2xx = [a for a in arrivals if 200 <= a["answered"] < 300]
        if not acked_writes:
            if arrivals and not any(_is_indeterminate(o.get("status")) for o in writes):
                out["phantom"].append({"key": key, "arrivals": len(arrivals)})
            return
        tally["acked"] += 1
        tally["delivered"] += bool(got_2xx)
        self._superseded(key, acked_writes, arrivals, out)
        last = acked_writes[-1]
        later = [o for o in ops if o["t0"] > last["t0"]]
        cancel_ok = [o for o in later if o["op"] == "cancel" and o.get("status") == 204]
        for c in cancel_ok:
            self._after_cancel(key, c["t1"], arrivals, out)
        if cancel_ok:
            tally["cancelled"] += 1
            return
        if any(_is_indeterminate(o.get("status")) for o in later):
            tally["indeterminate"] += 1
            return
        dues = [o["execute_at"] for o in writes[writes.index(last):]
                if o.get("execute_at") is not None]
        due = max(dues) if dues else last["t1"]
        if not got_2xx:
            out["lost"].append({"key": key, "due": due, "acked_at": last["t1"],
                                "observed_for_s": round(self.end - due, 3),
                                "arrivals": [(a["t"], a["answered"]) for a in arrivals]})
        elif got_2xx[0]["t"] > due + self.bound:
            out["late_beyond_bound"].append({"key": key, "due": due,
                                             "delivered": got_2xx[0]["t"]})

    def _superseded(self, key: str, writes: list[Event], arrivals: list[Event],
                    out: dict[str, Any]) -> None:
        """An arrival of a version that a PUT had replaced when it was answered (by its
        scheduled-at), unless it was in flight then (the rule of a DELETE's answer)."""
        for old, new in pairwise(writes):
            was = old.get("execute_at")
            if was is None or was == new.get("execute_at"):
                continue
            for a in arrivals:
                sched = a.get("scheduled_at")
                if sched is None or abs(sched - was) > 0.0005 or a["t"] <= new["t1"]:
                    continue
                if not (sched <= new["t1"] and a["t"] <= new["t1"] + self.timeout):
                    out["superseded"].append({"key": key, "replaced_at": round(new["t1"], 3),
                                              "arrival": round(a["t"], 3), "scheduled_at": sched,
                                              "sender": self._who(a)})

    def _early(self, key: str, group: list[Event], out: dict[str, Any]) -> None:
        for a in group:
            sched = a.get("scheduled_at")
            if sched is None or a["t"] < sched - self.slack:
                out["early"].append({"key": key, "t": a["t"], "scheduled_at": sched,
                                     "by_ms": None if sched is None
                                     else round((sched - a["t"]) * 1000, 3),
                                     "sender": self._who(a)})

    def _duplicates(self, key: str, group: list[Event], out: dict[str, Any],
                    earlier: tuple[Event, ...] = ()) -> int:
        """Every arrival after the first one answered 2xx; how many. ``earlier``: the key's
        arrivals before ``group`` (a new version is counted from its own first delivery)."""
        ok = next((i for i, a in enumerate(group) if 200 <= a["answered"] < 300), None)
        if ok is None:
            return 0
        first = group[ok]
        for n, dup in enumerate(group[ok + 1:], start=ok + 1):
            # The delivery of its own version before it, if any (an older version's late
            # arrival may come between two of a newer one's): the duplicate is of that one,
            # and only that one's sender and faults may explain it.
            before = (*earlier, *group[:n])
            same = next((a for a in before if a.get("scheduled_at") == dup.get("scheduled_at")
                         and 200 <= a["answered"] < 300), None)
            if same is None and self._recreated(key, first, dup):  # a task of its own
                return n - ok - 1 + self._duplicates(key, group[n:], out, before)
            base = same or first
            dup_why = (self._explain(base) or self._written_late(base, dup)
                       or self._timed_out(base, dup, group))
            entry = {"key": key, "first": round(base["t"], 3), "first_sender": self._who(base),
                     "first_attempt": base.get("attempt"), "again": round(dup["t"], 3),
                     "again_sender": self._who(dup), "again_attempt": dup.get("attempt"),
                     "scheduled_at": dup.get("scheduled_at"), "explained_by": dup_why}
            if dup_why is None:
                entry["again_sender_faults"] = self._faults_of(
                    dup.get("pid"), group[0]["t"] - self.bound, dup["t"])
            out["duplicates_explained" if dup_why else "duplicates_unexplained"].append(entry)
        return len(group) - ok - 1

    def _recreated(self, key: str, first: Event, dup: Event) -> bool:
        """``dup`` is the first delivery of a new version under the same key, due when
        ``dup`` says: a PUT or create answered 201 (it created the task, so the one before
        had finished) after ``first`` arrived (a replace held up by a fault answers so when it
        runs only after the task it meant to replace was delivered); or a PUT answered 200
        (it replaced a task not finished) before ``first``, another version, arrived: that
        one was in flight when the PUT ran (its start check passed: a PUT cannot stop it, as
        a DELETE cannot; ``_superseded`` bounds how late it may arrive)."""
        sched = dup.get("scheduled_at")
        if sched is None:
            return False
        for o in self.writes_by_key.get(key, []):
            if o["op"] == "cancel" or o.get("execute_at") is None \
                    or abs(o["execute_at"] - sched) > 0.0005:
                continue
            if o.get("status") == 201 and o["t1"] >= first["t"]:
                return True
            if (o["op"] == "replace" and o.get("status") == 200 and o["t1"] < first["t"]
                    and first.get("scheduled_at") != sched):
                return True
        return False

    def _summary(self, out: dict[str, Any], tally: Counter[str], late_in: list[float],
                 late_out: list[float]) -> dict[str, Any]:
        faults = Counter(f["kind"] for f in self.faults)
        return {
            "tasks_acknowledged": tally["acked"],
            "tasks_delivered": tally["delivered"],
            "tasks_cancelled": tally["cancelled"],
            "tasks_indeterminate_cancel_or_write": tally["indeterminate"],
            "occurrence_keys_delivered": tally["occurrences"],
            "arrivals": len(self.arrivals),
            "ops": dict(Counter(f"{o['op']} {o.get('status')}" for o in self.ops)),
            "faults_by_kind": dict(sorted(faults.items())),
            "faults": len(self.faults),
            "faults_failed": sum(1 for f in self.faults if f.get("error")),
            "slot_migrations": _migrations(self.faults),
            "receiver_stalls": len(self.stalls),
            "counts": {
                "lost": len(out["lost"]), "early": len(out["early"]),
                "rounded_down": len(out["rounded_down"]), "phantom": len(out["phantom"]),
                "duplicates_explained": len(out["duplicates_explained"]),
                "duplicates_unexplained": len(out["duplicates_unexplained"]),
                "occurrences_fired_twice": tally["occurrence_dups"],
                "delivered_after_cancel": len(out["after_cancel"]),
                "delivered_superseded": len(out["superseded"]),
                "late_beyond_bound": len(out["late_beyond_bound"]),
                "slow_recovery": len(out["slow_recovery"]),
            },
            "lateness_outside_faults": summary_ms(late_out),
            "lateness_in_fault_windows": summary_ms(late_in),
            "details": out,
        }

    def _after_cancel(self, key: str, acked_at: float, group: list[Event],
                      out: dict[str, Any]) -> None:
        for a in group:
            if a["t"] <= acked_at:
                continue
            sched = a.get("scheduled_at")
            in_flight = sched is not None and sched <= acked_at and \
                a["t"] <= acked_at + self.timeout
            if not in_flight:
                out["after_cancel"].append({"key": key, "cancel_acked": round(acked_at, 3),
                                            "arrival": round(a["t"], 3), "scheduled_at": sched,
                                            "sender": self._who(a)})


FAILING = ("lost", "early", "rounded_down", "phantom", "duplicates_unexplained",
           "delivered_after_cancel", "delivered_superseded")


def check(events: list[Event]) -> dict[str, Any]:
    summary = Checker(events).run()
    summary["failed"] = [k for k in FAILING if summary["counts"][k]]
    return summary


def _migrations(faults: list[Event]) -> dict[str, int]:
    """Slot migrations: completed at once, broken off and finished forward, failed (left
    open or never started: the run fails on those as on any fault not injected)."""
    moves = [f for f in faults if f["kind"] == "slot_migration"]
    return {"completed": sum(1 for f in moves if not f.get("error") and not f.get("broke_off")),
            "finished_after_break": sum(1 for f in moves
                                        if not f.get("error") and f.get("broke_off")),
            "failed": sum(1 for f in moves if f.get("error"))}


def _ms(summary: dict[str, Any]) -> str:
    if not summary.get("count"):
        return "-"
    return f"{summary['p50_ms']:.0f} / {summary['p99_ms']:.0f} / {summary['max_ms']:.0f}"


def table(summary: dict[str, Any]) -> str:
    c = summary["counts"]
    rows = [
        ("tasks acknowledged (201/200)", summary["tasks_acknowledged"]),
        ("  delivered (2xx)", summary["tasks_delivered"]),
        ("  cancelled (DELETE 204)", summary["tasks_cancelled"]),
        ("  cancel or write indeterminate", summary["tasks_indeterminate_cancel_or_write"]),
        ("schedule occurrences delivered", summary["occurrence_keys_delivered"]),
        ("arrivals at the receiver", summary["arrivals"]),
        ("receiver stalls >= timeout (instrument)", summary["receiver_stalls"]),
        ("faults injected", ", ".join(f"{k} {v}" for k, v in summary["faults_by_kind"].items())
         or "none"),
        *([("  slot migrations: ok / finished / failed",
            " / ".join(str(v) for v in summary["slot_migrations"].values()))]
          if any(summary["slot_migrations"].values()) else []),
        ("LOST", c["lost"]),
        ("EARLY", c["early"]),
        ("execute_at rounded down", c["rounded_down"]),
        ("delivered, never written (phantom)", c["phantom"]),
        ("duplicates explained", c["duplicates_explained"]),
        ("duplicates UNEXPLAINED", c["duplicates_unexplained"]),
        ("  of both, schedule occurrences", c["occurrences_fired_twice"]),
        ("delivered after DELETE 204", c["delivered_after_cancel"]),
        ("replaced version delivered after the PUT", c["delivered_superseded"]),
        ("delivered later than due + bound", c["late_beyond_bound"]),
        ("sent > 2 ticks after Redis was back", c["slow_recovery"]),
        ("lateness p50/p99/max ms, outside faults",
         f"{_ms(summary['lateness_outside_faults'])} "
         f"(n={summary['lateness_outside_faults']['count']})"),
        ("lateness p50/p99/max ms, in fault windows",
         f"{_ms(summary['lateness_in_fault_windows'])} "
         f"(n={summary['lateness_in_fault_windows']['count']})"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    for kind in ("duplicates_unexplained", "after_cancel", "superseded", "lost", "early",
                 "phantom", "slow_recovery"):
        for item in summary["details"][kind][:5]:
            lines.append(f"  {kind}: {json.dumps(item)}")
    lines.append("RESULT: " + ("FAIL " + ", ".join(summary["failed"]) if summary["failed"]
                               else "ok"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak_check")
    p.add_argument("history", type=Path)
    p.add_argument("--json", type=Path, help="write the summary here")
    args = p.parse_args(argv)
    events = read(args.history)
    arrivals = args.history.with_name("arrivals.jsonl")  # the receiver's, beside it (soak.py)
    if arrivals.exists():
        events += read(arrivals)
    summary = check(events)
    print(table(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

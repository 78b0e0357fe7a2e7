"""What the receiver's records say: lateness, losses, duplicates, retries; the printed table."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from typing import Any

from bench.common import summary_ms

FAIL_SUFFIX = "-f503"  # webhook-ids ending in this get one 503 from the receiver (retry workload)


def epoch(rfc3339: str | None) -> float | None:
    if not rfc3339:
        return None
    try:
        return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def analyse(records: list[list[Any]], due: dict[str, float],
            done_at: dict[str, float]) -> dict[str, Any]:
    """First-attempt lateness and delivery accounting of one workload.

    Record fields: t, id, attempt, scheduled_at, status, method, path (see bench.receiver).
    """
    first: dict[str, float] = {}
    attempt1_count: Counter[str] = Counter()
    delivered: set[str] = set()
    unexpected = later_attempts = sched_missing = sched_mismatch = 0
    for t, wid, attempt, sched, status, _method, _path in records:
        if wid not in due:
            unexpected += 1
            continue
        if status == 200:
            delivered.add(wid)
        if attempt not in (None, 1):
            later_attempts += 1
            continue
        attempt1_count[wid] += 1
        first[wid] = min(t, first.get(wid, t))
        s = epoch(sched)
        sched_missing += s is None
        # The header carries execute_at rounded up to its millisecond (microsecond inputs).
        due_ms = math.ceil(due[wid] * 1000 - 0.0005) / 1000  # 0.0005: float noise, not a us
        sched_mismatch += s is not None and abs(s - due_ms) > 0.0005
    late = [first[k] - due[k] for k in first]
    early = [k for k in first if first[k] < due[k]]
    submitted_late = {k for k in first if done_at.get(k, 0.0) > due[k]}
    out: dict[str, Any] = {
        "tasks": len(due),
        "arrived": len(first),
        "delivered_2xx": len(delivered),
        "lost": len(due) - len(first),
        "lost_keys_sample": sorted(set(due) - set(first))[:10],
        "early": len(early),
        "early_worst_ms": round(min(first[k] - due[k] for k in early) * 1000, 3) if early else None,
        "duplicates": sum(1 for c in attempt1_count.values() if c > 1),
        "duplicate_requests": sum(c - 1 for c in attempt1_count.values() if c > 1),
        "later_attempts": later_attempts,
        "unexpected_requests": unexpected,
        "scheduled_at_header_missing": sched_missing,
        "scheduled_at_header_mismatch": sched_mismatch,
        "submitted_after_due": len(submitted_late),
        "lateness": summary_ms(late),
    }
    if submitted_late:
        out["lateness_excluding_submitted_after_due"] = summary_ms(
            [first[k] - due[k] for k in first if k not in submitted_late])
    # p99 per second of the due window: does lateness grow as the run goes on?
    if due and first:
        t0 = min(due.values())
        buckets: dict[int, list[float]] = {}
        for k in first:
            buckets.setdefault(int(due[k] - t0), []).append(first[k] - due[k])
        out["p99_ms_by_second"] = {
            str(b): summary_ms(v)["p99_ms"] for b, v in sorted(buckets.items())}
    out["_first"] = first  # internal: stripped before writing
    return out


def analyse_retries(records: list[list[Any]], due: dict[str, float],
                     probes: dict[str, dict[str, Any]], backoff: float) -> dict[str, Any]:
    a1: dict[str, float] = {}
    a2: dict[str, float] = {}
    ok: set[str] = set()
    for t, wid, attempt, _s, status, _m, _p in records:
        if wid not in due or not wid.endswith(FAIL_SUFFIX):
            continue
        if status == 200:
            ok.add(wid)
        if attempt == 1 and status == 503:
            a1[wid] = min(t, a1.get(wid, t))
        elif attempt == 2:
            a2[wid] = min(t, a2.get(wid, t))
    failing = [k for k in due if k.endswith(FAIL_SUFFIX)]
    gaps = [a2[k] - a1[k] for k in a2 if k in a1]
    probed = {k: p for k, p in probes.items() if p.get("next_attempt_at") is not None}
    vs_intended = [a2[k] - p["next_attempt_at"] for k, p in probed.items() if k in a2]
    chosen = [(p["next_attempt_at"] - p["attempt1"]) / backoff for p in probed.values()]
    seen_retrying = [p["read_at"] - p["attempt1"] for p in probed.values()]
    return {
        "failing_tasks": len(failing),
        "answered_503": len(a1),
        "second_attempt_arrived": len(a2),
        "failing_tasks_delivered_2xx": len(ok & set(failing)),
        "gap_attempt2_minus_attempt1": summary_ms(gaps),
        "gap_minus_nominal_backoff": summary_ms([g - backoff for g in gaps]),
        "probed": len(probed),
        "probe_failed": len(probes) - len(probed),
        "probe_failed_statuses_seen": dict(Counter(
            str(p.get("view_status")) for p in probes.values()
            if p.get("next_attempt_at") is None)),
        "probe_failed_sample": [
            {"key": k, "statuses_seen": p.get("view_status"),
             "next_attempt_at": p.get("last_next_attempt_at")}
            for k, p in probes.items() if p.get("next_attempt_at") is None][:5],
        "attempt2_minus_intended_next_attempt_at": summary_ms(vs_intended),
        "early_retries": sum(1 for x in vs_intended if x < 0),
        # upper bound of how long the service took to record the 503 (probe polling adds <=25 ms
        # plus the receiver poll interval of 100 ms)
        "retrying_visible_after_attempt1": summary_ms(seen_retrying),
        "chosen_backoff_over_nominal": {
            "min": round(min(chosen), 4) if chosen else None,
            "max": round(max(chosen), 4) if chosen else None,
        },
        "note": ("attempt2_minus_intended_next_attempt_at is the retry lateness against the "
                 "next_attempt_at the service reported (GET /tasks/{key} read between the 503 and "
                 "the retry), so the service's jitter is not counted as lateness. The gaps are raw "
                 "arrival(attempt 2) - arrival(attempt 1) and include backoff, jitter and the time "
                 "the service took to record the 503."),
    }


def attribute_tail(first: dict[str, float], due: dict[str, float],
                   tail: dict[str, Any]) -> dict[str, Any]:
    """Set the receiver's late arrivals against what the probe saw (bench.service.RunProbe):
    a GC pause of the service overlapping [due, arrival], the CPU steal of the due second.

    What is left once those are accounted for is the service's own (or the loopback's)."""
    samples: list[tuple[float, float]] = [tuple(x) for x in tail["steal"]["samples"]]
    steal_by_second: dict[int, list[float]] = {}
    for t, pct in samples:
        steal_by_second.setdefault(int(t), []).append(pct)

    def steal_at(t: float) -> float | None:
        v = steal_by_second.get(int(t)) or steal_by_second.get(int(t) + 1)
        return round(sum(v) / len(v), 1) if v else None

    pauses = tail["gc"]["pauses"] if tail.get("gc") else []

    def gc_overlap_ms(start: float, end: float) -> float:
        hit = [float(ms) for t, ms, _g in pauses if t - ms / 1000 <= end and t >= start]
        return round(sum(hit), 3)

    late = sorted(((first[k] - due[k], k) for k in first), reverse=True)
    over = [(lat, k) for lat, k in late if lat > 0.005]
    window = (min(due.values()), max(due.values()) + 1) if due else (0.0, 0.0)
    in_window = [pct for t, pct in samples if window[0] <= t <= window[1]]
    t0 = window[0]
    tail["receiver_late_over_5ms"] = {
        "count": len(over),
        "overlapping_a_gc_pause": sum(1 for lat, k in over if gc_overlap_ms(due[k], first[k])),
        "in_a_second_with_steal_over_10pct": sum(
            1 for _lat, k in over if (steal_at(due[k]) or 0) > 10),
    }
    tail["steal"]["due_window_mean_pct"] = (round(sum(in_window) / len(in_window), 2)
                                            if in_window else None)
    tail["worst"] = [
        {"due_s": round(due[k] - t0, 3), "late_ms": round(lat * 1000, 2),
         "gc_overlap_ms": gc_overlap_ms(due[k], first[k]), "steal_pct": steal_at(due[k])}
        for lat, k in late[:10]]
    return tail


# --------------------------------------------------------------------------- report


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:.2f}"
    return str(v)


def print_result(name: str, res: dict[str, Any]) -> None:
    print(f"\n== {name}")
    if name == "post":
        lat = res["latency"]
        print(f"  POST /tasks   {res['requests_per_s']:>8} req/s   p50 {_fmt(lat['p50_ms'])} ms  "
              f"p99 {_fmt(lat['p99_ms'])} ms  max {_fmt(lat['max_ms'])} ms  "
              f"errors {res['errors']}  ({res['ok']}/{res['requests']} ok in {res['wall_s']} s)")
        c = res["cancel"]
        print(f"  DELETE        {c['requests_per_s']:>8} req/s   p50 {_fmt(c['latency']['p50_ms'])}"
              f" ms  p99 {_fmt(c['latency']['p99_ms'])} ms  ({c['ok']}/{c['requests']} 204)")
        if res["first_error"]:
            print(f"  first error: {res['first_error']}")
    else:
        lat = res["lateness"]
        s = res["submit"]
        print(f"  submitted {s['ok']} in {s['wall_s']} s ({s['per_s']}/s), errors {s['errors']}, "
              f"finished {_fmt(s['finished_before_first_due_s'])} s before the first due time")
        if s["first_error"]:
            print(f"  first error: {s['first_error']}")
        print(f"  lateness ms   p50 {_fmt(lat['p50_ms'])}  p90 {_fmt(lat['p90_ms'])}  "
              f"p99 {_fmt(lat['p99_ms'])}  max {_fmt(lat['max_ms'])}  (min {_fmt(lat['min_ms'])})")
        print(f"  arrived {res['arrived']}/{res['tasks']}  lost {res['lost']}  early {res['early']}"
              f"  duplicates {res['duplicates']}  later attempts {res['later_attempts']}  "
              f"scheduled-at mismatches {res['scheduled_at_header_mismatch']}")
        _warn_if_behind_by_the_grace(res)
        if res["submitted_after_due"]:
            print(f"  WARNING: {res['submitted_after_due']} tasks were accepted only after their "
                  "due time (raise --lead); see lateness_excluding_submitted_after_due")
        if "burst" in res:
            b = res["burst"]
            print(f"  burst: last arrival {b['drain_s']} s after due, "
                  f"{b['callbacks_per_s_from_due']} callbacks/s from due")
        if "retry" in res:
            r = res["retry"]
            g, v = r["gap_attempt2_minus_attempt1"], r["attempt2_minus_intended_next_attempt_at"]
            print(f"  retry: {r['failing_tasks_delivered_2xx']}/{r['failing_tasks']} failing tasks "
                  f"delivered; gap a2-a1 ms p50 {_fmt(g['p50_ms'])} min {_fmt(g['min_ms'])} "
                  f"max {_fmt(g['max_ms'])}")
            print(f"  retry lateness vs reported next_attempt_at ({r['probed']} probed): "
                  f"p50 {_fmt(v['p50_ms'])}  p99 {_fmt(v['p99_ms'])}  max {_fmt(v['max_ms'])} ms,"
                  f" early {r['early_retries']}; chosen backoff/nominal "
                  f"{r['chosen_backoff_over_nominal']['min']}..{r['chosen_backoff_over_nominal']['max']}")
    if res.get("tail"):
        _print_tail(res["tail"])
    cpu = res["cpu"]
    parts = [f"{k.removesuffix('_cpu_s')} {v}" for k, v in cpu.items() if k.endswith("_cpu_s")]
    print(f"  CPU s over {cpu['wall_s']} s: " + ", ".join(parts) +
          f"; service RSS {cpu['service_rss_mib']} MiB")
    window = res.get("cpu_due_window")
    if window and window.get("callbacks"):
        per = [f"{k.removesuffix('_us_per_callback')} {v}" for k, v in window.items()
               if k.endswith("_us_per_callback")]
        print(f"  CPU while due ({window['wall_s']} s, {window['callbacks']} callbacks): "
              + ", ".join(per) + " us per callback")
    if window and window.get("redis_commands"):
        rc = window["redis_commands"]
        top = ", ".join(f"{name} {row['us_per_callback']} ({row['us_per_call']} a call)"
                        for name, row in list(rc["by_command"].items())[:6])
        print(f"  Redis while due (INFO, us per callback): CPU {rc['redis_cpu_us']}, scripts "
              f"{rc['scripts_us']} ({rc['callbacks_per_script_call']} callbacks a call), "
              f"commands {rc['commands_us']}: {top}")


def _warn_if_behind_by_the_grace(res: dict[str, Any]) -> None:
    """'lost' counts what had not arrived when the bench stopped waiting (--grace after the
    last due time); a run that fell behind by about that much may have lost nothing (session
    6: 1,238 "lost" at 4,000/s, all 40,000 arrived with --grace 60)."""
    grace = res.get("config", {}).get("grace_s")
    latest_ms = res["lateness"]["max_ms"] or 0
    if res["lost"] and grace and latest_ms >= (grace - 1) * 1000:
        print(f"  WARNING: the latest arrival came {latest_ms / 1000:.1f} s after its due time, "
              f"about --grace ({grace:g} s): 'lost' counts what had not arrived by then; run "
              "again with a longer --grace to tell late from lost")


def _print_tail(tail: dict[str, Any]) -> None:
    h = tail.get("service_lateness_first")
    if h and h.get("count"):
        within = h["share_within_ms"]
        print(f"  service's own lateness (histogram, {h['count']} starts): p50 <= "
              f"{_fmt(h['p50_le_ms'])} ms, p99 <= {_fmt(h['p99_le_ms'])} ms, max <= "
              f"{_fmt(h['max_le_ms'])} ms; within 5 ms {within.get('5', 0):.2%}, within 20 ms "
              f"{within.get('20', 0):.2%}")
    if tail.get("service_counters"):
        print("  service counters over the run: " + ", ".join(
            f"{k} {v:g}" for k, v in tail["service_counters"].items()))
    for proc, counters in tail.get("service_counters_by_process", {}).items():  # --processes
        print(f"    {proc}: " + ", ".join(f"{k} {v:g}" for k, v in counters.items()))
    st = tail["steal"]
    print(f"  CPU steal: mean {_fmt(st['mean_pct'])} % (due window "
          f"{_fmt(st['due_window_mean_pct'])} %), worst second {_fmt(st['max_1s_pct'])} %, "
          f"{st['seconds_over_10pct']} s over 10 %; runnable threads mean "
          f"{_fmt(tail['runnable_threads']['mean'])} max {tail['runnable_threads']['max']}; "
          f"service preempted {tail['service_preempted']} times")
    g = tail.get("gc")
    if g:
        print(f"  service GC: {g['collections']} collections {g['by_generation']}, total "
              f"{_fmt(g['total_ms'])} ms, max {_fmt(g['max_ms'])} ms, {g['over_1ms']} over 1 ms")
    o = tail["receiver_late_over_5ms"]
    print(f"  arrivals > 5 ms late: {o['count']}; overlapping a GC pause "
          f"{o['overlapping_a_gc_pause']}; in a second with steal > 10 % "
          f"{o['in_a_second_with_steal_over_10pct']}")
    worst = ", ".join(f"{w['late_ms']} ms @{w['due_s']} s (gc {w['gc_overlap_ms']}, steal "
                      f"{_fmt(w['steal_pct'])} %)" for w in tail["worst"][:3])
    print(f"  worst: {worst}")


def verdict(name: str, res: dict[str, Any]) -> list[str]:
    """Hard failures: a scheduler that loses, duplicates or fires early is wrong, not slow."""
    bad = []
    if name == "post":
        if res["errors"]:
            bad.append(f"post: {res['errors']} errors")
        return bad
    for k in ("lost", "early", "duplicates", "submit"):
        v = res[k]["errors"] if k == "submit" else res[k]
        if v:
            bad.append(f"{name}: {k} = {v}")
    if "retry" in res:
        r = res["retry"]
        if r["failing_tasks_delivered_2xx"] != r["failing_tasks"]:
            bad.append(f"{name}: only {r['failing_tasks_delivered_2xx']}/{r['failing_tasks']} "
                       "failing tasks delivered")
        if r["early_retries"]:
            bad.append(f"{name}: {r['early_retries']} retries before next_attempt_at")
    return bad



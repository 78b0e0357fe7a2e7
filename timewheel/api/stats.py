"""``/stats``: figures for the dashboard (``/ui``) and for anyone who wants them as JSON.

- ``GET /stats/due?minutes=N``: tasks due per minute for the coming minutes, over the whole
  wheel (timewheel/operations/stats.py; bounded, see ``MAX_CELLS``).
- ``GET /stats``: this process's own counters (the ones ``/metrics`` exports) plus the wheel's
  dead-letter count. Rates (callbacks per second) are left to the caller: two samples apart.

Both need the bearer token when tokens are set, like ``/tasks``.
"""

from __future__ import annotations

import os
import socket
from typing import Annotated, Any

from fastapi import APIRouter, Query
from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel, Field

from timewheel.api.deps import Needs, WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.models import format_ms
from timewheel.operations.stats import MAX_CELLS

router = APIRouter(prefix="/stats", tags=["operations"], route_class=TaskRoute)

MAX_MINUTES = 1440
_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or invalid bearer token"},
    503: {"description": "Redis unavailable"},
}


class MinuteLoad(BaseModel):
    minute: str = Field(description="start of the minute, RFC 3339 UTC")
    due: int = Field(description="tasks waiting in this minute's slices (first attempts and "
                                 "retries), over every bucket")


class DueLoad(BaseModel):
    """Due load per minute, from the current minute on."""

    minutes: list[MinuteLoad]
    buckets: int = Field(description="buckets counted (the wheel's bucket count)")
    clamped: bool = Field(description="fewer minutes than asked, to stay within "
                                      f"{MAX_CELLS} bucket-minute cells")


class HistogramStats(BaseModel):
    count: int
    sum: float = Field(description="seconds")
    buckets: list[tuple[float, int]] = Field(
        description="cumulative (upper bound in seconds, observations at or below it); the "
                    "+Inf bucket is ``count``")


class ProcessStats(BaseModel):
    """Counters of the process that answered, since it started, and the wheel's dead letters."""

    now: str = Field(description="the wheel's clock (Redis time), RFC 3339 UTC")
    process: str = Field(description="which process answered (host:pid): rates computed from "
                                     "two samples hold only if both name the same process")
    in_flight: int = Field(description="attempts this process is sending now")
    claimed: int = Field(description="tasks this process has claimed")
    callbacks: dict[str, int] = Field(
        description="attempts by outcome: succeeded, retried, failed, abandoned")
    lateness: dict[str, HistogramStats] = Field(
        description="start of an attempt minus its due time, by attempt (first, retry)")
    dead_letters: int = Field(description="failed tasks in the dead letters, whole wheel")


@router.get("/due", dependencies=[Needs.READ], response_model=DueLoad, responses=_RESPONSES)
async def due_load(
    wheel: WheelDep,
    minutes: Annotated[int, Query(ge=1, le=MAX_MINUTES,
                                  description="how many minutes, from the current one")] = 180,
) -> DueLoad:
    """Tasks due per minute for the coming minutes, from the current minute on, summed over
    every bucket: for each bucket and minute that has a slice, the slice's size (ZCARD) minus
    its delete-set's (SCARD), pipelined. Exact for minutes the wheel has not started claiming;
    the minute being claimed now can read low (cancelled entries already dropped are still
    subtracted). Tasks in flight or parked waiting for their flow's limits are not in any slice
    and not counted, and neither are tasks still left in slices of past minutes after an
    outage."""
    load = await wheel.stats.due_load(minutes)
    return DueLoad(minutes=[MinuteLoad(minute=format_ms(start) or "", due=due)
                            for start, due in load.minutes],
                   buckets=load.buckets, clamped=load.clamped)


@router.get("", dependencies=[Needs.READ], response_model=ProcessStats, responses=_RESPONSES)
async def process_stats(wheel: WheelDep) -> ProcessStats:
    """This process's callback counters, in-flight gauge and lateness histograms (the figures
    of ``/metrics``, as JSON), and the dead-letter count over the whole wheel."""
    metrics = wheel.metrics
    return ProcessStats(
        now=format_ms(wheel.clock.now_ms()) or "",
        process=f"{socket.gethostname()}:{os.getpid()}",
        in_flight=int(_sample(metrics.inflight, "")),
        claimed=int(_sample(metrics.claimed, "_total")),
        callbacks={name: int(_sample(child, "_total"))
                   for name, child in metrics.outcomes.items()},
        lateness=_histograms(metrics.lateness),
        dead_letters=await wheel.stats.dead_letters(),
    )


def _sample(metric: Counter | Gauge, suffix: str) -> float:
    """The value of an unlabelled counter or gauge (or of one labelled child): its first
    sample whose name ends with ``suffix`` (``_total`` for a counter)."""
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix):
                return sample.value
    return 0.0


def _histograms(histogram: Histogram) -> dict[str, HistogramStats]:
    """One HistogramStats per ``attempt`` label, from the collected samples."""
    found: dict[str, dict[str, Any]] = {}
    for metric in histogram.collect():
        for sample in metric.samples:
            label = sample.labels.get("attempt", "")
            entry = found.setdefault(label, {"count": 0, "sum": 0.0, "buckets": []})
            if sample.name.endswith("_bucket") and sample.labels["le"] != "+Inf":
                entry["buckets"].append((float(sample.labels["le"]), int(sample.value)))
            elif sample.name.endswith("_count"):
                entry["count"] = int(sample.value)
            elif sample.name.endswith("_sum"):
                entry["sum"] = sample.value
    return {label: HistogramStats(**entry) for label, entry in found.items()}

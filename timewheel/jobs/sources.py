"""What a bulk job walks: the indexes of ``GET /tasks`` (timewheel/store/listing.py) that hold
the tasks its kind can act on, and its filter as the scripts take it."""

from __future__ import annotations

from typing import Any

from timewheel.domain import TaskStatus
from timewheel.models.tasks import parse_execute_at
from timewheel.store.job_store import TaskFilter
from timewheel.store.listing import SOURCES, Source

# The statuses each kind acts on (a cancel stops what has not finished; a replay starts again
# what failed or was cancelled, as POST /tasks/{key}/replay does).
ACTS_ON = {
    "cancel": (TaskStatus.SCHEDULED, TaskStatus.RETRYING, TaskStatus.DELIVERING),
    "replay": (TaskStatus.FAILED, TaskStatus.CANCELLED),
}
# Without a status: every pending task, one pass over the slices for both of their statuses.
_ALL_PENDING = (Source("slices", False, "sr"), Source("pa", False, "w"), Source("ls", False, "d"))
_PENDING_LETTERS = "".join(src.status for src in _ALL_PENDING)


def sources(kind: str, status: TaskStatus | None) -> tuple[Source, ...]:
    if status is not None:
        return SOURCES[status]
    if kind == "cancel":
        return _ALL_PENDING
    return tuple(src for s in ACTS_ON[kind] for src in SOURCES[s])


def acting(src: Source, kind: str, status: TaskStatus | None) -> Source:
    """The source as a step acts on what its listing found. A cancel of every pending task
    (a purge) acts on a found task in any pending status: one claimed, parked or retried
    between the listing and the step is cancelled where it is now, where the walk might have
    passed its new index already (lua/job_step.lua)."""
    if kind == "cancel" and status is None:
        return Source(src.index, src.desc, _PENDING_LETTERS)
    return src


def start_of(src: Source, kind: str, started_ms: int) -> tuple[str | int, str]:
    """Where a job's walk of a source begins. A replay walks the finished tasks newest first
    from the job's start on: a task that fails again after the job replayed it (or finishes
    after the job began) is newer and not met again."""
    if kind == "replay" and src.desc:
        return (started_ms + 1, "")
    return ("", "")


def task_filter(job_filter: dict[str, Any], started_ms: int) -> TaskFilter:
    """The stored filter (JobFilter's fields) for the scripts. Only tasks created before the
    job started are acted on (as a Cloud Tasks purge): a job ends however fast new matching
    tasks arrive."""
    created = job_filter.get("created_before")
    created_ms = started_ms + 1
    if created is not None:
        created_ms = min(created_ms, parse_execute_at(created))
    due = job_filter.get("due_before")
    return TaskFilter(key_prefix=job_filter.get("key_prefix") or "",
                      flow=job_filter.get("flow_key") or "",
                      due_before_ms=None if due is None else parse_execute_at(due),
                      created_before_ms=created_ms)

"""Bulk jobs: ``POST /tasks/cancel``, ``POST /tasks/replay`` (admin) and ``GET /jobs/{id}``
(read) (docs/api.md v3, "Bulk jobs"). A job is recorded here and worked in the background by
every process's runner (timewheel/jobs/runner.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from timewheel.api.deps import Needs, WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.models import (
    JOB_ID_PATTERN,
    CancelFilter,
    JobCreated,
    JobKind,
    JobView,
    ReplayFilter,
    format_ms,
    parse_execute_at,
)
from timewheel.operations.records import JobRecord

router = APIRouter(tags=["jobs"], route_class=TaskRoute)

JobId = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="the job's id")]
_RESPONSES: dict[int | str, dict[str, Any]] = {503: {"description": "Redis unavailable"}}


# The filter's times, stored as the request gave them (RFC 3339 with any offset, or epoch
# seconds): shown as every time in a response is, RFC 3339 UTC with milliseconds (docs/api.md),
# at the millisecond the job compares with (jobs/sources.py ``task_filter`` parses them alike).
# Shown rather than stored normalised, so a job recorded as given renders the same way.
_FILTER_TIMES = ("due_before", "created_before")


def filter_view(stored: dict[str, Any]) -> dict[str, Any]:
    return {name: _filter_time(value) if name in _FILTER_TIMES else value
            for name, value in stored.items()}


def _filter_time(value: Any) -> Any:
    try:
        return format_ms(parse_execute_at(value))
    except (ValueError, OverflowError):  # past year 9999 in UTC: accepted, shown as given
        return value


def job_view(job: JobRecord) -> JobView:
    return JobView(id=job.id, kind=JobKind(job.kind), filter=filter_view(job.filter),
                   state=job.state,  # type: ignore[arg-type]
                   matched=job.counts.matched, done=job.counts.done,
                   skipped=job.counts.skipped, started_at=format_ms(job.started_ms) or "",
                   finished_at=format_ms(job.finished_ms))


@router.post("/tasks/cancel", dependencies=[Needs.ADMIN], status_code=202,
             response_model=JobCreated, responses=_RESPONSES)
async def cancel_tasks(body: CancelFilter, wheel: WheelDep) -> JobCreated:
    """Cancel every task that matches the filter and has not finished, in the background
    (a purge of a flow is ``{"flow_key": ...}``). Only tasks created before the job started
    are cancelled. Follow it with ``GET /jobs/{id}``."""
    return JobCreated(job=await wheel.jobs.start(JobKind.CANCEL, body))


@router.post("/tasks/replay", dependencies=[Needs.ADMIN], status_code=202,
             response_model=JobCreated, responses=_RESPONSES)
async def replay_tasks(body: ReplayFilter, wheel: WheelDep) -> JobCreated:
    """Replay (schedule again, now, attempts reset) every failed or cancelled task that
    matches the filter and finished before the job started, in the background. Follow it
    with ``GET /jobs/{id}``."""
    return JobCreated(job=await wheel.jobs.start(JobKind.REPLAY, body))


@router.get("/jobs/{job_id}", dependencies=[Needs.READ], response_model=JobView,
            responses={404: {"description": "no such job"}, **_RESPONSES})
async def get_job(job_id: JobId, wheel: WheelDep) -> JobView:
    """A job's progress: ``done + skipped == matched``; ``state`` turns ``done`` once every
    bucket was walked to its end."""
    return job_view(await wheel.jobs.get(job_id))

"""``/schedules``: recurring schedules, create/replace, inspect, list, delete, pause, resume
(docs/api.md, "Recurring schedules"). The engine turns their occurrences into tasks
(timewheel/engine/materializer.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Response
from fastapi.exceptions import RequestValidationError

from timewheel.api.deps import WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.api.tasks import _prepare
from timewheel.engine.occurrences import latest_at_or_before, next_after
from timewheel.models import (
    SCHEDULE_ID_PATTERN,
    ScheduleCreate,
    ScheduleList,
    ScheduleTask,
    ScheduleView,
    format_ms,
)
from timewheel.operations.schedules import spec_of
from timewheel.service import Wheel
from timewheel.store.replies import SchedPutReply
from timewheel.store.schedule_store import ScheduleRecord, ScheduleStore

router = APIRouter(prefix="/schedules", tags=["schedules"], route_class=TaskRoute)

ScheduleId = Annotated[str, Path(pattern=SCHEDULE_ID_PATTERN, description="the schedule's id")]
_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such schedule"}, 413: {"description": "body too large"},
    503: {"description": "Redis unavailable"},
}


def _schedules(wheel: Wheel) -> ScheduleStore:
    return wheel.schedules


def _not_found(schedule_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"no schedule with id {schedule_id!r}")


def _check_task(wheel: Wheel, schedule_id: str, task: ScheduleTask, now: int) -> None:
    """The task template passes the same settings-dependent checks as POST /tasks; errors
    name the field under ``task``."""
    try:
        _prepare(wheel, task, f"{schedule_id}.{now}", now)
    except RequestValidationError as exc:
        errors = [{**e, "loc": ("body", "task", *tuple(e["loc"])[1:])} for e in exc.errors()]
        raise RequestValidationError(errors) from exc


def _view(record: ScheduleRecord, now: int) -> ScheduleView:
    spec = record.spec
    last = None
    if record.hi_ms is not None:
        # Occurrences are materialized up to two ticks ahead: the last one that ran is the
        # latest at or before now, unless nothing that recent was materialized.
        latest = latest_at_or_before(spec, now)
        last = record.hi_ms if latest is None else min(record.hi_ms, latest)
    return ScheduleView(
        id=record.id, cron=spec["cron"], every=spec["every"], timezone=spec["timezone"],
        task=ScheduleTask.model_validate(spec["task"]), paused=record.paused,
        next_run_at=None if record.paused else format_ms(record.next_ms),
        last_run_at=format_ms(last), created_at=format_ms(record.created_ms) or "",
    )


async def _current(wheel: Wheel, schedule_id: str) -> ScheduleView:
    record = await _schedules(wheel).get(schedule_id)
    if record is None:  # deleted between the change and this read
        raise _not_found(schedule_id)
    return _view(record, wheel.clock.now_ms())


@router.put("/{schedule_id}", response_model=ScheduleView,
            responses={201: {"description": "created"}, **_RESPONSES})
async def put_schedule(schedule_id: ScheduleId, body: ScheduleCreate, wheel: WheelDep,
                       response: Response) -> ScheduleView:
    """Create (201) or replace (200) a schedule. Occurrences already turned into tasks keep
    the template they were made with; a replace never reuses an occurrence time."""
    now = wheel.clock.now_ms()
    _check_task(wheel, schedule_id, body.task, now)
    schedules = _schedules(wheel)
    spec = spec_of(body)
    code, outstanding = await schedules.put(schedule_id, spec, paused=body.paused, now_ms=now,
                                            next_after=next_after)
    if outstanding:  # paused by this PUT: its materialized occurrences must not start
        await schedules.cancel_occurrences(schedule_id, outstanding, spec["task"], now_ms=now)
    if code is SchedPutReply.CREATED:
        response.status_code = 201
        response.headers["Location"] = f"/schedules/{schedule_id}"
    return await _current(wheel, schedule_id)


@router.get("", response_model=ScheduleList, responses=_RESPONSES)
async def list_schedules(
    wheel: WheelDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(pattern=SCHEDULE_ID_PATTERN)] = None,
) -> ScheduleList:
    """Schedules in id order, cursor-paginated."""
    records, last = await _schedules(wheel).page(limit, cursor)
    now = wheel.clock.now_ms()
    return ScheduleList(schedules=[_view(r, now) for r in records], next_cursor=last)


@router.get("/{schedule_id}", response_model=ScheduleView, responses=_RESPONSES)
async def get_schedule(schedule_id: ScheduleId, wheel: WheelDep) -> ScheduleView:
    record = await _schedules(wheel).get(schedule_id)
    if record is None:
        raise _not_found(schedule_id)
    return _view(record, wheel.clock.now_ms())


@router.delete("/{schedule_id}", status_code=204, response_class=Response,
               responses=_RESPONSES)
async def delete_schedule(schedule_id: ScheduleId, wheel: WheelDep) -> Response:
    """Delete: once this returns, no occurrence of the schedule starts (one in flight may
    still arrive)."""
    schedules = _schedules(wheel)
    found = await schedules.delete(schedule_id)
    if found is None:
        raise _not_found(schedule_id)
    outstanding, template = found
    await schedules.cancel_occurrences(schedule_id, outstanding, template,
                                       now_ms=wheel.clock.now_ms())
    return Response(status_code=204)


@router.post("/{schedule_id}/pause", response_model=ScheduleView, responses=_RESPONSES)
async def pause_schedule(schedule_id: ScheduleId, wheel: WheelDep) -> ScheduleView:
    """Pause: once this returns, no occurrence starts until a resume."""
    schedules = _schedules(wheel)
    outstanding = await schedules.pause(schedule_id)
    if outstanding is None:
        raise _not_found(schedule_id)
    if outstanding:
        record = await schedules.get(schedule_id)
        template = record.spec["task"] if record is not None else None
        await schedules.cancel_occurrences(schedule_id, outstanding, template,
                                           now_ms=wheel.clock.now_ms())
    return await _current(wheel, schedule_id)


@router.post("/{schedule_id}/resume", response_model=ScheduleView, responses=_RESPONSES)
async def resume_schedule(schedule_id: ScheduleId, wheel: WheelDep) -> ScheduleView:
    """Resume from the next occurrence after now: occurrences missed while paused are not
    fired."""
    found = await _schedules(wheel).resume(schedule_id, now_ms=wheel.clock.now_ms(),
                                           next_after=next_after)
    if not found:
        raise _not_found(schedule_id)
    return await _current(wheel, schedule_id)

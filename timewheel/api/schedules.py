"""``/schedules``: recurring schedules, create/replace, inspect, list, delete, pause, resume
(docs/api.md, "Recurring schedules"). Each handler parses, calls the schedule operations
(timewheel/operations/schedules.py) and shows the result; the engine turns occurrences into
tasks (timewheel/engine/materializer.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from timewheel.api.deps import Needs, WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.engine.occurrences import latest_at_or_before
from timewheel.models import (
    SCHEDULE_ID_PATTERN,
    ScheduleCreate,
    ScheduleList,
    ScheduleTask,
    ScheduleView,
    format_ms,
)
from timewheel.operations.records import ScheduleRecord
from timewheel.service import Wheel

router = APIRouter(prefix="/schedules", tags=["schedules"], route_class=TaskRoute)

ScheduleId = Annotated[str, Path(pattern=SCHEDULE_ID_PATTERN, description="the schedule's id")]
_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such schedule"}, 413: {"description": "body too large"},
    503: {"description": "Redis unavailable"},
}


async def _view(wheel: Wheel, record: ScheduleRecord) -> ScheduleView:
    return (await _views(wheel, [record]))[0]


async def _views(wheel: Wheel, records: list[ScheduleRecord]) -> list[ScheduleView]:
    now = wheel.clock.now_ms()
    filled = await wheel.schedules.retry_in_force(records)
    return [_one_view(record, unset, now)
            for record, unset in zip(records, filled, strict=True)]


def _one_view(record: ScheduleRecord, unset: dict[str, Any], now: int) -> ScheduleView:
    spec = record.spec
    last = None
    if record.hi_ms is not None:
        # Occurrences are materialized up to two ticks ahead: the last one that ran is the
        # latest at or before now, unless nothing that recent was materialized.
        latest = latest_at_or_before(spec, now)
        last = record.hi_ms if latest is None else min(record.hi_ms, latest)
    return ScheduleView(
        id=record.id, cron=spec["cron"], every=spec["every"], timezone=spec["timezone"],
        task=ScheduleTask.model_validate(spec["task"]).model_copy(update=unset),
        paused=record.paused,
        next_run_at=None if record.paused else format_ms(record.next_ms),
        last_run_at=format_ms(last), created_at=format_ms(record.created_ms) or "",
    )


@router.put("/{schedule_id}", dependencies=[Needs.WRITE], response_model=ScheduleView,
            responses={201: {"description": "created"}, **_RESPONSES})
async def put_schedule(schedule_id: ScheduleId, body: ScheduleCreate, wheel: WheelDep,
                       response: Response) -> ScheduleView:
    """Create (201) or replace (200) a schedule. Occurrences already turned into tasks keep
    the template they were made with; a replace never reuses an occurrence time."""
    created, record = await wheel.schedules.put(schedule_id, body)
    if created:
        response.status_code = 201
        response.headers["Location"] = f"/schedules/{schedule_id}"
    return await _view(wheel, record)


@router.get("", dependencies=[Needs.READ], response_model=ScheduleList, responses=_RESPONSES)
async def list_schedules(
    wheel: WheelDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=400, description="`next_cursor` of the "
                                        "previous page")] = None,
) -> ScheduleList:
    """Schedules in id order, cursor-paginated."""
    records, following = await wheel.schedules.page(limit, cursor)
    return ScheduleList(schedules=await _views(wheel, records), next_cursor=following)


@router.get("/{schedule_id}", dependencies=[Needs.READ],
            response_model=ScheduleView, responses=_RESPONSES)
async def get_schedule(schedule_id: ScheduleId, wheel: WheelDep) -> ScheduleView:
    return await _view(wheel, await wheel.schedules.get(schedule_id))


@router.delete("/{schedule_id}", dependencies=[Needs.WRITE],
               status_code=204, response_class=Response,
               responses=_RESPONSES)
async def delete_schedule(schedule_id: ScheduleId, wheel: WheelDep) -> Response:
    """Delete: once this returns, no occurrence of the schedule starts (one in flight may
    still arrive)."""
    await wheel.schedules.delete(schedule_id)
    return Response(status_code=204)


@router.post("/{schedule_id}/pause", dependencies=[Needs.WRITE],
             response_model=ScheduleView, responses=_RESPONSES)
async def pause_schedule(schedule_id: ScheduleId, wheel: WheelDep) -> ScheduleView:
    """Pause: once this returns, no occurrence starts until a resume."""
    return await _view(wheel, await wheel.schedules.pause(schedule_id))


@router.post("/{schedule_id}/resume", dependencies=[Needs.WRITE],
             response_model=ScheduleView, responses=_RESPONSES)
async def resume_schedule(schedule_id: ScheduleId, wheel: WheelDep) -> ScheduleView:
    """Resume from the next occurrence after now: occurrences missed while paused are not
    fired."""
    return await _view(wheel, await wheel.schedules.resume(schedule_id))

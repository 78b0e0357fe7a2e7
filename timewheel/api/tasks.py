"""``/tasks``: schedule, replace, cancel, inspect, list and search, replay (docs/api.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from fastapi.exceptions import RequestValidationError

from timewheel.api.deps import WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.api.views import task_view
from timewheel.delivery.netguard import BlockedAddress
from timewheel.errors import TaskConflict, TaskNotFound
from timewheel.models import (
    KEY_PATTERN,
    TaskCreate,
    TaskFields,
    TaskList,
    TaskReschedule,
    TaskStatus,
    TaskView,
)
from timewheel.operations.prepare import DEFAULT_TIMEOUT_SECONDS, due_ms, prepare
from timewheel.service import Wheel
from timewheel.store import CancelReply, ReplayReply, RescheduleReply, ScheduleReply
from timewheel.store.listing import BadCursor, decode_cursor, encode_cursor
from timewheel.store.listing import list_tasks as list_page
from timewheel.store.record import NewTask, TaskRecord, new_key

router = APIRouter(prefix="/tasks", tags=["tasks"], route_class=TaskRoute)

TaskKey = Annotated[str, Path(pattern=KEY_PATTERN, description="the task's key")]
# A first callback usually goes to a local receiver: the refusal says how to allow it.
ALLOW_PRIVATE_HINT = ("set TIMEWHEEL_ALLOW_PRIVATE_NETWORKS=true (or serve "
                      "--allow-private-networks) to allow it")
_CONFLICT_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such task"}, 409: {"description": "conflict"},
    413: {"description": "body too large"}, 503: {"description": "Redis unavailable"},
}


def _invalid(field: str, message: str, value: object) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": ("body", field),
                                    "msg": message, "input": value}])


def _within_horizon(wheel: Wheel, delay: float | None, execute_at: object,
                    due: Callable[[], int], now: int) -> int:
    """The due time, or 422 when it is beyond TIMEWHEEL_MAX_HORIZON_SECONDS."""
    horizon = wheel.settings.max_horizon_seconds
    # The delay is compared before it is turned into milliseconds: 1e305 s would overflow.
    if delay is None or delay <= horizon:
        due_at = due()
        if due_at - now <= horizon * 1000:
            return due_at
    field, value = ("delay", delay) if delay is not None else ("execute_at", execute_at)
    raise _invalid(field, f"is more than {horizon:g}s ahead (TIMEWHEEL_MAX_HORIZON_SECONDS)",
                   value)


def _prepare(wheel: Wheel, fields: TaskFields, key: str, now: int) -> NewTask:
    """Limits that depend on settings, then the record to store. Raises 422 on bad input."""
    settings = wheel.settings
    if fields.timeout is not None and fields.timeout > settings.batch_deadline_seconds:
        raise _invalid("timeout", "must be at most the batch deadline "
                       f"({settings.batch_deadline_seconds:g}s)", fields.timeout)
    _within_horizon(wheel, fields.delay, fields.execute_at,
                    lambda: due_ms(fields, now), now)
    try:
        wheel.policy.check_url_host(fields.callback_url)
    except BlockedAddress as exc:
        raise _invalid("callback_url", f"{exc}; {ALLOW_PRIVATE_HINT}", fields.callback_url
                       ) from exc
    default_timeout = min(DEFAULT_TIMEOUT_SECONDS, settings.batch_deadline_seconds)
    return prepare(fields, key, now, default_timeout=default_timeout)


async def _existing_view(wheel: Wheel, key: str) -> TaskView:
    record = await wheel.store.get(key)
    if record is None:  # expired between the script and this read
        raise TaskNotFound(key)
    return task_view(record)


async def _record_or_none(wheel: Wheel, key: str) -> TaskRecord | None:
    """The task a 409 shows (None: the task expired meanwhile)."""
    return await wheel.store.get(key)


@router.post("", status_code=201, response_model=TaskView, responses={
    200: {"model": TaskView, "description": "an identical task exists (a repeated request)"},
    **_CONFLICT_RESPONSES})
async def create_task(body: TaskCreate, wheel: WheelDep, response: Response) -> TaskView:
    """Schedule a task. Repeating the same request with the same key is safe (200)."""
    key = body.key or new_key()
    now = wheel.clock.now_ms()
    task = _prepare(wheel, body, key, now)
    code = await wheel.store.schedule(task, replace=False, now_ms=now)
    if code is ScheduleReply.CONFLICT:
        raise TaskConflict(f"task {key!r} exists with other content")
    if code is ScheduleReply.EXISTS:
        response.status_code = 200
        return await _existing_view(wheel, key)
    wheel.metrics.scheduled.inc()
    response.headers["Location"] = f"/tasks/{key}"
    return task_view(task.as_record(now))


@router.put("/{key}", response_model=TaskView, responses={201: {"description": "created"},
                                                          **_CONFLICT_RESPONSES})
async def replace_task(key: TaskKey, body: TaskFields, wheel: WheelDep,
                       response: Response) -> TaskView:
    """Create the task, or replace (reschedule) it if it has not finished."""
    now = wheel.clock.now_ms()
    task = _prepare(wheel, body, key, now)
    code = await wheel.store.schedule(task, replace=True, now_ms=now)
    wheel.metrics.scheduled.inc()
    if code is ScheduleReply.CREATED:
        response.status_code = 201
        response.headers["Location"] = f"/tasks/{key}"
    return task_view(task.as_record(now))


@router.patch("/{key}", response_model=TaskView, responses={
    **_CONFLICT_RESPONSES, 409: {"description": "the task has finished (the body is its view)"}})
async def reschedule_task(key: TaskKey, body: TaskReschedule, wheel: WheelDep) -> TaskView:
    """Move a task that has not finished to a new time (``execute_at`` or ``delay``, and
    optionally a new ``max_attempts``), keeping everything else: callback, headers, body, flow,
    timeout, backoff, attempts so far. A task being delivered right now is treated as ``PUT``
    treats it: its claim is dropped, so an attempt not yet sent is not sent and the task fires
    at the new time; an attempt already sent may still arrive."""
    now = wheel.clock.now_ms()
    due = _within_horizon(wheel, body.delay, body.execute_at, lambda: body.due_ms(now), now)
    code = await wheel.store.reschedule(key, due_ms=due, max_attempts=body.max_attempts,
                                        now_ms=now)
    if code is RescheduleReply.NOT_FOUND:
        raise TaskNotFound(key)
    if code is RescheduleReply.FINISHED:
        raise TaskConflict(f"task {key!r} has already finished", await _record_or_none(wheel, key))
    if code is RescheduleReply.TOO_FEW_ATTEMPTS:
        made = (await _existing_view(wheel, key)).attempts
        raise _invalid("max_attempts", f"must be more than the {made} attempts already made",
                       body.max_attempts)
    return await _existing_view(wheel, key)


@router.delete("/{key}", status_code=204, response_class=Response,
               responses=_CONFLICT_RESPONSES)
async def cancel_task(key: TaskKey, wheel: WheelDep) -> Response:
    """Cancel: once this returns 204, no attempt starts (one in flight may still arrive)."""
    code = await wheel.store.cancel(key, now_ms=wheel.clock.now_ms())
    if code is CancelReply.NOT_FOUND:
        raise TaskNotFound(key)
    if code is CancelReply.FINISHED:
        raise TaskConflict(f"task {key!r} has already finished", await _record_or_none(wheel, key))
    wheel.metrics.cancelled.inc()
    return Response(status_code=204)


@router.get("/{key}", response_model=TaskView, responses=_CONFLICT_RESPONSES)
async def get_task(key: TaskKey, wheel: WheelDep) -> TaskView:
    return await _existing_view(wheel, key)


@router.get("", response_model=TaskList, responses=_CONFLICT_RESPONSES)
async def list_tasks(
    wheel: WheelDep,
    status: Annotated[TaskStatus, Query(description="the status to list (required)")],
    key_prefix: Annotated[str, Query(max_length=200, description="only keys that start "
                                     "with it")] = "",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=400, description="`next_cursor` of the "
                                        "previous page")] = None,
) -> TaskList:
    """Tasks of one status, a page at a time: scheduled and retrying soonest due first,
    delivering by lease, finished ones (failed: the dead letters) newest first. Each page reads
    a bounded number of index entries, so a page may hold fewer than ``limit`` tasks (even
    none) and still have a ``next_cursor``: follow it until it is null."""
    after = None
    if cursor is not None:
        try:
            after = decode_cursor(status, cursor)
        except BadCursor as exc:
            raise RequestValidationError([{"type": "value_error", "loc": ("query", "cursor"),
                                           "msg": str(exc), "input": cursor}]) from exc
    records, following = await list_page(wheel.store, status, key_prefix=key_prefix, limit=limit,
                                       cursor=after)
    return TaskList(tasks=[task_view(record) for record in records],
                    next_cursor=encode_cursor(status, following) if following else None)


@router.post("/{key}/replay", response_model=TaskView, responses=_CONFLICT_RESPONSES)
async def replay_task(key: TaskKey, wheel: WheelDep) -> TaskView:
    """Schedule a failed or cancelled task again, now, with its attempts reset."""
    code = await wheel.store.replay(key, now_ms=wheel.clock.now_ms())
    if code is ReplayReply.NOT_FOUND:
        raise TaskNotFound(key)
    if code is ReplayReply.NOT_FAILED:
        raise TaskConflict(f"task {key!r} is neither failed nor cancelled",
                           await _record_or_none(wheel, key))
    return await _existing_view(wheel, key)

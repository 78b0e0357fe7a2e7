"""``/tasks``: schedule, replace, cancel, inspect, list and search, replay (docs/api.md).
Each handler parses, calls the task operations (timewheel/operations/tasks.py) and shows the
result; api/errors.py maps their errors to status codes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from timewheel.api.deps import Needs, WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.api.views import task_view
from timewheel.models import (
    EXISTING_KEY_PATTERN,
    KEY_PATTERN,
    TaskCreate,
    TaskFields,
    TaskList,
    TaskReschedule,
    TaskStatus,
    TaskView,
)

router = APIRouter(prefix="/tasks", tags=["tasks"], route_class=TaskRoute)

# The key of a task PUT creates: 1-200 characters.
NewTaskKey = Annotated[str, Path(pattern=KEY_PATTERN, description="the task's key")]
# The key of a task that exists: also a result task's, ``{key}.on_success`` / ``.on_failure``
# (docs/api.md v3, "Result callbacks": listed and visible like any task), up to 211.
TaskKey = Annotated[str, Path(pattern=EXISTING_KEY_PATTERN, description="the task's key "
                              "(1-200 characters, or a result task's: such a key followed by "
                              "`.on_success` or `.on_failure`)")]
_CONFLICT_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such task"}, 409: {"description": "conflict"},
    413: {"description": "body too large"}, 503: {"description": "Redis unavailable"},
}


@router.post("", dependencies=[Needs.WRITE], status_code=201, response_model=TaskView, responses={
    200: {"model": TaskView, "description": "an identical task exists (a repeated request)"},
    **_CONFLICT_RESPONSES})
async def create_task(body: TaskCreate, wheel: WheelDep, response: Response) -> TaskView:
    """Schedule a task. Repeating the same request with the same key is safe (200)."""
    result = await wheel.tasks.create(body)
    if result.created:
        response.headers["Location"] = f"/tasks/{result.record.key}"
    else:
        response.status_code = 200
    return task_view(result.record)


@router.put("/{key}", dependencies=[Needs.WRITE], response_model=TaskView,
            responses={201: {"description": "created"}, **_CONFLICT_RESPONSES})
async def replace_task(key: NewTaskKey, body: TaskFields, wheel: WheelDep,
                       response: Response) -> TaskView:
    """Create the task, or replace (reschedule) it if it has not finished."""
    result = await wheel.tasks.replace(key, body)
    if result.created:
        response.status_code = 201
        response.headers["Location"] = f"/tasks/{key}"
    return task_view(result.record)


@router.patch("/{key}", dependencies=[Needs.WRITE], response_model=TaskView, responses={
    **_CONFLICT_RESPONSES, 409: {"description": "the task has finished (the body is its view)"}})
async def reschedule_task(key: TaskKey, body: TaskReschedule, wheel: WheelDep) -> TaskView:
    """Move a task that has not finished to a new time (``execute_at`` or ``delay``, and
    optionally a new ``max_attempts``), keeping everything else: callback, headers, body, flow,
    timeout, backoff, attempts so far. A task being delivered right now is treated as ``PUT``
    treats it: its claim is dropped, so an attempt not yet sent is not sent and the task fires
    at the new time; an attempt already sent may still arrive."""
    return task_view(await wheel.tasks.reschedule(key, body))


@router.delete("/{key}", dependencies=[Needs.WRITE], status_code=204, response_class=Response,
               responses=_CONFLICT_RESPONSES)
async def cancel_task(key: TaskKey, wheel: WheelDep) -> Response:
    """Cancel: once this returns 204, no attempt starts (one in flight may still arrive)."""
    await wheel.tasks.cancel(key)
    return Response(status_code=204)


@router.get("/{key}", dependencies=[Needs.READ],
            response_model=TaskView, responses=_CONFLICT_RESPONSES)
async def get_task(key: TaskKey, wheel: WheelDep) -> TaskView:
    return task_view(await wheel.tasks.get(key))


@router.get("", dependencies=[Needs.READ], response_model=TaskList, responses=_CONFLICT_RESPONSES)
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
    records, following = await wheel.tasks.page(status, key_prefix=key_prefix, limit=limit,
                                                cursor=cursor)
    return TaskList(tasks=[task_view(record) for record in records], next_cursor=following)


@router.post("/{key}/replay", dependencies=[Needs.WRITE],
             response_model=TaskView, responses=_CONFLICT_RESPONSES)
async def replay_task(key: TaskKey, wheel: WheelDep) -> TaskView:
    """Schedule a failed or cancelled task again, now, with its attempts reset."""
    return task_view(await wheel.tasks.replay(key))

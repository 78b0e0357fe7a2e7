"""``POST /tasks/batch``: schedule up to 1000 tasks in one request (docs/api.md).

Each item is validated on its own, exactly as ``POST /tasks`` validates its body (the model, then
the settings-dependent limits of ``TaskOperations.prepare_new``), and an invalid item is that
item's 422 while the others are stored. The valid ones are stored through pipelined
``schedule`` calls (``TaskOperations.create_many``, ``store/batch.py``): one round trip for the
whole batch on a single Redis.

- Item statuses: 201 created, 200 an identical task exists, 409 the key holds other content,
  422 invalid. An item whose encoded ``body`` is over 1 MiB is a 422 (``type: too_large``):
  docs/api.md allows only these four statuses per item, and 413 stays the answer for a whole request
  over the size limit (api/limits.py, before the body is parsed).
- A key given twice in one batch acts as two POSTs in request order: the first is created, a
  later identical one is 200, a later different one is 409.
- A 409 item carries the existing task's view, like ``DELETE``'s 409 does.
- The router is registered before ``/tasks`` (api/app.py), so ``/tasks/batch`` is not read as
  ``/tasks/{key}``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.encoders import jsonable_encoder
from pydantic import TypeAdapter, ValidationError

from timewheel.api.deps import Needs, WheelDep
from timewheel.api.errors import validation_error
from timewheel.api.routing import TaskRoute
from timewheel.api.views import FastJSONResponse, body_value, task_view
from timewheel.delivery.retry_policy import NO_DEFAULTS, RetryDefaults
from timewheel.errors import BodyTooLarge, InvalidInput
from timewheel.models import KEY_PATTERN, BatchCreate, BatchResult, TaskCreate, format_ms
from timewheel.operations.prepare import sent_as_json
from timewheel.operations.records import NewTask
from timewheel.operations.tasks import Stored

router = APIRouter(prefix="/tasks", tags=["tasks"], route_class=TaskRoute)

_STATUS: dict[Stored, Literal[201, 200, 409]] = {
    Stored.CREATED: 201, Stored.EXISTS: 200, Stored.CONFLICT: 409}
_VALID_KEY = re.compile(KEY_PATTERN)
_ITEMS = TypeAdapter(list[TaskCreate])


def _item_errors(index: int, errors: list[Any]) -> list[dict[str, Any]]:
    """Errors of one item in FastAPI's shape, located under ``body.tasks.<index>``."""
    located = [{**error, "loc": ("body", "tasks", index, *error.get("loc", ()))}
               for error in errors]
    encoded: list[dict[str, Any]] = jsonable_encoder(located)
    return encoded


def _given_key(item: Any) -> str | None:
    """The item's own key when it is a valid one (docs/api.md: null for an item without one)."""
    key = item.get("key") if isinstance(item, dict) else None
    return key if isinstance(key, str) and _VALID_KEY.fullmatch(key) else None


@router.post("/batch", dependencies=[Needs.WRITE], response_model=BatchResult, responses={
    413: {"description": "the whole request is over the size limit"},
    422: {"description": "`tasks` missing, not a list, empty or over 1000 items"},
    503: {"description": "Redis unavailable"}})
async def create_batch(body: BatchCreate, wheel: WheelDep) -> FastJSONResponse:
    """Schedule 1 to 1000 tasks. Each item is validated and stored on its own; ``results`` holds
    one entry per item, in request order."""
    now = wheel.clock.now_ms()
    results: list[dict[str, Any] | None] = []
    tasks: list[NewTask] = []
    positions: list[int] = []
    sent_bodies: list[Any] = []  # each task's body value when sent as JSON (created_view)
    try:  # the common case, every item valid: one validator call for the whole list
        valid: list[TaskCreate] | None = _ITEMS.validate_python(body.tasks)
    except ValidationError:  # then item by item, for each item's own errors
        valid = None
    for index, item in enumerate(body.tasks):
        try:
            fields = valid[index] if valid is not None else TaskCreate.model_validate(item)
            task = wheel.tasks.prepare_new(fields, now)
        except ValidationError as exc:
            errors = _item_errors(index, exc.errors(include_url=False))
        except InvalidInput as exc:  # a settings limit (horizon, timeout, network)
            error = validation_error(exc)
            errors = _item_errors(index, [{**error, "loc": exc.loc[1:]}])
        except BodyTooLarge as exc:
            errors = _item_errors(index, [{"type": "too_large", "loc": ("body",),
                                           "msg": str(exc)}])
        else:
            results.append(None)
            tasks.append(task)
            positions.append(index)
            sent_bodies.append(fields.body if sent_as_json(fields) else _NOT_GIVEN)
            continue
        results.append({"key": _given_key(item), "status": 422, "task": None, "detail": errors})

    done = await wheel.tasks.create_many(tasks, now)
    created_at = format_ms(now) or ""
    retry, existing = done.retry, done.existing
    for task, code, index, sent in zip(tasks, done.outcomes, positions, sent_bodies,
                                       strict=True):
        if code is Stored.CREATED:
            view: dict[str, Any] | None = created_view(  # the flow's retry defaults in force
                task, created_at, retry.get(task.flow, NO_DEFAULTS), sent)
        else:  # None: expired meanwhile, or its body too large to read with the others
            found = existing[task.key]
            view = task_view(found).model_dump(mode="json") if found is not None else None
        results[index] = {
            "key": task.key, "status": _STATUS[code], "task": view,
            "detail": (f"task {task.key!r} exists with other content"
                       if code is Stored.CONFLICT else None)}
    # Plain dicts, encoded once: BatchResult and TaskView objects for 1000 items (and FastAPI's
    # validation of a returned model) cost more than storing the tasks; tests/test_api_batch.py
    # checks these dicts against the models.
    return FastJSONResponse({"results": results})


_NOT_GIVEN: Any = object()


def created_view(task: NewTask, created_at: str, retry: RetryDefaults = NO_DEFAULTS,
                 body: Any = _NOT_GIVEN) -> dict[str, Any]:
    """``task_view(task.as_record(now)).model_dump(mode="json")`` of a task just created,
    built directly (with the retry fields in force: ``retry``, its flow's defaults). ``body``:
    the request's body value when it is sent as its JSON text (``sent_as_json``), which is
    what the view shows, instead of decoding the stored bytes again (~2 µs a task)."""
    due = format_ms(task.due_ms)
    return {"key": task.key, "status": "scheduled", "execute_at": due,
            "callback_url": task.url, "method": task.method, "attempts": 0,
            "max_attempts": retry.max_attempts_for(task.max_attempts), "next_attempt_at": due,
            "last_attempt_at": None,
            "last_status_code": None, "last_error": None, "created_at": created_at,
            "finished_at": None, "headers": dict(task.headers),
            "body": (body_value(task.headers, task.body or b"") if body is _NOT_GIVEN
                     else body),
            "timeout": task.timeout_ms / 1000,
            "retry_backoff": retry.backoff_ms_for(task.backoff_ms) / 1000,
            "flow_key": task.flow, "attempts_url": f"/tasks/{task.key}/attempts",
            "on_success": task.on_success, "on_failure": task.on_failure}

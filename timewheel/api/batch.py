"""``POST /tasks/batch``: schedule up to 1000 tasks in one request (API.md).

Each item is validated on its own, exactly as ``POST /tasks`` validates its body (the model, then
``_prepare``'s settings-dependent limits), and an invalid item is that item's 422 while the
others are stored. The valid ones are stored through pipelined ``schedule`` calls
(``store/batch.py``): one round trip for the whole batch on a single Redis.

- Item statuses: 201 created, 200 an identical task exists, 409 the key holds other content,
  422 invalid. An item whose encoded ``body`` is over 1 MiB is a 422 (``type: too_large``):
  API.md allows only these four statuses per item, and 413 stays the answer for a whole request
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

from fastapi import APIRouter, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from timewheel.api.deps import WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.api.tasks import _prepare
from timewheel.models import KEY_PATTERN, BatchCreate, BatchItemResult, BatchResult, TaskCreate
from timewheel.store import CONFLICT, CREATED, EXISTS
from timewheel.store.batch import get_many, schedule_many
from timewheel.store.record import BodyTooLarge, NewTask, new_key

router = APIRouter(prefix="/tasks", tags=["tasks"], route_class=TaskRoute)

_STATUS: dict[int, Literal[201, 200, 409]] = {CREATED: 201, EXISTS: 200, CONFLICT: 409}
_VALID_KEY = re.compile(KEY_PATTERN)


def _item_errors(index: int, errors: list[Any]) -> list[dict[str, Any]]:
    """Errors of one item in FastAPI's shape, located under ``body.tasks.<index>``."""
    located = [{**error, "loc": ("body", "tasks", index, *error.get("loc", ()))}
               for error in errors]
    encoded: list[dict[str, Any]] = jsonable_encoder(located)
    return encoded


def _given_key(item: Any) -> str | None:
    """The item's own key when it is a valid one (API.md: null for an item without one)."""
    key = item.get("key") if isinstance(item, dict) else None
    return key if isinstance(key, str) and _VALID_KEY.fullmatch(key) else None


@router.post("/batch", response_model=BatchResult, responses={
    413: {"description": "the whole request is over the size limit"},
    422: {"description": "`tasks` missing, not a list, empty or over 1000 items"},
    503: {"description": "Redis unavailable"}})
async def create_batch(body: BatchCreate, wheel: WheelDep) -> Response:
    """Schedule 1 to 1000 tasks. Each item is validated and stored on its own; ``results`` holds
    one entry per item, in request order."""
    now = wheel.clock.now_ms()
    results: list[BatchItemResult | None] = []
    tasks: list[NewTask] = []
    positions: list[int] = []
    for index, item in enumerate(body.tasks):
        try:
            fields = TaskCreate.model_validate(item)
            task = _prepare(wheel, fields, fields.key or new_key(), now)
        except ValidationError as exc:
            errors = _item_errors(index, exc.errors(include_url=False))
        except RequestValidationError as exc:  # a settings limit (horizon, timeout, network)
            errors = _item_errors(index, [{**e, "loc": e["loc"][1:]} for e in exc.errors()])
        except BodyTooLarge as exc:
            errors = _item_errors(index, [{"type": "too_large", "loc": ("body",),
                                           "msg": str(exc)}])
        else:
            results.append(None)
            tasks.append(task)
            positions.append(index)
            continue
        results.append(BatchItemResult(key=_given_key(item), status=422, detail=errors))

    codes = await schedule_many(wheel.store, tasks, now)
    existing = [task.key for task, code in zip(tasks, codes, strict=True) if code != CREATED]
    views = dict(zip(existing, await get_many(wheel.store, existing), strict=True))
    for task, code, index in zip(tasks, codes, positions, strict=True):
        results[index] = BatchItemResult(
            key=task.key, status=_STATUS[code],
            task=task.view(now) if code == CREATED else views[task.key],
            detail=f"task {task.key!r} exists with other content" if code == CONFLICT else None)
    wheel.metrics.scheduled.inc(codes.count(CREATED))
    # Serialised here once: as a return value FastAPI would validate all 1000 views again.
    done = BatchResult(results=[result for result in results if result is not None])
    return Response(done.model_dump_json(), media_type="application/json")

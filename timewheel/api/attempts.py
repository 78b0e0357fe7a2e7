"""``GET /tasks/{key}/attempts``: the attempt history of a task (docs/api.md v3). The task
operations read it as domain records (``TaskOperations.attempts``); this module turns them into
the API's views.
Its own router, beside ``tasks.router``, with the same route class (token first)."""

from __future__ import annotations

from fastapi import APIRouter

from timewheel.api.deps import Needs, WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.api.tasks import TaskKey
from timewheel.models import AttemptList, AttemptOutcome, AttemptView, format_ms
from timewheel.operations.records import AttemptRecord

router = APIRouter(prefix="/tasks", tags=["tasks"], route_class=TaskRoute)


def attempt_view(record: AttemptRecord) -> AttemptView:
    return AttemptView(
        attempt=record.attempt, started_at=format_ms(record.started_ms),
        duration_ms=record.duration_ms, outcome=AttemptOutcome(record.outcome),
        status_code=record.status_code, error=record.error,
        response_headers=record.response_headers, response_body=record.response_body,
        response_body_truncated=record.response_body_truncated,
        next_attempt_at=format_ms(record.next_attempt_ms),
        # "" is what an outcome decided without a request stores (a record set aside)
        process=record.process or None)


@router.get("/{key}/attempts", dependencies=[Needs.READ], response_model=AttemptList, responses={
    404: {"description": "no such task"}, 503: {"description": "Redis unavailable"}})
async def list_attempts(key: TaskKey, wheel: WheelDep) -> AttemptList:
    """The kept attempts of a task (the last ``TIMEWHEEL_ATTEMPTS_KEPT``), oldest first: each
    with its outcome, status code, error, response headers and body excerpt, duration and
    process. A task never tried has none."""
    return AttemptList(attempts=[attempt_view(record)
                                 for record in await wheel.tasks.attempts(key)])

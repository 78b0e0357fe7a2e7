"""The domain errors (timewheel/errors.py) as HTTP answers: one handler each, installed by
api/app.py, so handlers and operations raise domain errors and never build an error answer."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from timewheel.api.views import task_view
from timewheel.errors import (
    BodyTooLarge,
    InvalidInput,
    JobNotFound,
    NotReplicated,
    RecordUnreadable,
    RedisFull,
    ScheduleNotFound,
    StoreUnavailable,
    TaskConflict,
    TaskNotFound,
    TopicNotFound,
)

log = logging.getLogger(__name__)

FULL_RETRY_AFTER_S = 10  # a full Redis stays full until an operator acts: no 1 s hammering
FULL_LOG_EVERY_S = 60.0  # at most one "Redis is full" line a minute, however many requests


def validation_error(exc: InvalidInput) -> dict[str, Any]:
    """The error as one entry of FastAPI's 422 ``detail``, like the model's own errors."""
    return {"type": "value_error", "loc": exc.loc, "msg": exc.message, "input": exc.value}


async def not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=404)


def install(app: FastAPI) -> None:
    for missing in (TaskNotFound, ScheduleNotFound, TopicNotFound, JobNotFound):
        app.add_exception_handler(missing, not_found)

    @app.exception_handler(TaskConflict)
    async def conflict(request: Request, exc: TaskConflict) -> JSONResponse:
        # The body is the task view (when there is one) plus the reason.
        body: dict[str, Any] = (task_view(exc.record).model_dump(mode="json")
                                if exc.record is not None else {})
        body["detail"] = str(exc)
        return JSONResponse(body, status_code=409)

    @app.exception_handler(InvalidInput)
    async def invalid(request: Request, exc: InvalidInput) -> JSONResponse:
        # As FastAPI answers a RequestValidationError.
        return JSONResponse({"detail": jsonable_encoder([validation_error(exc)])},
                            status_code=422)

    @app.exception_handler(StoreUnavailable)
    async def unavailable(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": "Redis is unavailable; try again later"},
                            status_code=503, headers={"Retry-After": "1"})

    full_logged_at = [-FULL_LOG_EVERY_S]  # monotonic time of the last line

    @app.exception_handler(RedisFull)
    async def full(request: Request, exc: RedisFull) -> JSONResponse:
        now = time.monotonic()
        if now - full_logged_at[0] >= FULL_LOG_EVERY_S:
            full_logged_at[0] = now
            log.error("Redis is full (used memory over maxmemory): writes are refused with "
                      "503 and no task is delivered until memory is freed or maxmemory "
                      "raised (docs/deploy.md, \"A full Redis\"); now: %s %s: %s",
                      request.method, request.url.path, exc)
        # "Refused", not "nothing written": a batch over several buckets may have stored the
        # buckets before the one refused, as after any 503 part-way (README, the batch).
        return JSONResponse({"detail": "Redis is full (used memory over maxmemory) and "
                                       "refused the write; try again once it has room"},
                            status_code=503, headers={"Retry-After": str(FULL_RETRY_AFTER_S)})

    @app.exception_handler(RecordUnreadable)
    async def unreadable(request: Request, exc: RecordUnreadable) -> JSONResponse:
        # The server's configuration, not Redis and not the request: no Retry-After.
        log.error("%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": f"{exc}; list its key in TIMEWHEEL_ENCRYPTION_KEYS"},
                            status_code=500)

    @app.exception_handler(NotReplicated)
    async def not_replicated(request: Request, exc: NotReplicated) -> JSONResponse:
        # The write is on the Redis master and cannot be taken back; the client must know that
        # it was not acknowledged, and that repeating the request is safe.
        return JSONResponse({"detail": (
            f"not acknowledged: the change was written to the Redis master, but only "
            f"{exc.confirmed} of the {exc.wanted} replicas required "
            f"(TIMEWHEEL_REDIS_WAIT_REPLICAS) confirmed it within {exc.timeout_ms} ms, so it "
            "may or may not survive a failover of that master. Repeating the same request is "
            "safe; read the resource back to see its state.")},
            status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(BodyTooLarge)
    async def too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return JSONResponse({"detail": [{"type": "too_large", "loc": ["body", "body"],
                                         "msg": str(exc)}]}, status_code=413)

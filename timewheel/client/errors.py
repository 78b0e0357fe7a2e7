"""What the client raises. Every error derives from ``timewheel.errors.TimeWheelError``.

    TimeWheelError
     +-- ClientError                  status_code (None without an answer), detail
          +-- APIError                the service answered with an error status
          |    +-- UnauthorizedError     401: token missing or not accepted
          |    +-- ForbiddenError        403: the token's scope is too small for the call
          |    +-- NotFoundError         404: no such task, schedule, ...
          |    +-- ConflictError         409: key taken by other content, task finished (.view)
          |    +-- PayloadTooLargeError  413: body over the size limit
          |    +-- InvalidRequestError   422: invalid input (detail: FastAPI's error list)
          |    +-- UnavailableError      503: Redis unreachable; retry later (.retry_after)
          +-- UnreachableError        no answer at all: connection refused, timeout, broken
          +-- UnexpectedAnswerError   a success the API never sends (a body; a DELETE not 204)
                                      (TIMEWHEEL_URL pointing at something else)

The client never retries on its own: whether a retry is safe depends on the call (a POST with
a key is idempotent, one without is not), so the caller decides.
"""

from __future__ import annotations

import json
import math
from http import HTTPStatus
from typing import Any

import httpx
from pydantic import ValidationError

from timewheel.errors import TimeWheelError
from timewheel.models import TaskView

_MAX_TEXT_DETAIL = 1000  # characters of a non-JSON error body kept as the detail


class ClientError(TimeWheelError):
    """A call did not succeed. ``status_code`` is the HTTP status (None if there was no
    answer); ``detail`` is the answer's ``detail`` (a string, or FastAPI's list of errors)."""

    def __init__(self, status_code: int | None, detail: Any) -> None:
        self.status_code = status_code
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        return format_detail(self.detail)


class APIError(ClientError):
    """The service answered with an error status (one without a subclass of its own: any)."""

    status_code: int

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(status_code, detail)

    def _message(self) -> str:
        try:
            reason = HTTPStatus(self.status_code).phrase
        except ValueError:
            reason = "Error"
        return f"{self.status_code} {reason}: {format_detail(self.detail)}"


class UnauthorizedError(APIError):
    """401: the service has tokens set and this call carried none, or a wrong one."""


class ForbiddenError(APIError):
    """403: the token is valid, but its scope (read, write, admin) does not allow this call;
    ``detail`` names the scope it needs."""


class NotFoundError(APIError):
    """404: no such task (or schedule, flow route, ...)."""


class ConflictError(APIError):
    """409: the key is taken by a task with other content, or the task has already finished
    (cancel) or has not (replay). ``view`` is the task as it stands, when the answer has it."""

    def __init__(self, status_code: int, detail: Any, view: TaskView | None = None) -> None:
        self.view = view
        super().__init__(status_code, detail)


class PayloadTooLargeError(APIError):
    """413: the request (or the task's body) is over the service's size limit."""


class InvalidRequestError(APIError):
    """422: the service refused the input; ``detail`` is FastAPI's list of errors."""


class UnavailableError(APIError):
    """503: the service is up but its Redis is not; ``retry_after`` is its hint in seconds."""

    def __init__(self, status_code: int, detail: Any, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(status_code, detail)


class UnreachableError(ClientError):
    """No answer: the connection failed, timed out or broke. The request may or may not have
    been processed (a POST that timed out may have stored the task)."""

    def __init__(self, detail: str) -> None:
        super().__init__(None, detail)


class UnexpectedAnswerError(ClientError):
    """A success status with a body the API never sends, or a DELETE answered other than 204:
    the URL points at something else, or a proxy rewrote the answer."""


_BY_STATUS: dict[int, type[APIError]] = {
    401: UnauthorizedError, 403: ForbiddenError, 404: NotFoundError, 409: ConflictError,
    413: PayloadTooLargeError, 422: InvalidRequestError, 503: UnavailableError,
}


def format_detail(detail: Any) -> str:
    """A detail as one readable line: FastAPI's error list becomes ``loc: msg; ...``."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and all(isinstance(e, dict) and "msg" in e for e in detail):
        parts = []
        for error in detail:
            loc = ".".join(str(part) for part in error.get("loc", ()))
            parts.append(f"{loc}: {error['msg']}" if loc else str(error["msg"]))
        return "; ".join(parts)
    return json.dumps(detail)


def error_for(response: httpx.Response) -> APIError:
    """The exception for an error answer, with the answer's detail (and task view on 409)."""
    status = response.status_code
    try:
        body: Any = response.json()
    except ValueError:  # not JSON: a proxy's HTML page, an empty body
        body = None
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
    elif body is not None:
        detail = body
    else:
        detail = response.text[:_MAX_TEXT_DETAIL] or response.reason_phrase
    cls = _BY_STATUS.get(status, APIError)
    if cls is ConflictError:
        return ConflictError(status, detail, _view_in(body))
    if cls is UnavailableError:
        return UnavailableError(status, detail, _retry_after(response))
    return cls(status, detail)


def _view_in(body: Any) -> TaskView | None:
    """The task view a 409 carries next to its ``detail`` (docs/api.md: cancel of a finished
    task)."""
    if not isinstance(body, dict):
        return None
    fields = {name: value for name, value in body.items() if name != "detail"}
    try:
        return TaskView.model_validate(fields) if fields else None
    except ValidationError:
        return None


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds; the date form is not used by timewheel and is ignored."""
    value = response.headers.get("retry-after")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds

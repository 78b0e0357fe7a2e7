"""Models of ``/tasks`` (docs/api.md, "Tasks")."""

from __future__ import annotations

import functools
import re
from datetime import datetime
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from timewheel.domain import KEY_PATTERN, Method, TaskStatus, callback_url

MAX_URL_LENGTH = 2048
MAX_HEADERS = 50
MAX_BODY_BYTES = 1024 * 1024
MAX_BACKOFF_SECONDS = 3600  # also the bound of Backoff below
# RFC 9110 token: the characters a header name may hold.
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_FORBIDDEN_VALUE_CHARS = re.compile(r"[\r\n\x00]")
# Hop-by-hop and framing headers: the HTTP client owns them (docs/api.md).
_HOP_BY_HOP = {"host", "connection", "content-length", "transfer-encoding", "te", "trailer",
               "upgrade", "keep-alive"}
# Headers the service sets on every callback; a task may not forge or blur them.
_RESERVED = {"webhook-id", "webhook-timestamp", "webhook-signature", "user-agent"}
# RFC 3339 date-time; the offset is required (a local time would be ambiguous).
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)


Number = StrictInt | Annotated[StrictFloat, Field(allow_inf_nan=False)]
# Bounds go on each member of the union: on the union itself pydantic cannot express them in
# JSON Schema, and /openapi.json would lose them.
NonNegative = (Annotated[StrictInt, Field(ge=0)]
               | Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)])
Positive = Annotated[StrictInt, Field(gt=0)] | Annotated[StrictFloat, Field(gt=0,
                                                                             allow_inf_nan=False)]
Backoff = (Annotated[StrictInt, Field(gt=0, le=3600)]
           | Annotated[StrictFloat, Field(gt=0, le=3600, allow_inf_nan=False)])


def epoch_ms_ceil(seconds: Decimal) -> int:
    """Seconds to whole milliseconds, rounded up: a fraction of a millisecond never fires early."""
    return int((seconds * 1000).to_integral_value(rounding=ROUND_CEILING))


# Below 2**41 s (the year 71,700) two doubles are less than 0.0005 apart, so a double is the
# nearest one to at most one decimal of three places: the one its shortest repr spells.
_FAST_FLOAT_BELOW = float(2**41)


def parse_execute_at(value: str | int | float) -> int:
    """``execute_at`` (RFC 3339 with offset, or Unix seconds) as epoch milliseconds, rounded up
    from the decimal the request spelled (a float's shortest repr, what its JSON said).

    Exact integer arithmetic on the common forms (a number with at most three decimals, any
    date-time), where Decimal took ~3-4 us a number and ~11 us a date-time, and a created
    task's execute_at is read up to four times: `python -m bench.batch --due execute-at` spent
    0.83x the service CPU a task after this, `--due date-time` 0.63x (bench/README.md,
    "Session 28"). Decimal stays for the rest; tests/test_execute_at.py checks every form
    against a frozen copy of the Decimal code."""
    if isinstance(value, str):
        return _date_time_ms(value)
    if type(value) is int:  # not bool, which Decimal refuses below
        if value < 0:
            raise ValueError("must be Unix epoch seconds >= 0")
        return value * 1000
    if type(value) is float and 0.0 <= value < _FAST_FLOAT_BELOW:
        ms = round(value * 1000)
        # True exactly when the value's shortest repr has at most three decimals (the double
        # nearest to ms/1000 is the value): then that decimal is ms/1000, with nothing to
        # round up. round() is exact here: value * 1000 is within 0.5 of ms.
        if ms / 1000 == value:
            return ms
    try:
        seconds = Decimal(str(value))
    except InvalidOperation as exc:  # pragma: no cover - StrictFloat excludes nan/inf
        raise ValueError("not a number") from exc
    if seconds < 0:
        raise ValueError("must be Unix epoch seconds >= 0")
    return epoch_ms_ceil(seconds)


# A created task's execute_at is read up to four times (validation, the horizon check, its due
# time, its fingerprint), each ~6 us for a date-time: remember the last few thousand.
@functools.lru_cache(maxsize=4096)
def _date_time_ms(value: str) -> int:
    match = _RFC3339.match(value)
    if not match:
        raise ValueError("must be an RFC 3339 date-time with offset, e.g. "
                         "2026-11-22T10:00:00Z, or Unix seconds as a number")
    try:
        moment = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"not a valid date-time: {exc}") from exc
    whole = int(moment.replace(microsecond=0).timestamp())
    return whole * 1000 + _fraction_ms_ceil(match.group(1))


def _fraction_ms_ceil(fraction: str | None) -> int:
    """``.d1d2d3...`` (the regex's fraction group) as milliseconds, rounded up."""
    if fraction is None:
        return 0
    digits = fraction[1:]
    if len(digits) <= 3:
        return int(digits.ljust(3, "0"))
    return int(digits[:3]) + (digits[3:].strip("0") != "")


def _parses_as_execute_at(value: str | float) -> str | float:
    parse_execute_at(value)
    return value


# An RFC 3339 date-time with offset or Unix seconds, checked as it parses (POST, PUT, PATCH).
ExecuteAt = Annotated[StrictStr | Number, AfterValidator(_parses_as_execute_at)]


class TaskFields(BaseModel):
    """Body of ``PUT /tasks/{key}``; ``POST /tasks`` adds ``key``."""

    model_config = ConfigDict(extra="forbid")

    callback_url: StrictStr = Field(max_length=MAX_URL_LENGTH)
    method: Method = Method.POST
    headers: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    body: Any = None
    execute_at: ExecuteAt | None = None
    delay: NonNegative | None = None
    timeout: Positive | None = None
    max_attempts: Annotated[StrictInt, Field(ge=1, le=100)] = 5
    retry_backoff: Backoff = 1.0
    flow_key: Annotated[StrictStr, Field(pattern=KEY_PATTERN)] | None = None
    # Result callbacks (docs/api.md v3): where the outcome is POSTed once the task finishes.
    on_success: Annotated[StrictStr, Field(max_length=MAX_URL_LENGTH)] | None = None
    on_failure: Annotated[StrictStr, Field(max_length=MAX_URL_LENGTH)] | None = None

    @field_validator("callback_url", "on_success", "on_failure")
    @classmethod
    def _absolute_http_url(cls, value: str | None) -> str | None:
        problem = None if value is None else callback_url(value).problem
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("method", mode="before")
    @classmethod
    def _upper_method(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_HEADERS:
            raise ValueError(f"at most {MAX_HEADERS} headers")
        seen: set[str] = set()
        for name, val in value.items():
            lower = name.lower()
            if not _TOKEN.match(name):
                raise ValueError(f"header name {name!r} is not an RFC 9110 token")
            if _FORBIDDEN_VALUE_CHARS.search(val):
                raise ValueError(f"header {name!r} holds CR, LF or NUL")
            if lower in _HOP_BY_HOP or lower.startswith("proxy-"):
                raise ValueError(f"header {name!r} is hop-by-hop or framing: the client sets it")
            if lower in _RESERVED or lower.startswith("timewheel-"):
                raise ValueError(f"header {name!r} is set by timewheel on every callback")
            if lower in seen:
                raise ValueError(f"header {name!r} is given twice")
            seen.add(lower)
        return value

    @model_validator(mode="after")
    def _one_time(self) -> TaskFields:
        if self.execute_at is not None and self.delay is not None:
            raise ValueError("give at most one of execute_at and delay")
        return self


class TaskCreate(TaskFields):
    """Body of ``POST /tasks``."""

    key: Annotated[StrictStr, Field(pattern=KEY_PATTERN)] | None = None


class TaskReschedule(BaseModel):
    """Body of ``PATCH /tasks/{key}``: the new time (exactly one of ``execute_at`` and
    ``delay``), and optionally a new ``max_attempts``; everything else is kept."""

    model_config = ConfigDict(extra="forbid")

    execute_at: ExecuteAt | None = None
    delay: NonNegative | None = None
    max_attempts: Annotated[StrictInt, Field(ge=1, le=100)] | None = None

    @model_validator(mode="after")
    def _exactly_one_time(self) -> TaskReschedule:
        if (self.execute_at is None) == (self.delay is None):
            raise ValueError("give exactly one of execute_at and delay")
        return self

    def due_ms(self, now_ms: int) -> int:
        if self.execute_at is not None:
            return parse_execute_at(self.execute_at)
        assert self.delay is not None  # _exactly_one_time
        return now_ms + round(self.delay * 1000)


class TaskView(BaseModel):
    """What the API shows of a task, the same object everywhere (GET, the answers of POST, PUT
    and PATCH, listings, batch results), including what each attempt sends."""

    key: str
    status: TaskStatus
    execute_at: str
    callback_url: str
    method: str
    attempts: int
    max_attempts: int
    next_attempt_at: str | None
    last_attempt_at: str | None
    last_status_code: int | None
    last_error: str | None
    created_at: str
    finished_at: str | None
    headers: dict[str, str] = Field(description="the headers each attempt sends (Content-Type "
                                    "included when the body is sent as JSON)")
    body: Any = Field(description="the body each attempt sends: its JSON value, or a string "
                      "for a body that is not JSON; null when there is none")
    timeout: float = Field(description="per-attempt timeout, seconds")
    retry_backoff: float = Field(description="seconds before the first retry, doubling")
    flow_key: str = Field(description="the flow whose limits the task's attempts obey")
    attempts_url: str = Field(description="where the task's attempts are listed")
    on_success: str | None = Field(default=None, description="where the outcome is POSTed "
                                   "when the task is delivered (its task: {key}.on_success)")
    on_failure: str | None = Field(default=None, description="where the outcome is POSTed "
                                   "when the task fails for good (its task: {key}.on_failure)")


class TaskList(BaseModel):
    """A page of ``GET /tasks``. ``next_cursor`` is opaque; null means the listing ended. A
    page read in bounded steps may hold fewer than ``limit`` tasks, even none, and still have
    a cursor to follow."""

    tasks: list[TaskView]
    next_cursor: str | None

"""Models of ``/schedules`` (docs/api.md, "Recurring schedules").

A schedule is a cron expression (read in an IANA time zone) or a fixed period counted from the
Unix epoch, plus the template of the task each occurrence becomes. The template is the body of
``PUT /tasks/{key}`` without ``execute_at`` and ``delay``: the occurrence sets the time.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema

from timewheel.models.tasks import TaskFields

SCHEDULE_ID_PATTERN = r"^[A-Za-z0-9._-]{1,150}$"
# Ten years: far beyond any real period, and small enough that occurrence milliseconds stay
# exact in Lua's doubles.
MAX_EVERY_SECONDS = 10 * 365 * 24 * 3600
MAX_CRON_LENGTH = 200
# IANA names: letters, digits and ``_+-/``; anything else (``..``, absolute paths) is refused
# before zoneinfo looks at the file system.
_TZ_NAME = re.compile(r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$")
# A fixed reference for "does this expression ever fire": cronsim gives up after 50 years.
_CRON_PROBE = datetime(2000, 1, 1)  # noqa: DTZ001 - cron is matched on naive wall-clock time


def check_timezone(name: str) -> ZoneInfo:
    """The zone named ``name``, or ValueError: an IANA name that zoneinfo knows."""
    if len(name) > 64 or not _TZ_NAME.match(name):
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as Europe/Berlin)")
    try:
        return ZoneInfo(name)
    except (ValueError, KeyError, OSError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise ValueError(f"unknown time zone {name!r} "
                         "(an IANA name such as Europe/Berlin)") from exc


def check_cron(expr: str) -> str:
    """``expr`` if cronsim reads it as 5 fields (minute hour day month weekday) or 6 with a
    leading seconds field, and it fires at least once; ValueError otherwise."""
    fields = expr.split()
    if len(fields) not in (5, 6):
        raise ValueError("must have 5 fields (minute hour day-of-month month day-of-week) "
                         "or 6 with a leading seconds field")
    try:
        next(CronSim(expr, _CRON_PROBE))
    except CronSimError as exc:
        raise ValueError(f"invalid cron expression: {exc}") from exc
    except StopIteration as exc:
        raise ValueError("the cron expression never fires") from exc
    return expr


class ScheduleTask(TaskFields):
    """The task each occurrence becomes: the body of ``PUT /tasks/{key}`` without
    ``execute_at`` and ``delay`` (the occurrence is the time)."""

    # Kept as fields only to take them out: absent from the schema and from every dump, and a
    # value other than null is refused under the field's own name.
    execute_at: SkipJsonSchema[None] = Field(default=None, exclude=True)
    delay: SkipJsonSchema[None] = Field(default=None, exclude=True)

    @field_validator("execute_at", "delay", mode="before")
    @classmethod
    def _occurrence_sets_time(cls, value: object) -> object:
        if value is not None:
            raise ValueError("not allowed in a schedule's task: each occurrence is its time")
        return value


class ScheduleCreate(BaseModel):
    """Body of ``PUT /schedules/{id}``: exactly one of ``cron`` and ``every``."""

    model_config = ConfigDict(extra="forbid")

    cron: Annotated[StrictStr, Field(max_length=MAX_CRON_LENGTH)] | None = None
    # validate_default: the "exactly one" check below must run when every is absent too.
    every: Annotated[StrictInt, Field(ge=1, le=MAX_EVERY_SECONDS)] | None = Field(
        default=None, validate_default=True)
    timezone: StrictStr = "UTC"
    task: ScheduleTask
    paused: StrictBool = False

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str | None) -> str | None:
        return None if value is None else check_cron(value)

    @field_validator("every")
    @classmethod
    def _exactly_one(cls, value: int | None, info: ValidationInfo) -> int | None:
        if "cron" not in info.data:  # cron itself was invalid: that error says enough
            return value
        if (info.data["cron"] is None) == (value is None):
            raise ValueError("give exactly one of cron and every")
        return value

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str) -> str:
        check_timezone(value)
        return value


ScheduleSpec = ScheduleCreate  # the stored definition is the PUT body itself


class ScheduleView(BaseModel):
    """What the API shows of a schedule. ``next_run_at`` is null while paused."""

    id: str
    cron: str | None
    every: int | None
    timezone: str
    task: ScheduleTask
    paused: bool
    next_run_at: str | None
    last_run_at: str | None
    created_at: str


class ScheduleList(BaseModel):
    """A page of ``GET /schedules``, in id order; ``next_cursor`` (opaque) null at the end."""

    schedules: list[ScheduleView]
    next_cursor: str | None


"""Models of bulk jobs: ``POST /tasks/cancel``, ``POST /tasks/replay``, ``GET /jobs/{id}``
(docs/api.md v3, "Bulk jobs")."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from timewheel.domain import KEY_PATTERN, TaskStatus
from timewheel.models.tasks import ExecuteAt

# A prefix of a task key is made of a key's characters (an empty one would match every task).
KEY_PREFIX_PATTERN = KEY_PATTERN
JOB_ID_PATTERN = r"^[0-9a-f]{16}$"


class JobKind(StrEnum):
    CANCEL = "cancel"
    REPLAY = "replay"


def _no_nulls(schema: dict[str, Any]) -> None:
    """The schema as validation has it: at least one field, none of them null."""
    schema["minProperties"] = 1
    for prop in schema.get("properties", {}).values():
        if "anyOf" in prop:
            prop["anyOf"] = [s for s in prop["anyOf"] if s.get("type") != "null"]
        prop.pop("default", None)


def _one_of(value: object, allowed: tuple[TaskStatus, ...]) -> object:
    """A status a job cannot take is refused as pydantic's Literal refuses it (422,
    ``literal_error``), but naming the values as a client sends them ('scheduled'): the Literal
    of enum members would name them as Python shows them (<TaskStatus.SCHEDULED: 'scheduled'>).
    None goes on to JobFilter's own check ("must not be null")."""
    if value is None or value in allowed:
        return value
    names = [f"'{status.value}'" for status in allowed]
    expected = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
    raise PydanticCustomError("literal_error", "Input should be {expected}",
                              {"expected": expected})


class JobFilter(BaseModel):
    """Body of ``POST /tasks/cancel`` and ``POST /tasks/replay``: which tasks the job acts on.
    At least one field; every field given must hold (AND), and none may be null (a null that
    meant "any" would let a typo purge everything). ``due_before`` and ``created_before`` take
    an RFC 3339 date-time with offset or Unix epoch seconds, like ``execute_at``, and keep
    tasks due (created) strictly before it."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_no_nulls)

    status: TaskStatus | None = None
    key_prefix: Annotated[StrictStr, Field(pattern=KEY_PREFIX_PATTERN)] | None = None
    flow_key: Annotated[StrictStr, Field(pattern=KEY_PATTERN)] | None = None
    due_before: ExecuteAt | None = None
    created_before: ExecuteAt | None = None

    @field_validator("status", "key_prefix", "flow_key", "due_before", "created_before",
                     mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("must not be null: leave the field out to match any value")
        return value

    @model_validator(mode="after")
    def _some_field(self) -> JobFilter:
        if not self.model_fields_set:
            raise ValueError("give at least one of status, key_prefix, flow_key, due_before, "
                             "created_before (a job never acts on every task by default)")
        return self


class CancelFilter(JobFilter):
    """Body of ``POST /tasks/cancel``: a cancel acts on tasks that have not finished."""

    status: Literal[TaskStatus.SCHEDULED, TaskStatus.RETRYING, TaskStatus.DELIVERING] | None = None

    @field_validator("status", mode="before")
    @classmethod
    def _status(cls, value: object) -> object:
        return _one_of(value, (TaskStatus.SCHEDULED, TaskStatus.RETRYING, TaskStatus.DELIVERING))


class ReplayFilter(JobFilter):
    """Body of ``POST /tasks/replay``: a replay acts on failed or cancelled tasks."""

    status: Literal[TaskStatus.FAILED, TaskStatus.CANCELLED] | None = None

    @field_validator("status", mode="before")
    @classmethod
    def _status(cls, value: object) -> object:
        return _one_of(value, (TaskStatus.FAILED, TaskStatus.CANCELLED))


class JobCreated(BaseModel):
    """Answer of ``POST /tasks/cancel`` and ``/tasks/replay`` (202): the job to follow."""

    job: str


class JobView(BaseModel):
    """``GET /jobs/{id}``. ``matched``: tasks the job found matching; ``done``: those it
    cancelled (replayed); ``skipped``: those it could not act on (finished or changed
    meanwhile). ``done + skipped == matched`` at every moment."""

    id: str
    kind: JobKind
    filter: dict[str, str | float | int]
    state: Literal["running", "done", "failed"]
    matched: int
    done: int
    skipped: int
    started_at: str
    finished_at: str | None

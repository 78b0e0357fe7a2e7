"""Models of bulk jobs: ``POST /tasks/cancel``, ``POST /tasks/replay``, ``GET /jobs/{id}``
(docs/api.md v3, "Bulk jobs")."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from timewheel.domain import KEY_PATTERN, TaskStatus
from timewheel.models.tasks import ExecuteAt

# A prefix of a task key is made of a key's characters (an empty one would match every task).
KEY_PREFIX_PATTERN = KEY_PATTERN
JOB_ID_PATTERN = r"^[0-9a-f]{16}$"


class JobKind(StrEnum):
    CANCEL = "cancel"
    REPLAY = "replay"


class JobFilter(BaseModel):
    """Body of ``POST /tasks/cancel`` and ``POST /tasks/replay``: which tasks the job acts on.
    At least one field; every field given must hold (AND). ``due_before`` and
    ``created_before`` take an RFC 3339 date-time with offset or Unix epoch seconds, like
    ``execute_at``, and keep tasks due (created) strictly before it."""

    model_config = ConfigDict(extra="forbid")

    status: TaskStatus | None = None
    key_prefix: Annotated[StrictStr, Field(pattern=KEY_PREFIX_PATTERN)] | None = None
    flow_key: Annotated[StrictStr, Field(pattern=KEY_PATTERN)] | None = None
    due_before: ExecuteAt | None = None
    created_before: ExecuteAt | None = None

    @model_validator(mode="after")
    def _some_field(self) -> JobFilter:
        if not self.model_fields_set or all(getattr(self, name) is None
                                            for name in self.model_fields_set):
            raise ValueError("give at least one of status, key_prefix, flow_key, due_before, "
                             "created_before (a job never acts on every task by default)")
        return self


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

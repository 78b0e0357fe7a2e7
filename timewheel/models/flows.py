"""Models of ``/flows`` (docs/api.md, "Flow control")."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
)

MAX_PARALLELISM = 10_000
MAX_RATE = 100_000
MAX_FLOW_BACKOFF_SECONDS = 86_400  # a flow's retry_backoff and max_backoff: at most a day

Parallelism = Annotated[StrictInt, Field(ge=1, le=MAX_PARALLELISM)]
Rate = (Annotated[StrictInt, Field(gt=0, le=MAX_RATE)]
        | Annotated[StrictFloat, Field(gt=0, le=MAX_RATE, allow_inf_nan=False)])
Seconds = (Annotated[StrictInt, Field(gt=0, le=MAX_FLOW_BACKOFF_SECONDS)]
           | Annotated[StrictFloat, Field(gt=0, le=MAX_FLOW_BACKOFF_SECONDS,
                                          allow_inf_nan=False)])


class FlowLimits(BaseModel):
    """Body of ``PUT /flows/{flow_key}``: the flow's whole configuration (what is absent is
    cleared). ``null`` (or absent): no limit of that kind, except that a flow without
    parallelism gets TIMEWHEEL_FLOW_PARALLELISM; no retry default, so tasks that set none
    get the service's (5 attempts, 1 s doubling, capped at 3600 s)."""

    model_config = ConfigDict(extra="forbid")

    parallelism: Parallelism | None = None
    rate: Rate | None = None
    paused: StrictBool = Field(default=False, description="start no attempt of the flow")
    max_attempts: Annotated[StrictInt, Field(ge=1, le=100)] | None = Field(
        default=None, description="for the flow's tasks that set none")
    retry_backoff: Seconds | None = Field(
        default=None, description="seconds before the first retry, doubling, for the flow's "
        "tasks that set none")
    max_backoff: Seconds | None = Field(
        default=None, description="no retry of the flow waits longer (seconds; default 3600)")

    @field_validator("parallelism", "max_attempts", mode="before")
    @classmethod
    def _integral(cls, value: object) -> object:
        """JSON does not tell 3 from 3.0: a whole number written as a float is an integer
        (as JSON Schema's "integer" says); 2.5, "3" and true stay refused."""
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value


class FlowView(BaseModel):
    """A flow's limits in force and its load now, over every process of the wheel."""

    key: str
    parallelism: int | None
    rate: float | None
    in_flight: int
    waiting: int = Field(description="due tasks of the flow not started because of the flow "
                         "(its limits or a pause), parked or waiting in a process; may lag by "
                         "one tick")
    # Defaults only so that a client reads the view of a server older than v3.
    paused: bool = False
    max_attempts: int | None = None
    retry_backoff: float | None = None
    max_backoff: float | None = None


class FlowList(BaseModel):
    """``GET /flows``: the flows whose limits were set."""

    flows: list[FlowView]

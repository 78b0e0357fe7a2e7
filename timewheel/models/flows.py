"""Models of ``/flows`` (docs/api.md, "Flow control")."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator

MAX_PARALLELISM = 10_000
MAX_RATE = 100_000

Parallelism = Annotated[StrictInt, Field(ge=1, le=MAX_PARALLELISM)]
Rate = (Annotated[StrictInt, Field(gt=0, le=MAX_RATE)]
        | Annotated[StrictFloat, Field(gt=0, le=MAX_RATE, allow_inf_nan=False)])


class FlowLimits(BaseModel):
    """Body of ``PUT /flows/{flow_key}``. ``null`` (or absent): no limit of that kind, except
    that a flow without parallelism gets TIMEWHEEL_FLOW_PARALLELISM."""

    model_config = ConfigDict(extra="forbid")

    parallelism: Parallelism | None = None
    rate: Rate | None = None

    @field_validator("parallelism", mode="before")
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
    waiting: int


class FlowList(BaseModel):
    """``GET /flows``: the flows whose limits were set."""

    flows: list[FlowView]

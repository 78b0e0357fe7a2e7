"""What the flow gate (timewheel/engine/flow_gate.py) keeps per flow and per permit."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from timewheel.delivery.retry_policy import NO_DEFAULTS, RetryDefaults
from timewheel.engine.attempt import Attempt

MAX_WANT = 256  # permit ids asked for in one call


class Release(NamedTuple):
    """A permit to give back; ``sent``: its attempt was (or may have been) sent, so the start
    a rated flow logged for it happened. One never sent takes its logged start back."""

    permit: str
    sent: bool


@dataclass(frozen=True, slots=True)
class Lease:
    """A permit held by this process: its lease in Redis runs out at ``expiry_ms``."""

    expiry_ms: float


@dataclass(eq=False)
class FlowState:
    key: str
    queue: deque[Attempt] = field(default_factory=deque)
    releases: list[Release] = field(default_factory=list)  # to give back to Redis
    parked_buckets: set[int] = field(default_factory=set)
    parked_due: float = float("inf")  # due time of the earliest task parked (a hint)
    exchange: asyncio.Task[None] | None = None  # the permits call under way
    again: bool = False  # something changed while it was under way: call once more
    linger: asyncio.TimerHandle | None = None  # releases wait for company until it fires
    alarm_ms: float | None = None  # the earliest alarm set for this flow
    # The flow had a rate at the last permits call. True until a call says otherwise: a
    # permit is handed on without Redis only for a flow known to have no rate.
    rated: bool = True
    room: int = MAX_WANT  # permits free after the last call (what to ask for next time)
    paused: bool = False  # paused at the last call: nothing is handed on
    retry: RetryDefaults = NO_DEFAULTS  # the flow's retry defaults at the last call

    @property
    def idle(self) -> bool:
        return not (self.queue or self.releases or self.parked_buckets or self.exchange)

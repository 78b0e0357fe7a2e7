"""What the flow gate keeps per flow and per permit (timewheel/engine/flow_gate.py)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from timewheel.store.record import ClaimedTask

MAX_WANT = 256  # permit ids asked for in one call


@dataclass(eq=False, slots=True)
class Waiter:
    task: ClaimedTask
    payload: object  # what the dispatcher gets back with the permit
    permit: str
    park_by_ms: float
    gone: bool = False  # taken out of its queue (parked, handed on, or at shutdown)
    # Started on another attempt's permit (its own, if granted, is then unused and fresh);
    # otherwise a waiter gone has had its own permit queued for giving back.
    handed_on: bool = False


@dataclass(frozen=True, slots=True)
class Lease:
    """A permit held by this process: its lease in Redis runs out at ``expiry_ms``; Redis
    granted it (and so checked the flow's limits) at ``granted_ms``."""

    expiry_ms: float
    granted_ms: float


@dataclass(eq=False)
class FlowState:
    key: str
    queue: deque[Waiter] = field(default_factory=deque)
    releases: list[str] = field(default_factory=list)
    # Permits held with no attempt, kept a moment for this flow's next task (newest last).
    spare: list[str] = field(default_factory=list)
    spare_alarm_ms: float | None = None  # when the oldest spare is given back
    parked_buckets: set[int] = field(default_factory=set)
    running: asyncio.Task[None] | None = None
    dirty: bool = False
    alarm_ms: float | None = None  # the earliest alarm set for this flow
    parked_due: float = float("inf")  # due time of the earliest task parked (a hint)
    # The flow had a rate at the last permits call. True until a call says otherwise: a
    # permit is handed on without Redis only for a flow known to have no rate.
    rated: bool = True
    room: int = MAX_WANT  # permits free after the last call (what to ask for next time)

    @property
    def idle(self) -> bool:
        return not (self.queue or self.releases or self.spare or self.parked_buckets
                    or self.running)

"""Flow operations: what ``/flows`` does, without HTTP. A flow's configuration (limits, pause,
retry defaults) is stored once for the whole wheel (store/flow_store.py) and obeyed by every
process from its next permit on; its load is counted over every process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from timewheel.clock import Clock
from timewheel.models.flows import FlowLimits
from timewheel.store.flow_store import FlowStore, StoredLimits


@dataclass(frozen=True, slots=True)
class FlowState:
    """A flow's configuration as stored (None: not set) and its load now. ``parallelism``:
    the one in force (TIMEWHEEL_FLOW_PARALLELISM when none is set); ``waiting``: tasks parked
    in Redis plus those waiting in the memory of every live process."""

    key: str
    limits: StoredLimits
    parallelism: int
    in_flight: int
    waiting: int


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else max(1, round(seconds * 1000))


def stored_limits(body: FlowLimits) -> StoredLimits:
    """A PUT body as the configuration to store (seconds as whole milliseconds, at least 1)."""
    return StoredLimits(body.parallelism, body.rate, body.paused, body.max_attempts,
                        _ms(body.retry_backoff), _ms(body.max_backoff))


class FlowOperations:
    def __init__(self, flows: FlowStore, clock: Clock, *, default_parallelism: int) -> None:
        self.flows = flows
        self.clock = clock
        self.default_parallelism = default_parallelism

    async def state(self, key: str) -> FlowState:
        """The flow's configuration in force (the defaults for a flow never set) and load."""
        return (await self.states([key]))[0]

    async def states(self, keys: Sequence[str]) -> list[FlowState]:
        """``state`` of each flow: its configuration, its permits held and its tasks parked
        in Redis, pipelined (FlowStore.loads), plus what waits in the memory of every live
        process (reported each tick), in one script call."""
        now = self.clock.now_ms()
        loads = await self.flows.loads(keys, now_ms=now)
        in_processes = await self.flows.waiting_in_processes(keys, now_ms=now)
        return [FlowState(key=key, limits=limits,
                          parallelism=limits.parallelism or self.default_parallelism,
                          in_flight=in_flight, waiting=parked + in_memory)
                for key, (limits, in_flight, parked), in_memory
                in zip(keys, loads, in_processes, strict=True)]

    async def configured(self) -> list[str]:
        """The flows whose configuration was set (every other flow runs on the defaults)."""
        return await self.flows.configured()

    async def set(self, key: str, body: FlowLimits) -> FlowState:
        """Store the whole configuration (what the body leaves out is cleared)."""
        await self.flows.set_limits(key, stored_limits(body))
        return await self.state(key)

    async def set_paused(self, key: str, paused: bool) -> FlowState:
        """Pause or resume, keeping the rest of the configuration."""
        await self.flows.set_paused(key, paused)
        return await self.state(key)

    async def delete(self, key: str) -> None:
        """Back to the defaults."""
        await self.flows.delete_limits(key)

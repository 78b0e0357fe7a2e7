"""This process's share of a flow's ``waiting`` (docs/api.md v3, "what waiting counts").

Attempts refused a permit wait in the process's flow gate (timewheel/engine/flow_gate.py) for
a few seconds before they are parked in Redis, where GET /flows can count them. So that it
counts them before that too, the gate reports once a tick how many wait per flow
(lua/waiting_report.lua), with a TTL of two ticks and a second: a process that dies stops
being counted then. GET /flows adds the live reports to the parked tasks
(lua/waiting_count.lua).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping

from timewheel.clock import Clock
from timewheel.errors import StoreUnavailable
from timewheel.store.flow_store import FlowStore

# A report counts this long past the next tick unless written again.
SLACK_MS = 1_000


class WaitingReport:
    def __init__(self, flows: FlowStore, clock: Clock) -> None:
        self._flows = flows
        self._clock = clock
        # This process in the reports (unique per process start).
        self._process = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._reported = False  # the last report held a count

    async def write(self, counts: Mapping[str, int], *, tick_ms: int) -> None:
        """Report ``counts`` (flow -> attempts waiting here, all > 0). Written only when there
        is something to say: a count, or none after one."""
        if not counts and not self._reported:
            return
        await self._flows.report_waiting(self._process, counts, now_ms=self._clock.now_ms(),
                                         ttl_ms=2 * tick_ms + SLACK_MS)
        self._reported = bool(counts)

    async def clear(self) -> None:
        """Shutdown: nothing waits here any more."""
        if not self._reported:
            return
        try:
            await self._flows.report_waiting(self._process, {}, now_ms=self._clock.now_ms(),
                                             ttl_ms=1)
            self._reported = False
        except StoreUnavailable:
            pass  # Redis (or its clock) away: the report runs out by itself

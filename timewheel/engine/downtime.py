"""Whether every process of the wheel was down: what decides which missed occurrences of a
recurring schedule fire (docs/api.md: after every process was down, only the latest; after
an outage of Redis alone, every one, late). docs/design.md, "Downtime".

Each materializer pass marks ``<prefix>:sched:pass`` with its time. A previous mark within
grace (two ticks) says the wheel was up. An older one says no process reached Redis since:
every process was down, or Redis was (away, full, failing over on a cluster), or both. Only
a process can tell these apart, for itself: if its loop has run since that mark, it tried
every tick and Redis did not answer, so not every process was down. A process that started
or stalled since cannot tell; it waits a few ticks for a pass of one that can (a witness),
and judges the wheel down only if none comes.
"""

from __future__ import annotations

import logging

from timewheel.store.schedule_store import ScheduleStore

log = logging.getLogger(__name__)

WITNESS_WAIT_TICKS = 3  # how long a process that cannot tell waits for one that can


class Downtime:
    def __init__(self, schedules: ScheduleStore, *, tick_ms: int) -> None:
        self._schedules = schedules
        # A due occurrence older than this, with no pass of any process for as long, was
        # missed while the wheel or Redis was down.
        self.grace_ms = 2 * tick_ms
        self.witness_wait_ms = WITNESS_WAIT_TICKS * tick_ms
        self.passed_ms: int | None = None  # now_ms of this process's last whole pass
        # This process's loop: since when it has run without a gap longer than grace, and
        # when it last ran (note_running).
        self._running_since: int | None = None
        self._running_at: int | None = None
        # Its passes waiting for a witness: the first, and the last (a gap longer than grace
        # between two, an outage again, starts the wait over).
        self._unsure_since: int | None = None
        self._unsure_at: int | None = None

    def note_running(self, now_ms: int) -> None:
        """This process's loop is at ``now_ms``: a gap of more than grace since it last was
        (the process stopped, stalled, or had not started) begins a new stretch of running."""
        if self._running_at is None or now_ms - self._running_at > self.grace_ms:
            self._running_since = now_ms
        self._running_at = now_ms

    async def judge(self, now_ms: int) -> bool | None:
        """For a pass at ``now_ms``: None while this process waits for a witness (it marks
        nothing then, and the pass must leave what is behind alone), else whether every
        process was down since the previous pass, the pass marked."""
        if await self._waits_for_a_witness(now_ms):
            return None
        return self.was_down(await self._schedules.mark_pass(now_ms), now_ms)

    def was_down(self, previous: int | None, now_ms: int) -> bool:
        """Whether every process was down since the previous pass (``previous``, any
        process's; None: none in a day), as this process can tell (module docstring): a
        process that started or stalled since that pass cannot, and says down."""
        if previous is None:
            return True
        if previous >= now_ms - self.grace_ms:
            return False
        return self._running_since is None or self._running_since > previous

    async def _waits_for_a_witness(self, now_ms: int) -> bool:
        """Whether this process cannot tell if every process was down and waits, for
        ``witness_wait_ms`` at most, for a process that ran through the outage to pass first:
        that one makes up every missed occurrence, and its mark then tells this one the wheel
        was up. Judging at once, a process started while Redis was away (a deploy during a
        failover) skipped what the running ones would have made up, whenever its pass came
        first. A wait that ends with no witness means every process was down: only the latest
        missed occurrence fires, that much later. A waiting process writes no mark, so that
        another one that cannot tell does not take it for a witness."""
        if self.passed_ms is not None and self.passed_ms >= now_ms - self.grace_ms:
            self._unsure_since = None  # its own recent pass is, or precedes, the last one
            return False
        previous = await self._schedules.last_pass()
        if previous is None or not self.was_down(previous, now_ms):
            self._unsure_since = None  # up; or no pass in a day: nobody to wait for
            return False
        if (self._unsure_since is None or self._unsure_at is None
                or now_ms - self._unsure_at > self.grace_ms):
            self._unsure_since = now_ms
            log.info("schedules: no pass for %d ms, and this process cannot tell whether the "
                     "wheel was down: waiting up to %d ms for one that can", now_ms - previous,
                     self.witness_wait_ms)
        self._unsure_at = now_ms
        if now_ms - self._unsure_since < self.witness_wait_ms:
            return True
        self._unsure_since = None
        return False

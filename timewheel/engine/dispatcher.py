"""Dispatcher: takes claimed tasks from the ticker and carries each attempt through its life,
at its own millisecond (the stages: timewheel/engine/attempt.py).

    submit ──► timeline (until 20 ms before due) ──► flow gate (a permit)
           ──► ready queue ──► a worker: _run ──► start, send, decide ──► record

``_run`` is the life of one admitted attempt, top to bottom. Around it: the ``Timeline``
holds claimed attempts until they are nearly due (one coroutine for all of them), the
``FlowGate`` admits them under their flow's limits, at most ``max_concurrency`` workers send
them, the ``Executor`` sends one and decides its outcome, and the ``Recorder`` writes to
Redis (batched per bucket). The ``Lifecycle`` holds every attempt of this process by stage.

Deadlines: an attempt is sent only while its lease leaves room for all of it
(``Attempt.may_send``, checked before its start and again just before the request goes
out), and within the batch deadline of the tick that claimed it. One that cannot be is
handed back unsent, for any process to claim at once. A rated flow's attempt is sent within
RATE_SLACK_MS of the start its flow logged, or asks its flow again (``_late_for_its_rate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from timewheel.clock import Clock
from timewheel.delivery.netguard import NotWritten
from timewheel.delivery.senders import Sender
from timewheel.delivery.signing import Signer
from timewheel.engine.attempt import Attempt, Lifecycle, Stage
from timewheel.engine.executor import Executor
from timewheel.engine.flow_gate import FlowGate
from timewheel.engine.last_check import LastCheck
from timewheel.engine.recorder import Recorder
from timewheel.engine.timeline import Timeline
from timewheel.logs import LogOnce
from timewheel.metrics import Metrics
from timewheel.store import Store
from timewheel.store.flow_store import RATE_SLACK_MS, FlowStore
from timewheel.store.record import ClaimedTask, Started
from timewheel.tracing import Tracing

log = logging.getLogger(__name__)

# An attempt leaves the timeline this long before it is due (to WAKE_GRID_MS more), to ask its
# flow for a permit (a Redis round trip, batched per flow) off the critical path: with 5 ms the
# permit was often still out at the due time (bench/README.md, spread p99 15-19 ms; 3.7-5.3 ms
# with 20).
START_LEAD_MS = 20.0
# The claim check (lua/start.lua) waits until this long before the due time: from the check on
# the attempt counts as started, and a DELETE after it no longer stops it (docs/api.md: "in
# flight").
CHECK_LEAD_MS = 5.0
# Both wake-ups are on a grid: attempts due within the same WAKE_GRID_MS leave the timeline in
# one pass (one permits call per flow) and start in one call (every bucket's, on a single
# Redis), instead of a wake-up and a ~65 us Redis call each. They are still sent at their due
# millisecond.
WAKE_GRID_MS = 5.0
PARK_LEAD_MS = 100  # an attempt waiting for a permit is parked this long before its send-by


class Dispatcher:
    def __init__(self, store: Store, flows: FlowStore, clock: Clock, sender: Sender,
                 metrics: Metrics, *, signer: Signer | None, max_concurrency: int,
                 batch_deadline_ms: int, tokens: Iterator[str], flow_local_cap: int = 10_000,
                 tracing: Tracing | None = None, log_deliveries: bool = False,
                 key_listers: Callable[[str], Awaitable[Sequence[str]]] | None = None
                 ) -> None:
        self._clock = clock
        # The other live processes that list a key id (KeyListCheck.listers).
        self._key_listers = key_listers or _nobody_lists
        self._told = LogOnce()
        self._metrics = metrics
        self._batch_deadline_ms = batch_deadline_ms
        self._lease_margin_ms = store.lease_margin_ms
        self._max_workers = max_concurrency
        self._lifecycle = Lifecycle()
        # Read when /metrics is scraped, not set per callback (a lock each, twice a callback).
        counts = self._lifecycle.counts
        metrics.inflight.set_function(lambda: counts[Stage.SENT])
        self._recorder = Recorder(store, clock, metrics)
        self._executor = Executor(clock, sender, metrics, signer=signer,
                                  tracing=tracing or Tracing(None),
                                  log_deliveries=log_deliveries, cipher=store.cipher)
        self._ready: asyncio.Queue[Attempt] = asyncio.Queue()
        self._gate = FlowGate(
            flows, store, self._recorder, self._lifecycle, self._ready, clock, metrics,
            tokens=tokens, lease_margin_ms=store.lease_margin_ms,
            batch_deadline_ms=batch_deadline_ms, local_cap=flow_local_cap,
            max_waiting=max_concurrency * 20)
        # Claimed attempts wait on the timeline until just before they are due, then for
        # their flow, then in the ready queue for one of the workers: a burst of 10,000 due
        # tasks costs 10,000 queue entries, not 10,000 coroutines started at once.
        self._timeline: Timeline[Attempt] = Timeline(clock, self._due)
        self._workers: dict[asyncio.Task[None], Attempt | None] = {}  # -> the attempt it runs
        self._recording: set[asyncio.Future[bool]] = set()  # outcomes being written
        self._stopping = False

    @property
    def in_flight(self) -> int:
        """Attempts this process holds in any stage, and hand-backs still being written."""
        return len(self._lifecycle) + self._recorder.busy

    @property
    def returning_permits(self) -> int:
        """Permits given back by attempts of this process, not yet back in Redis."""
        return self._gate.returning

    @property
    def holding(self) -> int:
        """Claims that count against the ticker's budget: all but those waiting for a permit
        of their flow (bounded on their own, per flow and in all), so a flow that floods
        its own waiting room never stops this process from claiming other flows' tasks."""
        return self.in_flight - self._gate.waiting

    async def poll_flows(self, tick_ms: int = 1000) -> None:
        """Once a tick: take back parked tasks whose flow has room (any process parked them),
        and report the attempts waiting here for their flow."""
        self._start_workers()
        await self._gate.poll(tick_ms)

    def submit(self, tasks: Sequence[ClaimedTask], claimed_at_ms: int) -> None:
        """Take over freshly claimed tasks; each fires at its own time."""
        self._start_workers()
        for task in tasks:
            attempt = self._lifecycle.add(Attempt.claimed(
                task, claimed_at_ms, batch_deadline_ms=self._batch_deadline_ms,
                lease_margin_ms=self._lease_margin_ms))
            self._timeline.add(on_grid(task.due_ms - START_LEAD_MS), attempt)

    def _due(self, attempt: Attempt) -> None:
        """Nearly due: ask its flow for a permit. It may wait for one until just before it
        must be sent, then it is parked in Redis."""
        self._lifecycle.wait_for_flow(attempt, park_by_ms=attempt.send_by_ms - PARK_LEAD_MS)
        self._gate.admit(attempt)

    # -- the life of one admitted attempt -------------------------------------------------

    async def _run(self, attempt: Attempt) -> None:
        """ADMITTED -> STARTED -> SENT -> ANSWERED, then recorded in the background (STARTED
        -> ANSWERED for a record that does not open here: failed, never sent, unless another
        process can open it); or SKIPPED (cancelled or replaced since the claim) or
        HANDED_BACK (not sent)."""
        task = attempt.task
        now = self._clock.now_ms()
        if self._late_for_its_rate(attempt, now):
            return
        if not attempt.may_send(now):
            # Seen in the soak during Redis stalls and partitions too: the flow's permit
            # call waited on Redis, not on a busy process.
            self._hand_back(attempt, "it could not start in time (the process saturated or "
                                     "stalled, or its flow's permit waited on Redis)")
            return
        await self._clock.sleep_until(on_grid(task.due_ms - CHECK_LEAD_MS))
        started = await self._start(attempt)
        if started is None:
            return
        await self._clock.sleep_until(max(task.due_ms, attempt.start_ms))  # never early
        now = self._clock.now_ms()
        if self._late_for_its_rate(attempt, now):
            return
        timeout_ms = min(task.timeout_ms, attempt.deadline_ms - now)
        if not attempt.may_send(now) or timeout_ms <= 0:
            # Stalled (a paused or starved process) between its start and now: its lease no
            # longer has room for it, and another process may have it already.
            self._hand_back(attempt, "its lease ran short before it was sent (stalled)")
            return
        if started.unsendable is None:
            self._lifecycle.move(attempt, Stage.SENT)
            try:
                check = self._last_check(attempt)
                outcome = await self._executor.send(attempt, timeout_ms, check.ready,
                                                    check.written)
            except NotWritten:  # its connection came too late: nothing was written
                self._not_written(attempt)
                return
        else:  # its record does not open here: failed at its time, never sent
            outcome = self._executor.set_aside(attempt)
        self._lifecycle.move(attempt, Stage.ANSWERED)
        self._gate.give_back(attempt)
        recording = self._recorder.record_soon(attempt, outcome)
        self._recording.add(recording)
        recording.add_done_callback(functools.partial(self._recorded, attempt))

    async def _start(self, attempt: Attempt) -> Started | None:
        """Its start check (lua/start.lua), CHECK_LEAD_MS before it is due: ADMITTED ->
        STARTED with what to send, or None when this process is not to send it (SKIPPED or
        HANDED_BACK)."""
        try:
            started = await self._recorder.start(attempt)
        except Exception as exc:  # StoreUnavailable, or a client library's own error
            # Whether it was counted is unknown; it was not sent: hand it back once Redis
            # answers, rather than leave it to its whole lease.
            self._hand_back(attempt, f"its start failed: {type(exc).__name__}: {exc}")
            return None
        if not started.attempt:  # cancelled or replaced since the claim: not ours to send
            if attempt.started is not None:
                # Started once already (a rated flow's attempt that asked again), then
                # cancelled: release.lua clears the claim cancel kept and notes it in the history.
                self._hand_back(attempt, "cancelled after its start")
                return None
            self._lifecycle.move(attempt, Stage.SKIPPED)
            self._gate.give_back(attempt)
            self._metrics.skipped.inc()
            return None
        self._lifecycle.start(attempt, started)
        if (started.unknown_key is not None
                and await self._handed_on(attempt, started.unknown_key)):
            return None
        return started

    async def _handed_on(self, attempt: Attempt, key_id: str) -> bool:
        """Its record is sealed under a key id this process does not list. While another live
        process lists it, the attempt is handed back (unsent, uncounted) for that one to claim
        at its next tick, not failed for good here (docs/security.md, "What a skipped step
        costs"). Handed back before its due time: this process holds it no longer than it must."""
        listers = await self._key_listers(key_id)
        if not listers:
            return False
        if self._told.first(key_id):
            log.warning("tasks sealed under key id %r, which this process does not list, are "
                        "handed back for the processes that list it (%s), and sent late",
                        key_id, ", ".join(listers))
        self._hand_back(attempt, f"sealed under key id {key_id!r}, which this process does not "
                                 "list")
        return True

    def _recorded(self, attempt: Attempt, recording: asyncio.Future[bool]) -> None:
        """Its outcome is written, or not (an error, or cancelled at shutdown: the lease
        re-sends an unrecorded attempt)."""
        self._recording.discard(recording)
        recorded = (not recording.cancelled() and recording.exception() is None
                    and recording.result())
        self._lifecycle.move(attempt, Stage.RECORDED if recorded else Stage.UNRECORDED)

    def _abandon(self, attempt: Attempt, why: str) -> None:
        """An attempt whose worker stopped (it failed, or shutdown cancelled it) leaves this
        process's books: not sent, it is handed back; sent, its outcome is unknown and its
        lease re-sends it."""
        if attempt.stage in (Stage.ADMITTED, Stage.STARTED):
            self._hand_back(attempt, why)
        elif attempt.stage is Stage.SENT:  # no answer, so no other outcome counted it
            self._metrics.outcomes["abandoned"].inc()
            self._lifecycle.move(attempt, Stage.UNRECORDED)
            self._gate.give_back(attempt)

    def _late_for_its_rate(self, attempt: Attempt, now: int) -> bool:
        """A rated flow logged this attempt's start for ``start_ms``; sent much later, it
        could overrun the rate (starts logged since would bunch up behind it). Then it asks
        its flow again (and is started again: lua/start.lua answers the same attempt)."""
        if now <= attempt.start_ms + RATE_SLACK_MS or not attempt.rated:
            return False
        self._gate.give_back(attempt)
        self._lifecycle.wait_again(attempt)
        self._gate.admit(attempt)
        return True

    def _not_written(self, attempt: Attempt) -> None:
        """The sender's last check held its request back (nothing was written). Past its lease
        it is handed back; a rated flow's attempt late for its logged start asks its flow
        again, once (``_last_check``), and not while stopping: no worker would send it then."""
        now = self._clock.now_ms()
        if not attempt.may_send(now):
            self._hand_back(attempt, "its lease ran short before its request was written")
        elif self._stopping or attempt.held_at_write:  # (held once: a clock stepped back)
            self._hand_back(attempt, "its connection came too late for its flow's rate")
        elif not self._late_for_its_rate(attempt, now):  # in time after all (a clock step)
            self._hand_back(attempt, "its request was not written")

    def _last_check(self, attempt: Attempt) -> LastCheck:
        """The sender's last check, once the attempt's connection is ready: its lease still has
        room and, for a rated flow's attempt, it is still within RATE_SLACK_MS of its logged
        start. A new connection can take longer than that (a TLS dial: 100 ms and more), and
        the attempts that dialled would reach the receiver bunched with the next window's,
        sent on pooled connections. Held back once, an attempt is written however long its
        connection takes then (a receiver may close every connection)."""
        write_by = attempt.send_by_ms
        if attempt.rated and not attempt.held_at_write:
            write_by = min(write_by, attempt.start_ms + RATE_SLACK_MS)
        return LastCheck(self._clock, attempt, write_by)

    def _hand_back(self, attempt: Attempt, why: str) -> None:
        """Give an unsent attempt's claim back to the wheel (and its permit to its flow)."""
        self._lifecycle.move(attempt, Stage.HANDED_BACK)
        self._gate.give_back(attempt)
        self._recorder.hand_back([attempt], why)

    # -- workers ----------------------------------------------------------------------------

    def _start_workers(self) -> None:
        while len(self._workers) < self._max_workers:
            worker = asyncio.create_task(self._work(), name="timewheel-worker")
            self._workers[worker] = None

    async def _work(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        while not self._stopping:
            attempt = await self._ready.get()
            self._workers[me] = attempt
            try:
                await self._run(attempt)
            except asyncio.CancelledError:  # shutdown: not sent yet, or past the grace period
                self._abandon(attempt, "shutting down")
                raise
            except Exception:  # one bad attempt must not stop the worker
                log.exception("delivering %s failed", attempt.task.key)
                self._abandon(attempt, "its worker failed before it was sent")
            finally:
                self._workers[me] = None

    # -- shutdown ---------------------------------------------------------------------------

    async def stop(self, grace_seconds: float) -> None:
        """Hand back every claim not yet sent, at once; give attempts in flight up to
        ``grace_seconds`` to finish and be recorded; abandon the rest to their leases."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        self._stopping = True  # a worker whose attempt is in flight ends after it
        await self._hand_back_unsent()
        # Workers not yet sending stop now (each hands its attempt back); the others finish.
        sending = set()
        for worker, running in self._workers.items():
            if running is not None and running.stage is Stage.SENT:
                sending.add(worker)
            else:
                worker.cancel()
        for group in (sending, self._recording):
            late = await _wait(group, deadline - loop.time())
            if late:
                log.warning("%d attempts or outcomes unfinished at shutdown; their leases "
                            "will re-send them", late)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._workers, *self._recording, return_exceptions=True)
        self._workers.clear()
        await self._recorder.drain(max(0.5, deadline - loop.time()))
        await self._gate.close()

    async def _hand_back_unsent(self) -> None:
        """Shutdown: the attempts on the timeline, waiting for their flow or in the ready
        queue go back to the wheel (with their permits, if they hold any)."""
        unsent = self._timeline.drain()
        await self._timeline.close()
        unsent += self._gate.drain()  # from now on a permit given back is not handed on
        while not self._ready.empty():
            unsent.append(self._ready.get_nowait())
        for attempt in unsent:
            self._lifecycle.move(attempt, Stage.HANDED_BACK)
            self._gate.give_back(attempt)
        if unsent:
            self._recorder.hand_back(unsent, "shutting down")


async def _nobody_lists(key_id: str) -> Sequence[str]:
    """No key-list check (tests): a task this process cannot open is failed here."""
    return ()


def on_grid(ms: float) -> float:
    """``ms`` rounded down to the wake-up grid (WAKE_GRID_MS)."""
    return ms // WAKE_GRID_MS * WAKE_GRID_MS


async def _wait(tasks: Iterable[asyncio.Future[Any]], timeout: float) -> int:
    """Wait up to ``timeout`` s (at least 0.1) for the tasks (or futures); cancel the rest;
    how many."""
    waiting = set(tasks)
    if not waiting:
        return 0
    _, late = await asyncio.wait(waiting, timeout=max(0.1, timeout))
    for task in late:
        task.cancel()
    return len(late)

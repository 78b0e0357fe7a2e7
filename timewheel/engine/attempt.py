"""One attempt of one claimed task, from claim to record: its stages, and who holds it.

The life of an attempt, read top to bottom in timewheel/engine/dispatcher.py ``_run``. The
picture has every edge of ``NEXT``: down the middle, back up on the left (a rated flow's
attempt asking its flow again), out to the right (``──► A, B`` is an edge to each):

            CLAIMED ──────────────► HANDED_BACK
               │
               ▼
    ┌──► WAITING_FOR_FLOW ────────► PARKED, SKIPPED, HANDED_BACK
    │          │
    │          ▼
    ├───── ADMITTED ──────────────► SKIPPED, HANDED_BACK
    │          │
    │          ▼
    ├───── STARTED ───────────────► HANDED_BACK, ANSWERED (its record does not open: unsent)
    │          │
    │          ▼
    └───── SENT ──────────────────► HANDED_BACK, UNRECORDED
               │
               ▼
            ANSWERED ─────────────► RECORDED, UNRECORDED

- CLAIMED: held under a lease, on the timeline until just before it is due.
- WAITING_FOR_FLOW: due; its flow has no permit for it yet (timewheel/engine/flow_gate.py).
- ADMITTED: holds a permit of its flow; a worker takes it.
- STARTED: Redis counted the attempt (lua/start.lua) and handed over headers and body.
- SENT: the request is on its way (waiting for its connection, then written). Only from here
  on can the receiver have seen it; the lease (and a rated flow's logged start) is asked once
  more just before the write.
- ANSWERED: its outcome is decided (an answer, an error or a timeout), being recorded.
- Terminal: RECORDED (outcome and history written), UNRECORDED (sent, but its outcome not
  written: Redis did not take it within the lease, the send failed in a way no outcome
  describes, or shutdown cut it short; its lease re-sends the task), PARKED (waits in Redis for
  its flow), SKIPPED (cancelled or replaced since the claim), HANDED_BACK (never sent, given
  back for any process to claim at once: late, stalled past its lease, or shutting down).

``Lifecycle`` is the one owner of the attempts this process holds: every stage change goes
through ``move``, which refuses a transition that the picture above does not have. An attempt
may be STARTED more than once (after asking its flow again; lua/start.lua answers the same
attempt number). It is written at most once: SENT leads back only from the sender's last
check before the write (NotWritten), once per attempt (``Attempt.sends``, counted by
``move``), when a rated flow's attempt got its connection too late for its logged start. A
claim has one attempt (a task taken back from Redis is a new claim, with a new attempt), so a
task is sent at most once per claim.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from timewheel.delivery.retry_policy import NO_DEFAULTS, RetryDefaults
from timewheel.errors import TimeWheelError
from timewheel.store.record import ClaimedTask, Started

# An attempt must be sent this long before its lease could run out (so that its answer is in
# before another process may re-claim the task): at most the lease margin's half.
SEND_SAFETY_MS = 1000


class Stage(enum.Enum):
    CLAIMED = "claimed"
    WAITING_FOR_FLOW = "waiting for its flow"
    ADMITTED = "admitted"
    STARTED = "started"
    SENT = "sent"
    ANSWERED = "answered"
    RECORDED = "recorded"
    UNRECORDED = "unrecorded"
    PARKED = "parked"
    SKIPPED = "skipped"
    HANDED_BACK = "handed back"

    # Members are singletons, so identity is their hash: C speed in the dicts and sets that
    # ``move`` consults several times per attempt (Enum's own __hash__ is Python code, 3x
    # slower; py-spy put Lifecycle.move at ~2.5 % of a burst's service CPU with it).
    __hash__ = object.__hash__


NEXT: dict[Stage, frozenset[Stage]] = {
    Stage.CLAIMED: frozenset({Stage.WAITING_FOR_FLOW, Stage.HANDED_BACK}),
    # -> SKIPPED: parking found it cancelled or replaced meanwhile.
    Stage.WAITING_FOR_FLOW: frozenset({Stage.ADMITTED, Stage.PARKED, Stage.SKIPPED,
                                       Stage.HANDED_BACK}),
    # Back to WAITING_FOR_FLOW: a rated flow's permit went stale while it waited for a worker.
    Stage.ADMITTED: frozenset({Stage.STARTED, Stage.SKIPPED, Stage.HANDED_BACK,
                               Stage.WAITING_FOR_FLOW}),
    # Back to WAITING_FOR_FLOW from STARTED too: lua/start.lua answers a started attempt again
    # with the same number, so a rated flow's attempt late for its logged start asks again.
    # STARTED -> ANSWERED: its record does not open here (Started.unsendable), so it is
    # failed at its time without a request (Executor.set_aside); or, sealed under a key id
    # another live process lists, -> HANDED_BACK for that one (Dispatcher._handed_on).
    Stage.STARTED: frozenset({Stage.SENT, Stage.ANSWERED, Stage.HANDED_BACK,
                              Stage.WAITING_FOR_FLOW}),
    # SENT -> HANDED_BACK: its connection came only after its lease ran short, so the
    # request was never written (timewheel/delivery/netguard.py NotWritten).
    # SENT -> WAITING_FOR_FLOW: not written either, its connection came too late for its
    # rated flow's logged start (a dial): it asks its flow again, once (Lifecycle.wait_again).
    # SENT -> UNRECORDED: the send failed in a way no outcome describes (a bug, a library
    # error): what the receiver saw is unknown, so the lease re-sends it.
    Stage.SENT: frozenset({Stage.ANSWERED, Stage.HANDED_BACK, Stage.WAITING_FOR_FLOW,
                           Stage.UNRECORDED}),
    Stage.ANSWERED: frozenset({Stage.RECORDED, Stage.UNRECORDED}),
}
TERMINAL = frozenset(Stage) - NEXT.keys()


class IllegalTransition(TimeWheelError):
    """A bug: an attempt was moved along an edge its lifecycle does not have."""


@dataclass(eq=False, slots=True)
class Attempt:
    """The next attempt of a claimed task, carried through its stages by one worker at a
    time. ``send_by_ms`` is the latest moment it may go on the wire (wheel time): after it, its
    answer could come after its lease ran out and another process re-sent it.

    Its fields change in this module only: the stage, with the fields that go with it, in
    ``Lifecycle``; the permit alone in ``ask_for`` and ``drop_permit``. Others read them."""

    task: ClaimedTask
    claimed_at_ms: int
    deadline_ms: int  # the batch deadline of the tick that claimed it
    send_by_ms: int
    stage: Stage = Stage.CLAIMED
    permit: str | None = None  # the flow's permit, from ADMITTED until given back
    start_ms: int = 0  # the flow logged its start for this moment: not sent before it
    started: Started | None = None  # what lua/start.lua handed over (STARTED on)
    park_by_ms: float = 0.0  # waiting for its flow this long at most, then parked
    retry: RetryDefaults = NO_DEFAULTS  # its flow's retry defaults, as of its permit
    rated: bool = False  # its flow had a rate as of its permit: its start is logged there
    sends: int = 0  # times it reached SENT (twice only after a hold at the write, see NEXT)

    @classmethod
    def claimed(cls, task: ClaimedTask, claimed_at_ms: int, *, batch_deadline_ms: int,
                lease_margin_ms: int) -> Attempt:
        """The lease runs out at max(due, claimed) + timeout + margin (lua/lib/claiming.lua);
        sending by max(due, claimed) + a share of the margin leaves the attempt its whole
        timeout before then."""
        lease_from = max(task.due_ms, claimed_at_ms)
        room = max(lease_margin_ms // 2, lease_margin_ms - SEND_SAFETY_MS)
        return cls(task, claimed_at_ms, claimed_at_ms + batch_deadline_ms, lease_from + room)

    @property
    def sent(self) -> bool:
        """It reached SENT: from then on its request may have been written, whatever followed
        (a sender's NotWritten included: aiohttp re-sends an idempotent request after a
        disconnect and may refuse the second try, the first written)."""
        return self.sends > 0

    @property
    def held_at_write(self) -> bool:
        """Held back at the write once already (it is in SENT a second time, or was)."""
        return self.sends > 1

    def may_send(self, now_ms: int) -> bool:
        """Whether its lease still has room for the whole attempt: checked on this process's
        clock just before the request goes out (a stalled process gives the attempt up)."""
        return now_ms <= self.send_by_ms

    @property
    def claim(self) -> tuple[str, str]:
        return self.task.key, self.task.token

    # The permit alone changes within a stage: asked for while waiting, dropped when given
    # back. The other fields change with their stage, in Lifecycle.

    def ask_for(self, permit: str) -> None:
        """Waiting for its flow: the permit id it asks for (granted, it is admitted on it)."""
        self.permit = permit

    def drop_permit(self) -> str | None:
        """Done with its permit, or with the one it asked for: which one, to give back."""
        permit, self.permit = self.permit, None
        return permit


@dataclass
class Lifecycle:
    """The attempts this process holds, by stage. ``move`` is the only code that changes a
    stage; ``wait_for_flow``, ``admit`` and ``start`` are moves that set their fields too."""

    live: set[Attempt] = field(default_factory=set)
    counts: Counter[Stage] = field(default_factory=Counter)

    def add(self, attempt: Attempt) -> Attempt:
        if attempt.stage is not Stage.CLAIMED or attempt in self.live:
            raise IllegalTransition(f"{attempt.task.key}: added in stage {attempt.stage.value}")
        self.live.add(attempt)
        self.counts[Stage.CLAIMED] += 1
        return attempt

    def move(self, attempt: Attempt, to: Stage) -> None:
        if attempt not in self.live or to not in NEXT.get(attempt.stage, ()):
            raise IllegalTransition(f"{attempt.task.key}: {attempt.stage.value} -> {to.value}")
        self.counts[attempt.stage] -= 1
        attempt.stage = to
        if to is Stage.SENT:
            attempt.sends += 1
        if to in TERMINAL:
            self.live.discard(attempt)
        else:
            self.counts[to] += 1

    # The transitions that carry data: the stage and its fields change together.

    def wait_for_flow(self, attempt: Attempt, park_by_ms: float) -> None:
        """Due: it waits for a permit of its flow until ``park_by_ms``, then it is parked."""
        self.move(attempt, Stage.WAITING_FOR_FLOW)
        attempt.park_by_ms = park_by_ms

    def admit(self, attempt: Attempt, permit: str, start_ms: int, retry: RetryDefaults, *,
              rated: bool) -> None:
        """It holds ``permit`` of its flow, which logged its start for ``start_ms`` if
        ``rated`` (it is not sent before), and the flow's retry defaults as of that permit."""
        self.move(attempt, Stage.ADMITTED)
        attempt.permit, attempt.start_ms, attempt.retry = permit, start_ms, retry
        attempt.rated = rated

    def wait_again(self, attempt: Attempt) -> None:
        """A rated flow's attempt, late for the start its flow logged, waits for its flow
        again. From SENT (its request held back at the write) only once: from then on it is
        written however long its connection takes, so a receiver that closes every
        connection still gets it."""
        if attempt.stage is Stage.SENT and attempt.held_at_write:
            raise IllegalTransition(f"{attempt.task.key}: held back at the write twice")
        self.move(attempt, Stage.WAITING_FOR_FLOW)

    def start(self, attempt: Attempt, started: Started) -> None:
        """Redis counted it (lua/start.lua) and handed over what to send."""
        self.move(attempt, Stage.STARTED)
        attempt.started = started

    def __len__(self) -> int:
        return len(self.live)

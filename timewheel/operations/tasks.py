"""Task operations: what ``/tasks`` and ``/tasks/batch`` do, without HTTP.

The checks that depend on settings (the horizon, a timeout within the batch deadline, the
callback address against the network policy) come first; then the store is called and its
replies (timewheel/store/replies.py) become results or domain errors (timewheel/errors.py),
which api/errors.py maps to status codes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, unique

from timewheel.clock import Clock
from timewheel.delivery.netguard import BlockedAddress, NetworkPolicy
from timewheel.delivery.retry_policy import NO_DEFAULTS, RetryDefaults
from timewheel.domain import TaskStatus, result_parent
from timewheel.errors import InvalidInput, TaskConflict, TaskNotFound
from timewheel.metrics import Metrics
from timewheel.models import TaskCreate, TaskFields, TaskReschedule
from timewheel.operations.prepare import DEFAULT_TIMEOUT_SECONDS, due_ms, prepare
from timewheel.store import CancelReply, ReplayReply, RescheduleReply, ScheduleReply, Store
from timewheel.store.attempts import AttemptRecord
from timewheel.store.batch import get_many, schedule_many
from timewheel.store.flow_store import FlowStore
from timewheel.store.listing import BadCursor, decode_cursor, encode_cursor, list_tasks
from timewheel.store.record import NewTask, TaskRecord, new_key

# A first callback usually goes to a local receiver: the refusal says how to allow it.
ALLOW_PRIVATE_HINT = ("set TIMEWHEEL_ALLOW_PRIVATE_NETWORKS=true (or serve "
                      "--allow-private-networks) to allow it, or list its network in "
                      "TIMEWHEEL_ALLOWED_NETWORKS")


@dataclass(frozen=True, slots=True)
class TaskLimits:
    """The settings the checks read (TIMEWHEEL_MAX_HORIZON_SECONDS,
    TIMEWHEEL_BATCH_DEADLINE_SECONDS)."""

    max_horizon_seconds: float
    batch_deadline_seconds: float

    @property
    def default_timeout(self) -> float:
        """A task's timeout when it names none: never past the batch deadline."""
        return min(DEFAULT_TIMEOUT_SECONDS, self.batch_deadline_seconds)


@dataclass(frozen=True, slots=True)
class Created:
    """A create or replace: ``created`` False when it replaced a task, or (POST) found an
    identical one, which ``record`` then is."""

    created: bool
    record: TaskRecord


@unique
class Stored(Enum):
    """What became of one task of a batch (``create_many``)."""

    CREATED = "created"
    EXISTS = "exists"  # an identical task was there
    CONFLICT = "conflict"  # the key holds a task with other content


_STORED = {ScheduleReply.CREATED: Stored.CREATED, ScheduleReply.EXISTS: Stored.EXISTS,
           ScheduleReply.CONFLICT: Stored.CONFLICT}


@dataclass(frozen=True, slots=True)
class BatchCreated:
    """What ``create_many`` did. ``outcomes``: each task's, in order. ``existing``: the tasks
    that the ones not created met, by key (None: expired meanwhile, or past the byte budget
    of get_many: a conflicting task with a large body). ``retry``: the retry defaults in force,
    by flow, for the flows of the tasks that set no ``max_attempts`` or ``retry_backoff``."""

    outcomes: list[Stored]
    existing: dict[str, TaskRecord | None]
    retry: dict[str, RetryDefaults]


class TaskOperations:
    def __init__(self, store: Store, clock: Clock, policy: NetworkPolicy, limits: TaskLimits,
                 metrics: Metrics, flows: FlowStore | None = None) -> None:
        self.store = store
        self.flows = flows
        self.clock = clock
        self.policy = policy
        self.limits = limits
        self.metrics = metrics

    # -- what a task's view shows -------------------------------------------------------------

    async def resolved(self, records: Sequence[TaskRecord]) -> list[TaskRecord]:
        """The records with the retry fields in force: a task that set no ``max_attempts`` or
        ``retry_backoff`` (stored as 0) shows its flow's default, else the service's."""
        unset = {r.flow for r in records if not (r.max_attempts and r.backoff_ms)}
        if not unset:
            return list(records)
        defaults = ({} if self.flows is None else
                    await self.flows.retry_defaults(unset, now_ms=self.clock.now_ms()))
        out = []
        for record in records:
            if record.flow in unset:
                retry = defaults.get(record.flow, NO_DEFAULTS)
                record = dataclasses.replace(
                    record, max_attempts=retry.max_attempts_for(record.max_attempts),
                    backoff_ms=retry.backoff_ms_for(record.backoff_ms))
            out.append(record)
        return out

    async def _one(self, record: TaskRecord) -> TaskRecord:
        return (await self.resolved([record]))[0]

    async def _found(self, key: str) -> TaskRecord | None:
        record = await self.store.get(key)
        return None if record is None else await self._one(record)

    # -- checks -------------------------------------------------------------------------------

    def within_horizon(self, delay: float | None, execute_at: object, due: Callable[[], int],
                       now: int) -> int:
        """The due time, or InvalidInput when it is beyond TIMEWHEEL_MAX_HORIZON_SECONDS."""
        horizon = self.limits.max_horizon_seconds
        # The delay is compared before it is turned into milliseconds: 1e305 s would overflow.
        if delay is None or delay <= horizon:
            due_at = due()
            if due_at - now <= horizon * 1000:
                return due_at
        field, value = ("delay", delay) if delay is not None else ("execute_at", execute_at)
        raise InvalidInput(("body", field), f"is more than {horizon:g}s ahead "
                           "(TIMEWHEEL_MAX_HORIZON_SECONDS)", value)

    def prepare(self, fields: TaskFields, key: str, now: int) -> NewTask:
        """The settings' limits, then the record to store. Raises InvalidInput (and
        BodyTooLarge)."""
        deadline = self.limits.batch_deadline_seconds
        if fields.timeout is not None and fields.timeout > deadline:
            raise InvalidInput(("body", "timeout"),
                               f"must be at most the batch deadline ({deadline:g}s)",
                               fields.timeout)
        self.within_horizon(fields.delay, fields.execute_at, lambda: due_ms(fields, now), now)
        self._check_url(fields, "callback_url")
        if fields.on_success is not None or fields.on_failure is not None:
            self._check_results(fields, key)
        return prepare(fields, key, now, default_timeout=self.limits.default_timeout)

    def _check_url(self, fields: TaskFields, name: str) -> None:
        url = getattr(fields, name)
        try:
            self.policy.check_url_host(url)
        except BlockedAddress as exc:
            raise InvalidInput(("body", name), f"{exc}; {ALLOW_PRIVATE_HINT}", url) from exc

    def _check_results(self, fields: TaskFields, key: str) -> None:
        """Result callbacks: the callback URL's network rules, and none on a result task
        (its own outcome calls no further result callback, docs/api.md v3)."""
        names = [name for name in ("on_success", "on_failure") if getattr(fields, name)]
        for name in names:
            self._check_url(fields, name)
        if result_parent(key) is not None:
            raise InvalidInput(("body", names[0]), "a result callback's task (a key ending in "
                               ".on_success or .on_failure) takes no result callback of its "
                               "own", getattr(fields, names[0]))

    # -- one task -----------------------------------------------------------------------------

    def prepare_new(self, fields: TaskCreate, now: int) -> NewTask:
        """``prepare`` under the request's key, or a new one when it names none."""
        return self.prepare(fields, fields.key or new_key(), now)

    async def create(self, fields: TaskCreate) -> Created:
        """POST: raises TaskConflict when the key holds other content."""
        now = self.clock.now_ms()
        task = self.prepare_new(fields, now)
        key = task.key
        code = await self.store.schedule(task, replace=False, now_ms=now)
        if code is ScheduleReply.CONFLICT:
            raise TaskConflict(f"task {key!r} exists with other content")
        if code is ScheduleReply.EXISTS:
            return Created(False, await self.get(key))
        self.metrics.scheduled.inc()
        return Created(True, await self._one(task.as_record(now)))

    async def replace(self, key: str, fields: TaskFields) -> Created:
        """PUT: create the task, or replace it if it has not finished."""
        now = self.clock.now_ms()
        task = self.prepare(fields, key, now)
        code = await self.store.schedule(task, replace=True, now_ms=now)
        self.metrics.scheduled.inc()
        return Created(code is ScheduleReply.CREATED, await self._one(task.as_record(now)))

    async def reschedule(self, key: str, change: TaskReschedule) -> TaskRecord:
        """PATCH: a new time (and maybe max_attempts) for a task that has not finished."""
        now = self.clock.now_ms()
        due = self.within_horizon(change.delay, change.execute_at,
                                  lambda: change.due_ms(now), now)
        code = await self.store.reschedule(key, due_ms=due, max_attempts=change.max_attempts,
                                           now_ms=now)
        if code is RescheduleReply.NOT_FOUND:
            raise TaskNotFound(key)
        if code is RescheduleReply.FINISHED:
            raise TaskConflict(f"task {key!r} has already finished", await self._found(key))
        if code is RescheduleReply.TOO_FEW_ATTEMPTS:
            made = (await self.get(key)).attempts
            raise InvalidInput(("body", "max_attempts"),
                               f"must be more than the {made} attempts already made",
                               change.max_attempts)
        return await self.get(key)

    async def cancel(self, key: str) -> None:
        """DELETE: once this returns, no attempt starts."""
        code = await self.store.cancel(key, now_ms=self.clock.now_ms())
        if code is CancelReply.NOT_FOUND:
            raise TaskNotFound(key)
        if code is CancelReply.FINISHED:
            raise TaskConflict(f"task {key!r} has already finished", await self._found(key))
        self.metrics.cancelled.inc()

    async def replay(self, key: str) -> TaskRecord:
        """Schedule a failed or cancelled task again, now, with its attempts reset."""
        code = await self.store.replay(key, now_ms=self.clock.now_ms())
        if code is ReplayReply.NOT_FOUND:
            raise TaskNotFound(key)
        if code is ReplayReply.NOT_FAILED:
            raise TaskConflict(f"task {key!r} is neither failed nor cancelled",
                               await self._found(key))
        return await self.get(key)

    async def get(self, key: str) -> TaskRecord:
        record = await self.store.get(key)
        if record is None:  # (also: expired between a script and this read)
            raise TaskNotFound(key)
        return await self._one(record)

    async def attempts(self, key: str) -> list[AttemptRecord]:
        """The task's kept attempts (the last TIMEWHEEL_ATTEMPTS_KEPT), oldest first."""
        records = await self.store.attempts(key)
        if records is None:
            raise TaskNotFound(key)
        return records

    async def page(self, status: TaskStatus, *, key_prefix: str, limit: int,
                   cursor: str | None) -> tuple[list[TaskRecord], str | None]:
        """A page of GET /tasks and the cursor of the next (None: the end)."""
        after = None
        if cursor is not None:
            try:
                after = decode_cursor(status, cursor)
            except BadCursor as exc:
                raise InvalidInput(("query", "cursor"), str(exc), cursor) from exc
        records, following = await list_tasks(self.store, status, key_prefix=key_prefix,
                                              limit=limit, cursor=after)
        return await self.resolved(records), encode_cursor(status, following) if following else None

    # -- many tasks (POST /tasks/batch) -------------------------------------------------------

    async def create_many(self, tasks: Sequence[NewTask], now: int) -> BatchCreated:
        """Create tasks already prepared (``prepare_new``), never replacing, as POSTs in
        order (a key given twice: the later one exists or conflicts)."""
        codes = await schedule_many(self.store, tasks, now)
        existing = [task.key for task, code in zip(tasks, codes, strict=True)
                    if code is not ScheduleReply.CREATED]
        found = await get_many(self.store, existing)
        readable = [record for record in found
                    if record is not None and record.headers is not None]
        records: dict[str, TaskRecord | None] = dict.fromkeys(existing)
        for record in await self.resolved(readable):
            records[record.key] = record
        self.metrics.scheduled.inc(codes.count(ScheduleReply.CREATED))
        unset = {task.flow for task in tasks if not (task.max_attempts and task.backoff_ms)}
        retry = ({} if self.flows is None else
                 await self.flows.retry_defaults(unset, now_ms=now))
        return BatchCreated([_STORED[code] for code in codes], records, retry)

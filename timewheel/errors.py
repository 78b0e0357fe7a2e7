"""The exception tree. Only ``api/`` maps these to HTTP status codes (api/errors.py, one handler
each).

    TimeWheelError
     +-- TaskNotFound          no such task (404)
     +-- ScheduleNotFound      no such schedule (404)
     +-- TopicNotFound         no such topic (404)
     +-- JobNotFound           no such bulk job, or it expired (404)
     +-- TaskConflict          key taken by other content, or task already finished (409)
     +-- InvalidInput          a request its model accepted, refused by a limit of the
     |                         settings or the task's state (422)
     +-- BodyTooLarge          the encoded body is over 1 MiB (413; also a ValueError)
     +-- StoreUnavailable      Redis cannot be reached or answered with an error (503)
     |    +-- NotReplicated    written on the master, but too few replicas confirmed it (503)
     +-- StartRefused          the service must not start (logged as one CRITICAL line)
          +-- WheelMismatch    the settings disagree with the wheel stored in Redis
          +-- DataDirInUse     another process's embedded Redis has the data directory
                               (store/embedded.py; also a RuntimeError)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timewheel.store.record import TaskRecord


class TimeWheelError(Exception):
    """Base of every error the package raises on purpose."""


class TaskNotFound(TimeWheelError):
    def __init__(self, key: str) -> None:
        super().__init__(f"no task with key {key!r}")
        self.key = key


class ScheduleNotFound(TimeWheelError):
    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"no schedule with id {schedule_id!r}")
        self.schedule_id = schedule_id


class TopicNotFound(TimeWheelError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no topic named {name!r}")
        self.name = name
class JobNotFound(TimeWheelError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class TaskConflict(TimeWheelError):
    """``record``: the task as it is now, which the answer shows (None: it expired
    meanwhile)."""

    def __init__(self, message: str, record: TaskRecord | None = None) -> None:
        super().__init__(message)
        self.record = record


class InvalidInput(TimeWheelError):
    """A value of the request that its model accepted but the service refuses: beyond the
    horizon, a timeout over the batch deadline, a private callback address, too few
    attempts, a cursor of another listing. ``loc`` says where, as a validation error does
    (``("body", "timeout")``, ``("query", "cursor")``)."""

    def __init__(self, loc: tuple[str | int, ...], message: str, value: object) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.value = value

    def under(self, *outer: str | int) -> InvalidInput:
        """The same error, located inside ``outer`` (a schedule's ``task``, a batch item)."""
        return InvalidInput((self.loc[0], *outer, *self.loc[1:]), self.message, self.value)


class BodyTooLarge(TimeWheelError, ValueError):
    """The encoded ``body`` is over MAX_BODY_BYTES (docs/api.md: 413)."""


class StoreUnavailable(TimeWheelError):
    """Redis is down, unreachable or refused the command; the caller may retry later."""


class RedisFull(StoreUnavailable):
    """Redis is over its maxmemory (noeviction) and refused to add data: nothing was written,
    and no retry helps until memory is freed or the limit raised."""


class RecordUnreadable(TimeWheelError):
    """A stored schedule or topic is sealed under a key id TIMEWHEEL_ENCRYPTION_KEYS does not
    list, or does not verify: no retry helps, listing its key does (a 500 saying so, never
    the 503 of a Redis that is away). The message names the record and the key id."""


class NotReplicated(StoreUnavailable):
    """A change was applied on its Redis master, but fewer replicas than
    TIMEWHEEL_REDIS_WAIT_REPLICAS confirmed it within TIMEWHEEL_REDIS_WAIT_TIMEOUT_MS: it may or
    may not survive a failover of that master. The write is not undone (Redis cannot); the
    client is told it was not acknowledged, and repeating the request is safe."""

    def __init__(self, what: str, confirmed: int, wanted: int, timeout_ms: int) -> None:
        super().__init__(f"{what}: {confirmed} of {wanted} replicas confirmed the write "
                         f"within {timeout_ms} ms")
        self.confirmed = confirmed
        self.wanted = wanted
        self.timeout_ms = timeout_ms


class StartRefused(TimeWheelError):
    """The service must not start. The reason is logged as one CRITICAL line; ``timewheel
    serve`` then exits 3 without a traceback (cli.py ``QuietRefusal``): it is no bug."""


class WheelMismatch(StartRefused):
    """A setting that is fixed per wheel once written to Redis (the bucket count) disagrees
    with what Redis holds. The service must not start: tasks would land in the wrong buckets."""

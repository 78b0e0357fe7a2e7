"""The exception tree. Only ``api/`` maps these to HTTP status codes.

    TimeWheelError
     +-- TaskNotFound          no such task (404)
     +-- TaskConflict          key taken by other content, or task already finished (409)
     +-- StoreUnavailable      Redis cannot be reached or answered with an error (503)
     +-- WheelMismatch         the settings disagree with the wheel stored in Redis (no start)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timewheel.models import TaskView


class TimeWheelError(Exception):
    """Base of every error the package raises on purpose."""


class TaskNotFound(TimeWheelError):
    def __init__(self, key: str) -> None:
        super().__init__(f"no task with key {key!r}")
        self.key = key


class TaskConflict(TimeWheelError):
    def __init__(self, message: str, view: TaskView | None = None) -> None:
        super().__init__(message)
        self.view = view


class StoreUnavailable(TimeWheelError):
    """Redis is down, unreachable or refused the command; the caller may retry later."""


class WheelMismatch(TimeWheelError):
    """A setting that is fixed per wheel once written to Redis (the bucket count) disagrees
    with what Redis holds. The service must not start: tasks would land in the wrong buckets."""

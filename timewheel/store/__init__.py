"""Redis only: key names, the Lua scripts, the task record, the Store, the connection and the
embedded redis-server. Nothing here knows HTTP or the engine."""

from timewheel.store.task_store import (
    CONFLICT,
    CREATED,
    EXISTS,
    NOT_ALLOWED,
    NOT_FOUND,
    REPLACED,
    RESCHEDULED,
    TOO_FEW_ATTEMPTS,
    Outcome,
    Store,
)

__all__ = ["CONFLICT", "CREATED", "EXISTS", "NOT_ALLOWED", "NOT_FOUND", "REPLACED", "RESCHEDULED",
           "TOO_FEW_ATTEMPTS", "Outcome", "Store"]

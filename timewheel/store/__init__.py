"""Redis only: key names, the Lua scripts and their replies, the task record, the Store, the
connection and the embedded redis-server. Nothing here knows HTTP, the API's models or the
engine."""

from timewheel.store.claims import Outcome
from timewheel.store.replies import (
    CancelReply,
    CompleteReply,
    ParkReply,
    ReleaseReply,
    ReplayReply,
    RescheduleReply,
    ScheduleReply,
)
from timewheel.store.task_store import Store

__all__ = ["CancelReply", "CompleteReply", "Outcome", "ParkReply", "ReleaseReply", "ReplayReply",
           "RescheduleReply", "ScheduleReply", "Store"]

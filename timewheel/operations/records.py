"""The domain records the operations take and return, for the HTTP layer to show: defined by
the store, which speaks them (timewheel/store/record.py and each store's module), and named here
so that the handlers under timewheel/api/ read them from the service layer, never from the
store (tests/test_layers.py)."""

from timewheel.store.attempts import AttemptRecord
from timewheel.store.job_store import JobRecord
from timewheel.store.record import NewTask, TaskRecord
from timewheel.store.schedule_store import ScheduleRecord
from timewheel.store.topic_store import TopicRecord

__all__ = ["AttemptRecord", "JobRecord", "NewTask", "ScheduleRecord", "TaskRecord",
           "TopicRecord"]

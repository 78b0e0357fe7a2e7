"""Request and response models of the HTTP API, shared by the service and the client.
One module per resource; everything is re-exported here, with the plain values of
timewheel/domain.py that the models use (TaskStatus, Method, ...)."""

from timewheel.domain import (
    EXISTING_KEY_PATTERN,
    FINISHED,
    KEY_PATTERN,
    Method,
    TaskStatus,
    format_ms,
)
from timewheel.models.attempts import AttemptList, AttemptOutcome, AttemptView
from timewheel.models.batch import MAX_BATCH_ITEMS, BatchCreate, BatchItemResult, BatchResult
from timewheel.models.flows import FlowLimits, FlowList, FlowView
from timewheel.models.jobs import (
    JOB_ID_PATTERN,
    CancelFilter,
    JobCreated,
    JobFilter,
    JobKind,
    JobView,
    ReplayFilter,
)
from timewheel.models.schedules import (
    SCHEDULE_ID_PATTERN,
    ScheduleCreate,
    ScheduleList,
    ScheduleSpec,
    ScheduleTask,
    ScheduleView,
)
from timewheel.models.tasks import (
    MAX_BACKOFF_SECONDS,
    MAX_BODY_BYTES,
    MAX_HEADERS,
    MAX_URL_LENGTH,
    TaskCreate,
    TaskFields,
    TaskList,
    TaskReschedule,
    TaskView,
    epoch_ms_ceil,
    parse_execute_at,
)

__all__ = ["FINISHED", "KEY_PATTERN", "MAX_BACKOFF_SECONDS", "MAX_BATCH_ITEMS", "MAX_BODY_BYTES",
           "MAX_HEADERS", "MAX_URL_LENGTH", "BatchCreate", "BatchItemResult", "BatchResult",
           "FlowLimits", "FlowList", "FlowView", "Method", "TaskCreate", "TaskFields",
           "TaskList", "TaskReschedule", "TaskStatus", "TaskView", "epoch_ms_ceil", "format_ms",
           "parse_execute_at"]
__all__ += ["SCHEDULE_ID_PATTERN", "ScheduleCreate", "ScheduleList", "ScheduleSpec",
            "ScheduleTask", "ScheduleView"]
__all__ += ["EXISTING_KEY_PATTERN"]
__all__ += ["AttemptList", "AttemptOutcome", "AttemptView"]
__all__ += ["JOB_ID_PATTERN", "CancelFilter", "JobCreated", "JobFilter", "JobKind", "JobView",
            "ReplayFilter"]
from timewheel.models.topics import (  # noqa: E402
    MAX_ENDPOINTS,
    TOPIC_NAME_PATTERN,
    Endpoint,
    PublishNote,
    PublishResult,
    TopicDetail,
    TopicList,
    TopicPublish,
    TopicPut,
    TopicView,
)

__all__ += ["MAX_ENDPOINTS", "TOPIC_NAME_PATTERN", "Endpoint", "PublishNote", "PublishResult",
            "TopicDetail", "TopicList", "TopicPublish", "TopicPut", "TopicView"]

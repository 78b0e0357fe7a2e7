"""The coded replies of the Lua scripts: one enum per script, named like the script.

Each script's header (``-- Reply: <EnumName>``) lists the same values with the same names, and
tests/test_script_replies.py checks that the two agree and that every code a script returns
is one of them. Store methods return these members, so callers compare with names: a value
has one meaning within its script (``ScheduleReply.CONFLICT`` and ``CancelReply.NOT_FOUND``
are both -1, but they never meet).

Scripts that answer with data (claim, unpark, start, view, list, permits, sched_due,
sched_checks, sched_drop) have no enum: their headers describe their replies.
"""

from __future__ import annotations

from enum import IntEnum, unique


@unique
class ScheduleReply(IntEnum):
    """lua/schedule.lua: create (POST) or replace (PUT) a task."""

    CREATED = 0
    REPLACED = 1
    EXISTS = 2  # an identical task exists (create only)
    CONFLICT = -1  # the key holds other content (create only)


@unique
class CancelReply(IntEnum):
    """lua/cancel.lua."""

    CANCELLED = 1
    NOT_FOUND = -1
    FINISHED = -2  # already finished: nothing to cancel


@unique
class ReplayReply(IntEnum):
    """lua/replay.lua."""

    REPLAYED = 1
    NOT_FOUND = -1
    NOT_FAILED = -2  # neither failed nor cancelled


@unique
class RescheduleReply(IntEnum):
    """lua/reschedule.lua."""

    RESCHEDULED = 1
    NOT_FOUND = -1
    FINISHED = -2
    TOO_FEW_ATTEMPTS = -3  # max_attempts not above the attempts made; nothing written


@unique
class CompleteReply(IntEnum):
    """lua/complete.lua, one per outcome."""

    RECORDED = 1
    STALE = 0  # the claim is not the caller's any more: nothing written
    CANCELLED_IN_FLIGHT = 2  # cancelled while in flight: history, last status, on_success
    MOVED_IN_FLIGHT = 3  # rescheduled while in flight: its history and last status only


@unique
class ReleaseReply(IntEnum):
    """lua/release.lua, one per claim."""

    HANDED_BACK = 1
    STALE = 0  # the claim is not the caller's any more: nothing written
    CANCELLED = 2  # cancelled while claimed: only its history entry is written
    MOVED = 3  # rescheduled after it started, not sent after all: its count taken back


@unique
class ParkReply(IntEnum):
    """lua/park.lua, one per claim."""

    PARKED = 1
    STALE = 0  # the claim is not the caller's any more: nothing written


@unique
class MigrateReply(IntEnum):
    """lua/migrate.lua, one per v1 record."""

    MIGRATED = 1
    GONE = 0  # no v1 record any more (migrated meanwhile)
    CHANGED = -1  # changed since it was read: nothing written, read it again


@unique
class FlowLimitsReply(IntEnum):
    """lua/flow_limits.lua."""

    LIMITED = 1  # a limit, a pause or a retry default is set
    DEFAULTS = 0  # nothing set: the defaults apply


@unique
class FlowPauseReply(IntEnum):
    """lua/flow_pause.lua."""

    CONFIGURED = 1  # the flow keeps a configuration (paused, or something else set)
    DEFAULTS = 0  # resumed with nothing else set: back to the defaults


@unique
class SchedPutReply(IntEnum):
    """lua/sched_put.lua (the first element of its reply)."""

    CREATED = 0
    REPLACED = 1
    STALE = -3  # the version changed since it was read: nothing written, read again


@unique
class SchedPauseReply(IntEnum):
    """lua/sched_pause.lua (the first element of its reply)."""

    PAUSED = 1
    ALREADY_PAUSED = 0
    NOT_FOUND = -1


@unique
class SchedResumeReply(IntEnum):
    """lua/sched_resume.lua."""

    RESUMED = 1
    NOT_PAUSED = 0  # nothing written
    NOT_FOUND = -1
    STALE = -3  # the version changed since it was read: read again


@unique
class SchedDeleteReply(IntEnum):
    """lua/sched_delete.lua (the first element of its reply)."""

    DELETED = 1
    NOT_FOUND = -1


@unique
class SchedReserveReply(IntEnum):
    """lua/sched_reserve.lua, one per reservation."""

    RESERVED = 1
    STALE = 0  # missing, deleted, paused or changed since read: nothing written


@unique
class SchedTombstoneReply(IntEnum):
    """lua/sched_tombstone.lua."""

    WRITTEN = 1
    TASK_EXISTS = 0  # the caller cancels the task instead


@unique
class PublishReply(IntEnum):
    """lua/publish.lua (the first element of its reply)."""

    CREATED = 0
    EXISTS = 1  # the same publish exists: nothing written
    CONFLICT = -1  # the publish key belongs to another publish: nothing written
    TASK_CONFLICT = -2  # a task's key holds another task: nothing written


@unique
class TopicPutReply(IntEnum):
    """lua/topic_put.lua (the first element of its reply)."""

    CREATED = 1
    REPLACED = 0


@unique
class TopicDeleteReply(IntEnum):
    """lua/topic_delete.lua."""

    DELETED = 1
    NOT_FOUND = -1


@unique
class RekeyReply(IntEnum):
    """lua/rekey.lua: a task's request sealed anew (timewheel keys rotate)."""

    REKEYED = 1
    CHANGED = 0  # the record changed since it was read: nothing written
    GONE = -1


@unique
class RekeyAttemptReply(IntEnum):
    """lua/rekey_attempt.lua: an attempt's response body sealed anew (timewheel keys rotate)."""

    REKEYED = 1
    GONE = 0  # the entry is not in the history any more


@unique
class RekeyScheduleReply(IntEnum):
    """lua/rekey_schedule.lua: a schedule's spec sealed anew (timewheel keys rotate)."""

    REKEYED = 1
    CHANGED = 0  # the spec is not the one read any more


@unique
class JobStepReply(IntEnum):
    """lua/job_step.lua (the first element of its reply; the bucket's counts follow)."""

    STEPPED = 1
    STALE = -1  # the job's position in the bucket is not the one given: nothing written


@unique
class JobFinishReply(IntEnum):
    """lua/job_finish.lua."""

    FINISHED = 1
    LOST = -1  # not running, or another runner holds the lease: nothing written


# The script each enum belongs to (tests/test_script_replies.py reads the scripts through it).
REPLIES: dict[str, type[IntEnum]] = {
    "schedule": ScheduleReply, "cancel": CancelReply, "replay": ReplayReply,
    "reschedule": RescheduleReply, "complete": CompleteReply, "release": ReleaseReply,
    "park": ParkReply, "migrate": MigrateReply, "flow_limits": FlowLimitsReply,
    "flow_pause": FlowPauseReply,
    "sched_put": SchedPutReply, "sched_pause": SchedPauseReply,
    "sched_resume": SchedResumeReply, "sched_delete": SchedDeleteReply,
    "sched_reserve": SchedReserveReply, "sched_tombstone": SchedTombstoneReply,
    "publish": PublishReply, "topic_put": TopicPutReply, "topic_delete": TopicDeleteReply,
    "rekey": RekeyReply, "rekey_attempt": RekeyAttemptReply,
    "rekey_schedule": RekeyScheduleReply,
    "job_step": JobStepReply, "job_finish": JobFinishReply,
}

"""Schedule operations: what ``/schedules`` does, without HTTP. The engine turns a schedule's
occurrences into tasks (timewheel/engine/materializer.py); here a schedule is put, read,
paused, resumed and deleted, and the occurrences such a change takes back are cancelled."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from timewheel.clock import Clock
from timewheel.delivery.retry_policy import NO_DEFAULTS
from timewheel.engine.occurrences import next_after
from timewheel.errors import InvalidInput, RecordUnreadable, ScheduleNotFound
from timewheel.models import SCHEDULE_ID_PATTERN, ScheduleCreate
from timewheel.operations.cursors import NameCursor
from timewheel.operations.prepare import template_task
from timewheel.operations.tasks import TaskOperations
from timewheel.store.record import default_flow
from timewheel.store.replies import SchedPutReply
from timewheel.store.schedule_store import ScheduleRecord, ScheduleStore
from timewheel.store.task_store import Store

_CURSOR = NameCursor("schedules", SCHEDULE_ID_PATTERN)


def spec_of(body: ScheduleCreate) -> dict[str, Any]:
    """What the store keeps of a PUT body (store/schedule_store.py ``spec_json``): the task
    only with the fields the client set, so an occurrence's task is validated (and
    fingerprinted) exactly as the POST it stands for."""
    return {"cron": body.cron, "every": body.every, "timezone": body.timezone,
            "task": body.task.model_dump(mode="json", exclude_unset=True)}


def schedule_store(store: Store, *, default_timeout: float, **options: Any) -> ScheduleStore:
    """A ScheduleStore whose task templates are prepared as POST /tasks bodies are."""
    return ScheduleStore(store, template_task=partial(template_task,
                                                      default_timeout=default_timeout),
                         **options)


class ScheduleOperations:
    def __init__(self, schedules: ScheduleStore, tasks: TaskOperations, clock: Clock) -> None:
        self.schedules = schedules
        self.tasks = tasks
        self.clock = clock

    async def put(self, schedule_id: str, body: ScheduleCreate) -> tuple[bool, ScheduleRecord]:
        """Create (True) or replace (False). The task template passes the same checks as a
        POST /tasks body (errors located under ``task``)."""
        now = self.clock.now_ms()
        try:
            self.tasks.prepare(body.task, f"{schedule_id}.{now}", now)
        except InvalidInput as exc:
            raise exc.under("task") from exc
        spec = spec_of(body)
        code, outstanding = await self.schedules.put(schedule_id, spec, paused=body.paused,
                                                     now_ms=now, next_after=next_after)
        if outstanding:  # paused by this PUT: its materialized occurrences must not start
            await self.schedules.cancel_occurrences(schedule_id, outstanding, spec["task"],
                                                    now_ms=now)
        return code is SchedPutReply.CREATED, await self.get(schedule_id)

    async def retry_in_force(self, records: Sequence[ScheduleRecord]) -> list[dict[str, Any]]:
        """For each record, the retry fields its template does not set, as its occurrences
        get them: its flow's default, else the service's (as a task view shows them). A
        flow's default may be past what a task may set (a backoff over an hour): the caller
        shows these values, it does not validate them again."""
        templates: list[dict[str, Any]] = [record.spec["task"] for record in records]
        flows = [t.get("flow_key") or default_flow(t["callback_url"]) for t in templates]
        unset = {flow for flow, t in zip(flows, templates, strict=True)
                 if "max_attempts" not in t or "retry_backoff" not in t}
        defaults = ({} if not unset or self.tasks.flows is None else
                    await self.tasks.flows.retry_defaults(unset, now_ms=self.clock.now_ms()))
        filled = []
        for flow, template in zip(flows, templates, strict=True):
            retry = defaults.get(flow, NO_DEFAULTS)
            in_force = {"max_attempts": retry.max_attempts_for(0),
                        "retry_backoff": retry.backoff_ms_for(0) / 1000}
            filled.append({k: v for k, v in in_force.items() if k not in template})
        return filled

    async def get(self, schedule_id: str) -> ScheduleRecord:
        record = await self.schedules.get(schedule_id)
        if record is None:  # (also: deleted between a change and this read)
            raise ScheduleNotFound(schedule_id)
        return record

    async def page(self, limit: int, cursor: str | None
                   ) -> tuple[list[ScheduleRecord], str | None]:
        """A page of schedules in id order, and the cursor of the next (None: the end)."""
        after = None if cursor is None else _CURSOR.decode(cursor)
        records, last = await self.schedules.page(limit, after)
        return records, None if last is None else _CURSOR.encode(last)

    async def delete(self, schedule_id: str) -> None:
        """Once this returns, no occurrence of the schedule starts."""
        found = await self.schedules.delete(schedule_id)
        if found is None:
            raise ScheduleNotFound(schedule_id)
        outstanding, template = found
        await self.schedules.cancel_occurrences(schedule_id, outstanding, template,
                                                now_ms=self.clock.now_ms())

    async def pause(self, schedule_id: str) -> ScheduleRecord:
        """Once this returns, no occurrence starts until a resume."""
        outstanding = await self.schedules.pause(schedule_id)
        if outstanding is None:
            raise ScheduleNotFound(schedule_id)
        if outstanding:
            try:
                record = await self.schedules.get(schedule_id)
            except RecordUnreadable:  # still cancelled, under a stand-in template
                record = None
            template = record.spec["task"] if record is not None else None
            await self.schedules.cancel_occurrences(schedule_id, outstanding, template,
                                                    now_ms=self.clock.now_ms())
        return await self.get(schedule_id)

    async def resume(self, schedule_id: str) -> ScheduleRecord:
        """From the next occurrence after now: those missed while paused are not fired."""
        if not await self.schedules.resume(schedule_id, now_ms=self.clock.now_ms(),
                                           next_after=next_after):
            raise ScheduleNotFound(schedule_id)
        return await self.get(schedule_id)

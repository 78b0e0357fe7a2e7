"""Schedules as the store keeps them: a PUT body as its stored spec, and the ScheduleStore
whose task templates are prepared as POST /tasks bodies are."""

from __future__ import annotations

from functools import partial
from typing import Any

from timewheel.models import ScheduleCreate
from timewheel.operations.prepare import template_task
from timewheel.store.schedule_store import ScheduleStore
from timewheel.store.task_store import Store


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

"""``AsyncClient``: the asyncio client, the twin of ``Client`` (same ``calls``, awaited)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from timewheel.client import calls
from timewheel.client.calls import DEFAULT_TIMEOUT, Call, Page
from timewheel.models import (
    AttemptView,
    BatchResult,
    FlowLimits,
    FlowList,
    FlowView,
    JobCreated,
    JobFilter,
    JobView,
    ScheduleCreate,
    ScheduleList,
    ScheduleView,
    TaskCreate,
    TaskFields,
    TaskList,
    TaskView,
    TopicDetail,
    TopicList,
    TopicPublish,
    TopicPut,
    TopicView,
)

T = TypeVar("T")
P = TypeVar("P", bound=Page)


class AsyncClient:
    """An asyncio client of one timewheel service.

    ``base_url`` defaults to ``TIMEWHEEL_URL`` (else ``http://127.0.0.1:8080``), ``token`` to
    ``TIMEWHEEL_TOKEN``; ``timeout`` is in seconds (or an ``httpx.Timeout``); ``transport``
    replaces the network (``httpx.MockTransport``, ``httpx.ASGITransport``). Use it as an async
    context manager, or call ``aclose()``. Errors: ``timewheel.client.errors``."""

    def __init__(self, base_url: str | None = None, *, token: str | None = None,
                 timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._http = httpx.AsyncClient(**calls.http_options(base_url, token, timeout),
                                  transport=transport)

    @property
    def base_url(self) -> httpx.URL:
        return self._http.base_url

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _run(self, call: Call[T]) -> T:
        request = call.request(self._http)
        try:
            response = await self._http.send(request)
        except httpx.TransportError as exc:
            raise calls.unreachable(request, exc) from exc
        return calls.result(call, response)

    async def _pages(self, page: Callable[[str | None], Call[P]]) -> AsyncIterator[P]:
        cursor: str | None = None
        while True:
            current = await self._run(page(cursor))
            yield current
            if current.next_cursor is None:
                return
            cursor = current.next_cursor

    # -- tasks ----------------------------------------------------------------------------

    async def create_task(self, task: TaskCreate | Mapping[str, Any]) -> TaskView:
        """Schedule a task (``POST /tasks``). A repeat with the same key and content returns
        the existing task; the same key with other content raises ``ConflictError``."""
        return await self._run(calls.create_task(task))

    async def create_tasks(self,
                           tasks: Iterable[TaskCreate | Mapping[str, Any]]) -> BatchResult:
        """Schedule up to 1000 tasks in one request (``POST /tasks/batch``). Each item is
        stored or refused on its own: look at each result's ``status``; only a request that
        is wrong as a whole (no items, too many, too large) raises."""
        return await self._run(calls.create_tasks(tasks))

    async def put_task(self, key: str, task: TaskFields | Mapping[str, Any]) -> TaskView:
        """Create the task ``key``, or replace the whole task if it has not finished (to move
        it keeping its headers and body, use ``reschedule``)."""
        return await self._run(calls.put_task(key, task))

    async def reschedule(self, key: str, *, delay: float | None = None,
                         execute_at: str | float | datetime | None = None,
                         max_attempts: int | None = None) -> TaskView:
        """Move a task that has not finished to a new time (``PATCH /tasks/{key}``): give
        exactly one of ``delay`` (seconds from now) and ``execute_at`` (RFC 3339 text, Unix
        seconds or an aware ``datetime``), and optionally a new ``max_attempts``. Headers,
        body and everything else are kept (``put_task`` replaces the whole task).
        ``ConflictError`` (with ``view``) if it has finished, ``NotFoundError`` if unknown."""
        return await self._run(calls.reschedule_task(key, execute_at=execute_at, delay=delay,
                                                        max_attempts=max_attempts))

    async def get_task(self, key: str) -> TaskView:
        return await self._run(calls.get_task(key))

    async def cancel_task(self, key: str) -> None:
        """Cancel: once this returns, no attempt starts. ``ConflictError`` (with ``view``) if
        the task has already finished, ``NotFoundError`` if there is no such task."""
        await self._run(calls.cancel_task(key))

    async def replay_task(self, key: str) -> TaskView:
        """Schedule a failed or cancelled task again, now, with its attempts reset."""
        return await self._run(calls.replay_task(key))

    async def list_tasks(self, status: str | None = None, *, key_prefix: str | None = None,
                         limit: int | None = None, cursor: str | None = None) -> TaskList:
        """One page of ``GET /tasks``; pass its ``next_cursor`` back for the next page."""
        return await self._run(calls.list_tasks(status, key_prefix, limit, cursor))

    async def iter_tasks(self, status: str | None = None, *, key_prefix: str | None = None,
                         page_size: int | None = None) -> AsyncIterator[TaskView]:
        """Every task of the listing, page after page, following ``next_cursor``."""
        pages = self._pages(lambda c: calls.list_tasks(status, key_prefix, page_size, c))
        async for page in pages:
            for task in page.tasks:
                yield task

    async def attempts(self, key: str) -> list[AttemptView]:
        """The task's kept attempts, oldest first (``GET /tasks/{key}/attempts``): each with
        its outcome, status code, error, response excerpt, duration and process. A task never
        tried has none; ``NotFoundError`` if there is no such task."""
        return await self._run(calls.task_attempts(key))

    # -- bulk jobs ------------------------------------------------------------------------

    async def cancel_tasks(self, job_filter: JobFilter | Mapping[str, Any]) -> JobCreated:
        """Start a job that cancels every task matching the filter (``status``,
        ``key_prefix``, ``flow_key``, ``due_before``, ``created_before``; at least one) and
        created before the job: ``POST /tasks/cancel``. Follow it with ``get_job``."""
        return await self._run(calls.start_job("cancel", job_filter))

    async def replay_tasks(self, job_filter: JobFilter | Mapping[str, Any]) -> JobCreated:
        """Start a job that replays every failed or cancelled task matching the filter:
        ``POST /tasks/replay``. Follow it with ``get_job``."""
        return await self._run(calls.start_job("replay", job_filter))

    async def get_job(self, job_id: str) -> JobView:
        """A job's progress (``GET /jobs/{id}``); ``state`` is ``done`` once it has walked
        every task."""
        return await self._run(calls.get_job(job_id))

    # -- flows ----------------------------------------------------------------------------

    async def set_flow(self, key: str, limits: FlowLimits | Mapping[str, Any]) -> FlowView:
        """Set a flow's whole configuration: limits, ``paused``, retry defaults
        (``max_attempts``, ``retry_backoff``, ``max_backoff``); what is not given is cleared."""
        return await self._run(calls.set_flow(key, limits))

    async def get_flow(self, key: str) -> FlowView:
        return await self._run(calls.get_flow(key))

    async def list_flows(self) -> FlowList:
        """The flows whose limits were set; every other flow runs on the defaults."""
        return await self._run(calls.list_flows())

    async def delete_flow(self, key: str) -> None:
        """Back to the default limits."""
        await self._run(calls.delete_flow(key))

    async def pause_flow(self, key: str) -> FlowView:
        """Start no attempt of the flow on any process (within a tick; one in flight
        finishes); its due tasks wait. The rest of its configuration is kept."""
        return await self._run(calls.pause_flow(key))

    async def resume_flow(self, key: str) -> FlowView:
        """Start the flow's waiting tasks again, in due order, within its limits."""
        return await self._run(calls.resume_flow(key))

    # -- schedules ------------------------------------------------------------------------

    async def set_schedule(self, schedule_id: str,
                           schedule: ScheduleCreate | Mapping[str, Any]) -> ScheduleView:
        """Create or replace a recurring schedule (``PUT /schedules/{id}``)."""
        return await self._run(calls.set_schedule(schedule_id, schedule))

    async def get_schedule(self, schedule_id: str) -> ScheduleView:
        return await self._run(calls.get_schedule(schedule_id))

    async def list_schedules(self, *, limit: int | None = None,
                             cursor: str | None = None) -> ScheduleList:
        """One page of ``GET /schedules``; pass its ``next_cursor`` back for the next page."""
        return await self._run(calls.list_schedules(limit, cursor))

    async def iter_schedules(self, *,
                             page_size: int | None = None) -> AsyncIterator[ScheduleView]:
        """Every schedule, page after page, following ``next_cursor``."""
        async for page in self._pages(lambda c: calls.list_schedules(page_size, c)):
            for schedule in page.schedules:
                yield schedule

    async def delete_schedule(self, schedule_id: str) -> None:
        """Once this returns, no occurrence of the schedule starts."""
        await self._run(calls.delete_schedule(schedule_id))

    async def pause_schedule(self, schedule_id: str) -> ScheduleView:
        """Once this returns, no occurrence starts until ``resume_schedule``."""
        return await self._run(calls.pause_schedule(schedule_id))

    async def resume_schedule(self, schedule_id: str) -> ScheduleView:
        return await self._run(calls.resume_schedule(schedule_id))

    # -- topics ---------------------------------------------------------------------------

    async def set_topic(self, name: str, topic: TopicPut | Mapping[str, Any]) -> TopicView:
        """Create or replace a topic (``PUT /topics/{name}``):
        ``{"endpoints": [{"name": ..., "url": ..., "headers": {...}}]}``."""
        return await self._run(calls.set_topic(name, topic))

    async def get_topic(self, name: str) -> TopicDetail:
        """The topic and its recent publishes; ``NotFoundError`` if there is none."""
        return await self._run(calls.get_topic(name))

    async def list_topics(self, *, limit: int | None = None,
                    cursor: str | None = None) -> TopicList:
        """One page of ``GET /topics``; pass its ``next_cursor`` back for the next page."""
        return await self._run(calls.list_topics(limit, cursor))

    async def delete_topic(self, name: str) -> None:
        """Delete the topic (tasks its publishes made are not touched)."""
        await self._run(calls.delete_topic(name))

    async def publish(self, name: str,
                message: TopicPublish | Mapping[str, Any] | None = None) -> list[TaskView]:
        """Publish to every endpoint of the topic at once (``POST /topics/{name}/publish``, a
        ``POST /tasks`` body without ``callback_url``): the tasks ``<key>.<endpoint>``, all
        created or none. A repeat with the same key and content returns the same tasks; the
        same key with other content raises ``ConflictError``."""
        return (await self._run(calls.publish(name, message or {}))).tasks

    # -- operations -----------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """``{"status": "ok"}``; ``UnavailableError`` when the service's Redis is down."""
        return await self._run(calls.health())

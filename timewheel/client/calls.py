"""The one place that knows the HTTP API: each endpoint as a ``Call`` (method, path, query,
JSON body, and how to read a successful answer), plus the connection defaults.

``Client`` and ``AsyncClient`` only send calls and hand the answer back here (``result``), so
the sync and async clients cannot drift apart: a fix to a path, a query parameter or an error
mapping is made once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from timewheel import __version__
from timewheel.client.errors import UnexpectedAnswerError, UnreachableError, error_for
from timewheel.models import (
    AttemptList,
    AttemptView,
    BatchResult,
    FlowLimits,
    FlowList,
    FlowView,
    JobCreated,
    JobFilter,
    JobView,
    PublishResult,
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
M = TypeVar("M", bound=BaseModel)

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 10.0  # seconds, for connect, read, write and pool alike
URL_ENV = "TIMEWHEEL_URL"
TOKEN_ENV = "TIMEWHEEL_TOKEN"
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what a header value may carry


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request to the service and the parser of its successful answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, str | int] = field(default_factory=dict)
    json: Any = None  # None: no body (no endpoint takes a bare JSON null)

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The request, built by the httpx client that will send it (base URL, headers)."""
        return http.build_request(self.method, self.path, params=self.params or None,
                                  json=self.json)


class Page(Protocol):
    """A page of a cursor-paginated listing: ``next_cursor`` None on the last one."""

    @property
    def next_cursor(self) -> str | None: ...


def result(call: Call[T], response: httpx.Response) -> T:
    """The parsed answer, or the ``APIError`` subclass its status calls for."""
    if not response.is_success:
        raise error_for(response)
    try:
        return call.parse(response)
    except (ValidationError, ValueError) as exc:  # ValueError: not JSON at all
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        detail = f"{call.method} {response.request.url}: not a timewheel answer ({reason})"
        raise UnexpectedAnswerError(response.status_code, detail) from exc


def unreachable(request: httpx.Request, exc: httpx.TransportError) -> UnreachableError:
    """The error for a call that got no answer; names the request, never its headers."""
    reason = str(exc) or type(exc).__name__
    return UnreachableError(f"{request.method} {request.url}: {reason}")


def http_options(base_url: str | None, token: str | None,
                 timeout: float | httpx.Timeout) -> dict[str, Any]:
    """Keyword arguments for ``httpx.Client`` / ``httpx.AsyncClient``.

    ``base_url`` None: ``TIMEWHEEL_URL``, else ``http://127.0.0.1:8080``. ``token`` None:
    ``TIMEWHEEL_TOKEN``; an empty string sends no token even when the variable is set.
    Surrounding whitespace is dropped (a token read from a file ends with a newline)."""
    url = base_url or os.environ.get(URL_ENV) or DEFAULT_URL
    _check_url(url, from_env=not base_url and bool(os.environ.get(URL_ENV)))
    secret = (os.environ.get(TOKEN_ENV, "") if token is None else token).strip()
    headers = {"User-Agent": f"timewheel-client/{__version__}", "Accept": "application/json"}
    if secret:
        # Checked here, and named without its value: httpx's own error for a bad header
        # value would quote the whole header, token included.
        if not _TOKEN_CHARS.fullmatch(secret):
            origin = " (TIMEWHEEL_TOKEN)" if token is None else ""
            raise ValueError(f"the token{origin} must be printable ASCII without spaces")
        headers["Authorization"] = f"Bearer {secret}"
    # Redirects are not followed: a redirected POST would be re-sent as a GET, and a 3xx from
    # the service means a misconfigured URL, which the caller should see.
    return {"base_url": url, "headers": headers, "timeout": timeout,
            "follow_redirects": False}


def _check_url(url: str, *, from_env: bool) -> None:
    """A ValueError unless ``url`` is an absolute ``http(s)://`` URL with a host: otherwise
    httpx raised its own InvalidURL when the client was made (a traceback in the CLI), or
    every call failed as UnreachableError ("cannot reach the service"), for a setting to
    correct. Named without its value, which may carry a password."""
    origin = "TIMEWHEEL_URL" if from_env else "the base URL"
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        reason = f" ({exc})"
    else:
        if parsed.scheme in ("http", "https") and parsed.host:
            return
        reason = ""
    raise ValueError(f"{origin} must be an absolute http:// or https:// URL, such as "
                     f"{DEFAULT_URL}{reason}")


def segment(value: str, what: str = "task key") -> str:
    """``value`` as one path segment. Keys may be ``.`` or ``..``, which URL normalisation
    would otherwise resolve away (``/tasks/..`` is ``/``): their dots are percent-encoded.
    An empty one names no resource (``/tasks/`` is redirected to the listing): a ValueError
    saying ``what`` is empty."""
    if not value:
        raise ValueError(f"the {what} must not be empty")
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe=":")


def _flow(key: str) -> str:
    return f"/flows/{segment(key, 'flow key')}"


def _schedule(schedule_id: str) -> str:
    return f"/schedules/{segment(schedule_id, 'schedule id')}"


def _topic(name: str) -> str:
    return f"/topics/{segment(name, 'topic name')}"


def _model(cls: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: cls.model_validate_json(response.content)


def _nothing(response: httpx.Response) -> None:
    """A DELETE's answer: the service's is always 204 No Content. Another success (a 200 from
    whatever else listens at a wrong TIMEWHEEL_URL) did not delete anything."""
    if response.status_code != 204:
        raise ValueError(f"{response.status_code}, not 204 No Content")
    return None


def _health(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    return body


def body(value: BaseModel | Mapping[str, Any], *,
         exclude: set[str] | None = None) -> dict[str, Any]:
    """A request body. A model (validated when it was built) sends only the fields the caller
    set, so the service applies its own defaults; a mapping is sent as given and the service
    validates it (422 -> InvalidRequestError): the service stays the one judge of input, and a
    batch item that is wrong fails alone, as docs/api.md promises."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True, exclude=exclude)
    return {name: item for name, item in value.items() if name not in (exclude or ())}


def _query(**values: str | int | None) -> dict[str, str | int]:
    return {name: value for name, value in values.items() if value is not None}


# -- /tasks -------------------------------------------------------------------------------

def create_task(task: TaskCreate | Mapping[str, Any]) -> Call[TaskView]:
    """``POST /tasks``: 201 created, or 200 with the existing task for a repeated request."""
    return Call("POST", "/tasks", _model(TaskView), json=body(task))


def put_task(key: str, task: TaskFields | Mapping[str, Any]) -> Call[TaskView]:
    """``PUT /tasks/{key}``: create, or replace a task that has not finished."""
    if isinstance(task, TaskCreate):  # a POST body: its key, if any, must be this one
        if task.key not in (None, key):
            raise ValueError(f"the task's key {task.key!r} is not the key {key!r} to put")
        return Call("PUT", f"/tasks/{segment(key)}", _model(TaskView),
                    json=body(task, exclude={"key"}))
    return Call("PUT", f"/tasks/{segment(key)}", _model(TaskView), json=body(task))


def reschedule_task(key: str, *, execute_at: str | float | datetime | None,
                    delay: float | None, max_attempts: int | None) -> Call[TaskView]:
    """``PATCH /tasks/{key}``: a new time (one of ``execute_at``, ``delay``), optionally a new
    ``max_attempts``; the service keeps everything else. A ``datetime`` must carry its zone."""
    if isinstance(execute_at, datetime):
        if execute_at.tzinfo is None:
            raise ValueError("execute_at needs a time zone (a naive datetime is ambiguous)")
        execute_at = execute_at.isoformat()
    payload = {name: value for name, value in (("execute_at", execute_at), ("delay", delay),
                                               ("max_attempts", max_attempts))
               if value is not None}
    return Call("PATCH", f"/tasks/{segment(key)}", _model(TaskView), json=payload)


def create_tasks(tasks: Iterable[TaskCreate | Mapping[str, Any]]) -> Call[BatchResult]:
    """``POST /tasks/batch``: each item is stored or refused on its own; results in order."""
    return Call("POST", "/tasks/batch", _model(BatchResult),
                json={"tasks": [body(task) for task in tasks]})


def get_task(key: str) -> Call[TaskView]:
    return Call("GET", f"/tasks/{segment(key)}", _model(TaskView))


def cancel_task(key: str) -> Call[None]:
    return Call("DELETE", f"/tasks/{segment(key)}", _nothing)


def replay_task(key: str) -> Call[TaskView]:
    return Call("POST", f"/tasks/{segment(key)}/replay", _model(TaskView))


def list_tasks(status: str | None, key_prefix: str | None, limit: int | None,
               cursor: str | None) -> Call[TaskList]:
    return Call("GET", "/tasks", _model(TaskList),
                params=_query(status=status, key_prefix=key_prefix, limit=limit, cursor=cursor))


def task_attempts(key: str) -> Call[list[AttemptView]]:
    """``GET /tasks/{key}/attempts``: the kept attempts, oldest first."""
    return Call("GET", f"/tasks/{segment(key)}/attempts",
                lambda response: AttemptList.model_validate_json(response.content).attempts)


# -- bulk jobs ----------------------------------------------------------------------------

def start_job(kind: str, job_filter: JobFilter | Mapping[str, Any]) -> Call[JobCreated]:
    """``POST /tasks/cancel`` or ``POST /tasks/replay`` (``kind``): 202 with the job's id."""
    return Call("POST", f"/tasks/{kind}", _model(JobCreated), json=body(job_filter))


def get_job(job_id: str) -> Call[JobView]:
    return Call("GET", f"/jobs/{segment(job_id, 'job id')}", _model(JobView))


# -- /flows -------------------------------------------------------------------------------

def set_flow(key: str, limits: FlowLimits | Mapping[str, Any]) -> Call[FlowView]:
    """``PUT /flows/{key}``: replaces the whole configuration (limits, ``paused``, retry
    defaults ``max_attempts``, ``retry_backoff``, ``max_backoff``); what is not given is
    cleared (no limit, not paused, no default)."""
    payload = limits.model_dump(mode="json") if isinstance(limits, FlowLimits) else dict(limits)
    return Call("PUT", _flow(key), _model(FlowView), json=payload)


def get_flow(key: str) -> Call[FlowView]:
    return Call("GET", _flow(key), _model(FlowView))


def list_flows() -> Call[FlowList]:
    """``GET /flows``: the flows whose limits were set (the dashboard's list; not paginated)."""
    return Call("GET", "/flows", _model(FlowList))


def delete_flow(key: str) -> Call[None]:
    return Call("DELETE", _flow(key), _nothing)


def pause_flow(key: str) -> Call[FlowView]:
    """``POST /flows/{key}/pause``: no attempt of the flow starts on any process (within a
    tick); the rest of its configuration is kept."""
    return Call("POST", f"{_flow(key)}/pause", _model(FlowView))


def resume_flow(key: str) -> Call[FlowView]:
    """``POST /flows/{key}/resume``: its waiting tasks start in due order, within its limits."""
    return Call("POST", f"{_flow(key)}/resume", _model(FlowView))


# -- /schedules ---------------------------------------------------------------------------

def set_schedule(schedule_id: str,
                 schedule: ScheduleCreate | Mapping[str, Any]) -> Call[ScheduleView]:
    """``PUT /schedules/{id}``: create (201) or replace (200)."""
    return Call("PUT", _schedule(schedule_id), _model(ScheduleView),
                json=body(schedule))


def get_schedule(schedule_id: str) -> Call[ScheduleView]:
    return Call("GET", _schedule(schedule_id), _model(ScheduleView))


def list_schedules(limit: int | None, cursor: str | None) -> Call[ScheduleList]:
    return Call("GET", "/schedules", _model(ScheduleList),
                params=_query(limit=limit, cursor=cursor))


def delete_schedule(schedule_id: str) -> Call[None]:
    return Call("DELETE", _schedule(schedule_id), _nothing)


def pause_schedule(schedule_id: str) -> Call[ScheduleView]:
    return Call("POST", f"{_schedule(schedule_id)}/pause", _model(ScheduleView))


def resume_schedule(schedule_id: str) -> Call[ScheduleView]:
    return Call("POST", f"{_schedule(schedule_id)}/resume", _model(ScheduleView))


# -- /topics -------------------------------------------------------------------------------

def set_topic(name: str, topic: TopicPut | Mapping[str, Any]) -> Call[TopicView]:
    """``PUT /topics/{name}``: create (201) or replace (200) the topic's endpoints."""
    return Call("PUT", _topic(name), _model(TopicView), json=body(topic))


def get_topic(name: str) -> Call[TopicDetail]:
    """``GET /topics/{name}``: the topic and its recent publishes."""
    return Call("GET", _topic(name), _model(TopicDetail))


def list_topics(limit: int | None, cursor: str | None) -> Call[TopicList]:
    return Call("GET", "/topics", _model(TopicList), params=_query(limit=limit, cursor=cursor))


def delete_topic(name: str) -> Call[None]:
    return Call("DELETE", _topic(name), _nothing)


def publish(name: str, message: TopicPublish | Mapping[str, Any]) -> Call[PublishResult]:
    """``POST /topics/{name}/publish``: one task per endpoint (201), or the same tasks again
    for a repeated publish (200)."""
    return Call("POST", f"{_topic(name)}/publish", _model(PublishResult),
                json=body(message))


# -- operations ---------------------------------------------------------------------------

def health() -> Call[dict[str, Any]]:
    """``GET /healthz``: ``{"status": "ok"}``; a 503 (Redis down) raises UnavailableError."""
    return Call("GET", "/healthz", _health)

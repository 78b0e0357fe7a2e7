"""Models of ``/topics`` (docs/api.md, "Topics (fan-out)")."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator
from pydantic.json_schema import SkipJsonSchema

from timewheel.domain import KEY_PATTERN, callback_url
from timewheel.models.tasks import MAX_URL_LENGTH, TaskCreate, TaskFields, TaskView

TOPIC_NAME_PATTERN = KEY_PATTERN  # a topic is named like a flow key
ENDPOINT_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,100}$"
MAX_ENDPOINTS = 100


class Endpoint(BaseModel):
    """One destination of a topic: a publish makes one task per endpoint, keyed
    ``<publish key>.<name>``, sent to ``url`` with ``headers`` over the published ones."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[StrictStr, Field(pattern=ENDPOINT_NAME_PATTERN)]
    url: StrictStr = Field(max_length=MAX_URL_LENGTH)
    headers: dict[StrictStr, StrictStr] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _absolute_http_url(cls, value: str) -> str:
        problem = callback_url(value).problem
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, value: dict[str, str]) -> dict[str, str]:
        # The rules of a task's headers (TaskFields), so that merged headers pass them too.
        checked: dict[str, str] = TaskFields._valid_headers(value)
        return checked


class TopicPut(BaseModel):
    """Body of ``PUT /topics/{name}``: 1 to 100 endpoints, names unique."""

    model_config = ConfigDict(extra="forbid")

    endpoints: Annotated[list[Endpoint], Field(min_length=1, max_length=MAX_ENDPOINTS)]

    @field_validator("endpoints")
    @classmethod
    def _unique_names(cls, value: list[Endpoint]) -> list[Endpoint]:
        seen: set[str] = set()
        for endpoint in value:
            if endpoint.name in seen:
                raise ValueError(f"endpoint name {endpoint.name!r} is given twice")
            seen.add(endpoint.name)
        return value


class TopicView(BaseModel):
    name: str
    endpoints: list[Endpoint]
    created_at: str
    updated_at: str


class PublishNote(BaseModel):
    """One of a topic's recent publishes: its tasks are ``<key>.<endpoint>``."""

    key: str
    published_at: str


class TopicDetail(TopicView):
    """``GET /topics/{name}``: the topic and its most recent publishes, newest first."""

    recent_publishes: list[PublishNote]


class TopicList(BaseModel):
    """A page of ``GET /topics``, in name order; ``next_cursor`` null at the end."""

    topics: list[TopicView]
    next_cursor: str | None


class TopicPublish(TaskCreate):
    """Body of ``POST /topics/{name}/publish``: a ``POST /tasks`` body without ``callback_url``
    (each endpoint's URL is its task's). Every other field of ``POST /tasks`` is accepted and
    passed on to each task, so a field added there is one here too."""

    # Any value but null is refused (none_required); TaskFields' URL check lets null pass.
    callback_url: SkipJsonSchema[None] = Field(default=None, exclude=True)  # type: ignore[assignment]


class PublishResult(BaseModel):
    """Response of a publish: one task per endpoint, in the topic's endpoint order."""

    tasks: list[TaskView]

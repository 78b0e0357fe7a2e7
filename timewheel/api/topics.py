"""``/topics``: fan-out. A topic names endpoints; a publish makes one task per endpoint, all at
once or none (docs/api.md, "Topics (fan-out)"). Each handler parses, calls the topic operations
(timewheel/operations/topics.py) and shows the result."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from timewheel.api.deps import Needs, WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.api.views import task_view
from timewheel.models import (
    TOPIC_NAME_PATTERN,
    Endpoint,
    PublishNote,
    PublishResult,
    TopicDetail,
    TopicList,
    TopicPublish,
    TopicPut,
    TopicView,
    format_ms,
)
from timewheel.operations.records import TopicRecord

router = APIRouter(prefix="/topics", tags=["topics"], route_class=TaskRoute)

TopicName = Annotated[str, Path(pattern=TOPIC_NAME_PATTERN, description="the topic's name")]
_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such topic"}, 413: {"description": "body too large"},
    503: {"description": "Redis unavailable"},
}


def _view(record: TopicRecord) -> TopicView:
    return TopicView(name=record.name,
                     endpoints=[Endpoint.model_validate(e) for e in record.endpoints],
                     created_at=format_ms(record.created_ms) or "",
                     updated_at=format_ms(record.updated_ms) or "")


@router.put("/{name}", dependencies=[Needs.ADMIN], response_model=TopicView,
            responses={201: {"description": "created"}, **_RESPONSES})
async def put_topic(name: TopicName, body: TopicPut, wheel: WheelDep,
                    response: Response) -> TopicView:
    """Create (201) or replace (200) a topic: 1 to 100 endpoints with unique names. Tasks of
    earlier publishes keep the endpoints they were made with."""
    created, record = await wheel.topics.put(name, body)
    if created:
        response.status_code = 201
        response.headers["Location"] = f"/topics/{name}"
    return _view(record)


@router.get("", dependencies=[Needs.READ], response_model=TopicList, responses=_RESPONSES)
async def list_topics(
    wheel: WheelDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=400, description="`next_cursor` of the "
                                        "previous page")] = None,
) -> TopicList:
    """Topics in name order, cursor-paginated."""
    records, following = await wheel.topics.page(limit, cursor)
    return TopicList(topics=[_view(r) for r in records], next_cursor=following)


@router.get("/{name}", dependencies=[Needs.READ], response_model=TopicDetail,
            responses=_RESPONSES)
async def get_topic(name: TopicName, wheel: WheelDep) -> TopicDetail:
    """The topic, and its recent publishes (newest first; their tasks are
    ``<key>.<endpoint>``)."""
    view = _view(await wheel.topics.get(name))
    notes = [PublishNote(key=n.key, published_at=format_ms(n.created_ms) or "")
             for n in await wheel.topics.recent(name)]
    return TopicDetail(**view.model_dump(), recent_publishes=notes)


@router.delete("/{name}", dependencies=[Needs.ADMIN], status_code=204, response_class=Response,
               responses=_RESPONSES)
async def delete_topic(name: TopicName, wheel: WheelDep) -> Response:
    """Delete the topic. Tasks its publishes made are not touched."""
    await wheel.topics.delete(name)
    return Response(status_code=204)


@router.post("/{name}/publish", dependencies=[Needs.WRITE], status_code=201,
             response_model=PublishResult, responses={
                 200: {"model": PublishResult,
                       "description": "the same publish was made before (a repeat)"},
                 409: {"description": "the key was published with other content, or a task "
                                      "key holds another task"}, **_RESPONSES})
async def publish(name: TopicName, body: TopicPublish, wheel: WheelDep,
                  response: Response) -> PublishResult:
    """One task per endpoint, key ``<key>.<endpoint>``, all created at once or none. A repeat
    with the same key and content answers 200 with the same tasks."""
    outcome = await wheel.topics.publish(name, body)
    if not outcome.created:
        response.status_code = 200
    return PublishResult(tasks=[task_view(r) for r in outcome.tasks])

"""Topic operations: what ``/topics`` does, without HTTP. A publish becomes one task per
endpoint, each prepared and checked exactly as a ``POST /tasks`` body with the endpoint's URL
as its ``callback_url`` and the endpoint's headers over the published ones; the store creates
them all or none (store/publish.py)."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from timewheel.clock import Clock
from timewheel.delivery.netguard import BlockedAddress, NetworkPolicy
from timewheel.errors import (
    BodyTooLarge,
    InvalidInput,
    StoreUnavailable,
    TaskConflict,
    TopicNotFound,
)
from timewheel.metrics import Metrics
from timewheel.models import KEY_PATTERN, TOPIC_NAME_PATTERN, TaskFields, TopicPublish, TopicPut
from timewheel.operations.cursors import NameCursor
from timewheel.operations.prepare import fingerprint
from timewheel.operations.tasks import ALLOW_PRIVATE_HINT, TaskOperations
from timewheel.store.batch import get_many
from timewheel.store.publish import Publisher, PublishRequest
from timewheel.store.record import NewTask, TaskRecord, new_key
from timewheel.store.replies import PublishReply
from timewheel.store.topic_store import PublishNote, TopicRecord, TopicStore

log = logging.getLogger(__name__)
_TASK_KEY = re.compile(KEY_PATTERN)
_CURSOR = NameCursor("topics", TOPIC_NAME_PATTERN)
# A publish's bodies in all: each endpoint's task stores its own copy, and all are written by
# one script call (on a cluster, also held in one open record), which Redis runs alone. 1 MiB
# to 100 endpoints was one 100 MiB call that held every claim ~0.4 s; 4 MiB keeps a publish's
# call within a few times a 1 MiB POST /tasks.
MAX_PUBLISH_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PublishOutcome:
    """``created``: False when the same publish had been made (a repeat). ``tasks``: one per
    endpoint, in the topic's order (a task already expired is left out of a repeat's)."""

    created: bool
    tasks: list[TaskRecord]


def merged_headers(published: dict[str, str], endpoint: dict[str, str]) -> dict[str, str]:
    """The endpoint's headers over the published ones (names compared case-insensitively)."""
    own = {name.lower() for name in endpoint}
    return {**{n: v for n, v in published.items() if n.lower() not in own}, **endpoint}


class TopicOperations:
    def __init__(self, topics: TopicStore, publisher: Publisher, tasks: TaskOperations,
                 clock: Clock, policy: NetworkPolicy, metrics: Metrics) -> None:
        self.topics = topics
        self.publisher = publisher
        self.tasks = tasks
        self.clock = clock
        self.policy = policy
        self.metrics = metrics

    async def put(self, name: str, body: TopicPut) -> tuple[bool, TopicRecord]:
        """Create or replace; whether it was created. Each endpoint URL passes the network
        policy (the SSRF guard of callback_url) before anything is stored."""
        for index, endpoint in enumerate(body.endpoints):
            try:
                self.policy.check_url_host(endpoint.url)
            except BlockedAddress as exc:
                raise InvalidInput(("body", "endpoints", index, "url"),
                                   f"{exc}; {ALLOW_PRIVATE_HINT}", endpoint.url) from exc
        endpoints = [e.model_dump() for e in body.endpoints]
        now = self.clock.now_ms()
        created, created_ms = await self.topics.put(name, endpoints, now_ms=now)
        return created, TopicRecord(name, endpoints, created_ms, now)

    async def get(self, name: str) -> TopicRecord:
        record = await self.topics.get(name)
        if record is None:
            raise TopicNotFound(name)
        return record

    async def recent(self, name: str) -> list[PublishNote]:
        return await self.topics.recent(name)

    async def page(self, limit: int, cursor: str | None
                   ) -> tuple[list[TopicRecord], str | None]:
        """A page of topics in name order, and the cursor of the next (None: the end)."""
        after = None if cursor is None else _CURSOR.decode(cursor)
        records, last = await self.topics.page(limit, after)
        return records, None if last is None else _CURSOR.encode(last)

    async def delete(self, name: str) -> None:
        if not await self.topics.delete(name):
            raise TopicNotFound(name)

    # -- publish ------------------------------------------------------------------------------

    def prepare(self, topic: TopicRecord, body: TopicPublish, key: str, now: int
                ) -> list[NewTask]:
        """One task per endpoint, checked as POST /tasks checks its body. Raises InvalidInput
        (and BodyTooLarge) before anything is stored."""
        given: dict[str, Any] = body.model_dump(exclude={"key", "callback_url"},
                                                exclude_unset=True)
        tasks = []
        for endpoint in topic.endpoints:
            task_key = f"{key}.{endpoint['name']}"
            if not _TASK_KEY.fullmatch(task_key):
                raise InvalidInput(("body", "key"), f"makes the task key {task_key!r}, over 200 "
                                   "characters: use a shorter key", key)
            fields = {**given, "callback_url": endpoint["url"],
                      "headers": merged_headers(body.headers, endpoint["headers"])}
            try:
                task_fields = TaskFields.model_validate(fields)
            except ValidationError as exc:  # the merged headers over the limits of a task
                error = exc.errors(include_url=False)[0]
                raise InvalidInput(("body", *error["loc"]), f"endpoint {endpoint['name']!r}: "
                                   f"{error['msg']}", error.get("input")) from exc
            try:
                tasks.append(self.tasks.prepare(task_fields, task_key, now))
            except InvalidInput as exc:
                if exc.loc != ("body", "callback_url"):
                    raise
                raise InvalidInput(("body",), f"endpoint {endpoint['name']!r}: {exc.message}",
                                   endpoint["url"]) from exc
        stored = sum(len(task.body or b"") for task in tasks)
        if stored > MAX_PUBLISH_BODY_BYTES:
            raise BodyTooLarge(
                f"a publish stores its body once per endpoint: {len(tasks)} endpoints x "
                f"{stored // len(tasks)} bytes is {stored} bytes, over {MAX_PUBLISH_BODY_BYTES} "
                "in all; publish a smaller body (a reference to the data, say) or to fewer "
                "endpoints")
        return tasks

    async def publish(self, name: str, body: TopicPublish) -> PublishOutcome:
        """Create every endpoint's task at once, or none: 404 for an unknown topic, 409 when
        the key was published with other content or a task key holds another task."""
        topic = await self.get(name)
        key = body.key or new_key()
        now = self.clock.now_ms()
        tasks = self.prepare(topic, body, key, now)
        digest = hashlib.sha256(f"{name}\n{fingerprint(body)}".encode()).hexdigest()
        request = PublishRequest(key=key, fingerprint=digest, tasks=tasks, rec={
            "topic": name, "tasks": [t.key for t in tasks], "created": now})
        done = await self.publisher.publish(request, now_ms=now)
        if done.reply is PublishReply.CONFLICT:
            raise TaskConflict(f"publish {key!r} was made with other content")
        if done.reply is PublishReply.TASK_CONFLICT:
            taken = done.conflict_key or ""
            raise TaskConflict(f"task {taken!r} exists with other content, so the publish "
                               "was refused", await self.tasks.store.get(taken))
        if done.reply is PublishReply.EXISTS:
            keys = list((done.rec or {}).get("tasks", []))
            return PublishOutcome(False, [r for r in await get_many(self.tasks.store, keys)
                                          if r is not None])
        self.metrics.scheduled.inc(len(tasks) - len(done.existing))
        found = dict(zip(done.existing, await get_many(self.tasks.store, done.existing),
                         strict=True))
        records = [found.get(t.key) or t.as_record(now) for t in tasks]
        try:
            await self.topics.note_publish(name, key, now_ms=now)
        except StoreUnavailable as exc:  # the publish stands; only its listing line is lost
            log.warning("publish %s of topic %s not noted in its recent list: %s", key, name, exc)
        return PublishOutcome(True, records)

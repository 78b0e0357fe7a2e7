"""Topics in Redis (``/topics``): their records and the list of each one's recent publishes.

Every topic's keys share one hash tag, ``{<prefix>:topics}`` (lua/topic_put.lua lists them):
topics are configuration, few and small, read one at a time by a publish and listed in name
order, so one slot serves them and a listing is one ZRANGEBYLEX. The tasks a publish makes are
in their own buckets (timewheel/store/publish.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from redis.commands.core import AsyncScript

from timewheel.errors import RecordUnreadable
from timewheel.logs import LogOnce
from timewheel.store.encryption import BadCiphertext, Cipher, UnknownKey, spec_text
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import TopicDeleteReply, TopicPutReply
from timewheel.store.task_store import Store

log = logging.getLogger(__name__)
SCRIPTS = ("topic_put", "topic_delete")
RECENT_KEPT = 50  # publishes remembered per topic, for its page in the dashboard


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    endpoints: list[dict[str, Any]]  # {"name", "url", "headers"}, as PUT stored them
    created_ms: int
    updated_ms: int


@dataclass(frozen=True, slots=True)
class PublishNote:
    """One of a topic's recent publishes: its key and when it was made."""

    key: str
    created_ms: int


class TopicStore:
    def __init__(self, store: Store) -> None:
        self.redis = store.redis
        self.prefix = store.keys.topics
        # With TIMEWHEEL_ENCRYPTION_KEYS the spec is sealed (store/encryption.py): endpoints'
        # headers are where receivers' credentials go, and the contract keeps every header a
        # task sends out of a dump of Redis.
        self.cipher: Cipher | None = store.cipher
        self._unreadable = LogOnce()  # topics logged as left out of the listing
        self.scripts: dict[str, AsyncScript] = {
            name: store.scripts.register(name) for name in SCRIPTS}  # acknowledged writes

    async def put(self, name: str, endpoints: list[dict[str, Any]], *, now_ms: int
                  ) -> tuple[bool, int]:
        """Create or replace; whether it was created, and when (the first time)."""
        text = json.dumps({"endpoints": endpoints}, separators=(",", ":"), ensure_ascii=False)
        spec = text if self.cipher is None else self.cipher.seal_topic(name, text)
        async with redis_errors("topic put"):
            code, created = await self.scripts["topic_put"](keys=[self.prefix],
                                                            args=[name, spec, now_ms])
        return TopicPutReply(int(code)) is TopicPutReply.CREATED, int(created)

    async def get(self, name: str) -> TopicRecord | None:
        async with redis_errors("topic get"):
            raw: list[Any] = await self.redis.hmget(f"{self.prefix}tp:{name}",
                                                    ["spec", "created", "updated"])
        return self._record(name, raw)

    async def delete(self, name: str) -> bool:
        """False when there is no such topic."""
        async with redis_errors("topic delete"):
            code = await self.scripts["topic_delete"](keys=[self.prefix], args=[name])
        return TopicDeleteReply(int(code)) is TopicDeleteReply.DELETED

    async def page(self, limit: int, cursor: str | None
                   ) -> tuple[list[TopicRecord], str | None]:
        """Topics in name order after ``cursor`` (the last name of the previous page)."""
        low = f"({cursor}" if cursor else "-"
        async with redis_errors("topic list"):
            names: list[Any] = await self.redis.zrangebylex(f"{self.prefix}n", low, "+",
                                                            start=0, num=limit + 1)
            shown = [n.decode() for n in names[:limit]]
            pipe: Any = self.redis.pipeline(transaction=False)
            for name in shown:
                pipe.hmget(f"{self.prefix}tp:{name}", ["spec", "created", "updated"])
            rows: list[Any] = await pipe.execute() if shown else []
        records = [self._listed(name, row) for name, row in zip(shown, rows, strict=True)]
        following = shown[-1] if len(names) > limit else None
        return [r for r in records if r is not None], following

    def _listed(self, name: str, raw: list[Any]) -> TopicRecord | None:
        """A listed topic, or None for one no listed key opens: such a topic is left out of
        the listing (logged once) rather than failing it; GET /topics/{name} says why (a 500)."""
        try:
            return self._record(name, raw)
        except RecordUnreadable as exc:
            if self._unreadable.first(str(exc)):
                log.warning("topic left out of the listing: %s", exc)
            return None

    async def note_publish(self, name: str, publish_key: str, *, now_ms: int) -> None:
        """Remember a publish in the topic's recent list (the newest RECENT_KEPT). Written after
        the publish, outside its atomic step: the list is for reading, never for deciding."""
        key = f"{self.prefix}r:{name}"
        async with redis_errors("topic note publish"):
            pipe: Any = self.redis.pipeline(transaction=False)
            pipe.zadd(key, {publish_key: now_ms}, nx=True)
            pipe.zremrangebyrank(key, 0, -RECENT_KEPT - 1)
            await pipe.execute()

    async def recent(self, name: str, limit: int = RECENT_KEPT) -> list[PublishNote]:
        """The topic's recent publishes, newest first."""
        async with redis_errors("topic recent"):
            rows: list[Any] = await self.redis.zrevrange(f"{self.prefix}r:{name}", 0, limit - 1,
                                                         withscores=True)
        return [PublishNote(key.decode(), int(ms)) for key, ms in rows]


    def _record(self, name: str, raw: list[Any]) -> TopicRecord | None:
        spec, created, updated = raw
        if spec is None:
            return None
        endpoints = json.loads(self._spec_text(name, spec))["endpoints"]
        return TopicRecord(name=name, endpoints=endpoints, created_ms=int(created or 0),
                           updated_ms=int(updated or 0))

    def _spec_text(self, name: str, raw: bytes) -> str:
        """The spec JSON, opened when sealed; a spec no listed key opens raises
        RecordUnreadable (a 500 saying which key)."""
        try:
            return spec_text(self.cipher, raw, lambda cipher, blob: cipher.open_topic(name, blob))
        except (UnknownKey, BadCiphertext) as exc:
            raise RecordUnreadable(f"topic {name!r}: {exc}") from exc

"""``GET /tasks``: pages of the tasks of one status, in order, across every bucket, in bounded
steps (docs/api.md "GET /tasks — list and search").

Each status is read from the indexes that hold its tasks, never from the keyspace:

    scheduled   the minute slices (through ``mn``, the minutes that have a slice), and the
                parked tasks (``pa``) that have no attempt yet      due time, soonest first
    retrying    the same, the tasks with an attempt                 due time, soonest first
    delivering  the leases (``ls``)                                 lease expiry, soonest first
    succeeded / failed / cancelled   ``fs`` / ``ff`` / ``fc``'s pages  finished, newest first
                (and ``fc`` itself, written before the cancelled index had pages: until the
                retention empties it, lua/lib/record.lua)

A page asks every (bucket, index) pair for its next ``limit`` tasks after the cursor through
lua/list.lua, which looks at no more than ``budget`` entries per call and says how far it got.
Everything up to the least advanced of those positions has been seen in every bucket, so the
merged page holds the tasks up to there in order (ties: by key); the next cursor is the last
task of a full page, or that position when a call ran out of budget first (a page may then be
short, even empty, with a cursor). The views are read afterwards (lua/view.lua, one call per
bucket), and a task whose status changed in between is left out.

Cost: a page is at most buckets x indexes script calls of at most ``budget`` entries each
(about a millisecond of Redis each), then one view call per bucket; no call scans more. The
views carry each task's headers and body (the task view shows them), which can be 1 MiB a
task: a page reads at most PAGE_REQUEST_BYTES of them (shared among its buckets' calls; the
first task of each call is always read), and ends before the first task left unread, its
cursor pointing there. With bodies of a few KiB a page of 1000 is never cut.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from timewheel.domain import KEY_PATTERN, TaskStatus
from timewheel.store.record import TaskRecord
from timewheel.store.redis_errors import redis_errors

if TYPE_CHECKING:
    from timewheel.store.task_store import Store

MAX_BUDGET = 300  # index entries one list call may look at (keeps each call near 1 ms)
PAGE_REQUEST_BYTES = 8 * 1024 * 1024  # headers and bodies one page reads (see above)
_KEY = re.compile(KEY_PATTERN)


@dataclass(frozen=True)
class Source:
    index: str  # "slices", "pages:<paged index>" or a bucket zset (keys.py)
    desc: bool
    status: str  # the stored status letter (layout.py)
    attempts: str = ""  # "", "0" (none yet) or "+" (some)


SOURCES: dict[TaskStatus, tuple[Source, ...]] = {
    TaskStatus.SCHEDULED: (Source("slices", False, "s"), Source("pa", False, "w", "0")),
    TaskStatus.RETRYING: (Source("slices", False, "r"), Source("pa", False, "w", "+")),
    TaskStatus.DELIVERING: (Source("ls", False, "d"),),
    TaskStatus.SUCCEEDED: (Source("fs", True, "o"),),
    TaskStatus.FAILED: (Source("ff", True, "f"),),
    # The zset from before pages first: a bulk job running across an upgrade keeps its source.
    TaskStatus.CANCELLED: (Source("fc", True, "c"), Source("pages:fc", True, "c")),
}

Position = tuple[int, str]  # (score, key)


class BadCursor(ValueError):
    """A cursor this listing did not hand out."""


def encode_cursor(status: TaskStatus, position: Position) -> str:
    text = f"{status.value}\n{position[0]}\n{position[1]}".encode()
    return base64.urlsafe_b64encode(text).decode().rstrip("=")


def decode_cursor(status: TaskStatus, cursor: str) -> Position:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        name, score, key = text.split("\n")
        position = (int(score), key)
    except (ValueError, binascii.Error) as exc:
        raise BadCursor("not a cursor of GET /tasks") from exc
    if name != status.value:
        raise BadCursor(f"a cursor of the {name!r} listing, not of {status.value!r}")
    if not _KEY.match(key):
        raise BadCursor("not a cursor of GET /tasks")
    return position


def _order(position: Position, desc: bool) -> tuple[Any, ...]:
    """A sort key that puts positions in the listing's order (descending: by score, then key,
    both reversed, as ZREVRANGE has them)."""
    score, key = position
    if not desc:
        return (score, key)
    return (-score, (*(-ord(c) for c in key), 0))


async def list_tasks(store: Store, status: TaskStatus, *, key_prefix: str, limit: int,
                     cursor: Position | None) -> tuple[list[TaskRecord], Position | None]:
    """One page: up to ``limit`` tasks and the position to pass back (None: the end)."""
    sources = SOURCES[status]
    desc = sources[0].desc
    budget = min(max(2 * limit, 100), MAX_BUDGET)
    calls = [(bucket, source) for bucket in range(store.keys.buckets) for source in sources]
    after = ["", ""] if cursor is None else [cursor[0], cursor[1]]
    async with redis_errors("list"):
        replies = await asyncio.gather(*(
            store.list_script(keys=[store.keys.prefix(bucket)], args=[
                source.index, "desc" if desc else "asc", source.status, source.attempts,
                key_prefix, *after, limit, budget])
            for bucket, source in calls))
    found: list[Position] = []
    frontier: Position | None = None
    for reply in replies:
        rows = reply[3:]
        found += [(int(rows[i]), rows[i + 1].decode()) for i in range(0, len(rows), 2)]
        if not int(reply[0]):  # this index goes on past the position it reached
            # (lua/list.lua looks at one entry at least before it stops)
            reached = (int(reply[1]), reply[2].decode())
            if frontier is None or _order(reached, desc) < _order(frontier, desc):
                frontier = reached
    found.sort(key=lambda p: _order(p, desc))
    if frontier is not None:
        found = [p for p in found if _order(p, desc) <= _order(frontier, desc)]
    page = found[:limit]
    done = all(int(reply[0]) for reply in replies)
    if len(found) > limit:
        following: Position | None = page[-1]
    elif not done:
        following = frontier
    else:
        following = None
    found_records = await _records(store, [key for _, key in page])
    unread = next((i for i, key in enumerate(page) if key[1] in found_records
                   and found_records[key[1]].headers is None), None)
    # The page's byte budget ran out: end the page before that task (never the first: the
    # first task of each view call is always read).
    if unread:
        page, following = page[:unread], page[unread - 1]
    return [found_records[key] for _, key in page
            if key in found_records and found_records[key].status is status], following


async def _records(store: Store, keys: list[str]) -> dict[str, TaskRecord]:
    by_bucket: defaultdict[int, list[str]] = defaultdict(list)
    for key in keys:
        by_bucket[store.keys.bucket_of(key)].append(key)
    budget = PAGE_REQUEST_BYTES // max(len(by_bucket), 1)
    groups = await asyncio.gather(*(store.views(b, ks, request_budget=budget)
                                    for b, ks in by_bucket.items()))
    return {record.key: record for group in groups for record in group if record is not None}

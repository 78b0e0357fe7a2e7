"""Whether the processes of a wheel can open what the others seal (docs/security.md, "What a
skipped step costs").

The processes do not need the same key list, and they do not refuse each other: any of them
claims any due task. But one that does not list the key a task was sealed under fails that task
for good when it claims it, even if another process could have sent it. A rolling deploy that
puts a new key first before every process lists it does just that, silently. So every process
notes its key ids in Redis every INTERVAL_S, reads the others', and logs an error, once per
process and key id, for each live process whose list does not fit its own: one that seals with
a key this process does not list, or one that does not list the key this process seals with.
What a process claims stays as it was; the dispatcher asks ``listers`` which live processes
list a key id this process does not, and hands a task sealed under it back for them instead of
failing it for good here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

from redis.exceptions import ResponseError

from timewheel.clock import Clock
from timewheel.errors import RedisFull, StoreUnavailable
from timewheel.logs import LogOnce
from timewheel.store import Store

log = logging.getLogger(__name__)

INTERVAL_S = 10.0
STALE_INTERVALS = 3  # a process that has not noted its keys for this long counts no more
FORGET_TIMEOUT_S = 0.5  # at stop: the longest a silent Redis may hold up a shutdown here
# ``listers`` with no snapshot, or a stale one: the longest it waits for a check of its own.
REFRESH_TIMEOUT_S = 1.0
DOCS = 'docs/security.md, "What a skipped step costs"'


class Mismatch(NamedTuple):
    process: str
    # "theirs": it seals with a key id this process does not list (this process fails what it
    # seals); "mine": it does not list the key id this process seals with (it fails ours).
    side: Literal["theirs", "mine"]
    key_id: str


def mismatches(mine: Sequence[str], others: Mapping[str, Sequence[str]]) -> list[Mismatch]:
    """Each other process whose key ids (the sealing one first; none: encryption off) do not
    fit ``mine``, by process id."""
    out = []
    for process, theirs in sorted(others.items()):
        if theirs and theirs[0] not in mine:
            out.append(Mismatch(process, "theirs", theirs[0]))
        if mine and mine[0] not in theirs:
            out.append(Mismatch(process, "mine", mine[0]))
    return out


def describe(found: Mismatch) -> str:
    if found.side == "theirs":
        return (f"process {found.process} seals payloads with key id {found.key_id!r}, which "
                "this process's TIMEWHEEL_ENCRYPTION_KEYS does not list: this process cannot "
                "send a task sealed under it, so it hands those it claims back, late, to the "
                "processes that list the key, and fails them for good when none does; list "
                f"{found.key_id!r} on every process ({DOCS})")
    return (f"process {found.process} does not list key id {found.key_id!r}, which this "
            "process seals payloads with: that process cannot send a task sealed here, so each "
            "one it claims is late (handed back) or, with no process listing the key, failed "
            f"for good; list {found.key_id!r} on every process before any seals with it "
            f"({DOCS})")


class KeyListCheck:
    def __init__(self, store: Store, clock: Clock, process: str, key_ids: Sequence[str], *,
                 interval_s: float = INTERVAL_S) -> None:
        self._store = store
        self._clock = clock
        self.process = process  # the tick phases' id (timewheel/engine/tick_phase.py)
        self.key_ids = tuple(key_ids)
        self.interval_s = interval_s
        self._told = LogOnce()
        # The other live processes' key ids at the last check that Redis answered, and when.
        self._others: dict[str, tuple[str, ...]] = {}
        self._checked_ms: int | None = None
        self._refreshing: asyncio.Task[list[Mismatch]] | None = None  # listers' own check
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> list[Mismatch]:
        """Note this process's key ids, and log (once each) what does not fit the others'."""
        others = await self._store.note_key_ids(
            self.process, self.key_ids, self._clock.now_ms(), stale_ms=self._stale_ms)
        others.pop(self.process, None)
        self._others, self._checked_ms = others, self._clock.now_ms()
        found = mismatches(self.key_ids, others)
        for each in found:
            if self._told.first(each):
                log.error("%s", describe(each))
        return found

    def listing(self, key_id: str) -> list[str]:
        """The other live processes that list ``key_id``, as the last check saw them: none
        before the first, or when it is older than a process stays live (Redis away since)."""
        if not self._fresh():
            return []
        return [process for process, ids in self._others.items() if key_id in ids]

    async def listers(self, key_id: str) -> list[str]:
        """``listing``, checked again first when the snapshot is missing or stale: after
        Redis was away for longer than a process stays live, or before the first check, the
        ticker claims at once (its backoff is MAX_BACKOFF_SECONDS at most) while the next check
        may be an interval away, and a task a live process could send would be failed for good
        meanwhile. One check at a time, shared by every caller, REFRESH_TIMEOUT_S at most;
        none while stopping (this process's entry is forgotten then)."""
        if not self._fresh() and not self._stopping.is_set():
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.create_task(self.check(),
                                                       name="timewheel-key-lists-refresh")
                self._refreshing.add_done_callback(_retrieved)
            with contextlib.suppress(Exception):  # as the snapshot left it: none live
                await asyncio.wait_for(asyncio.shield(self._refreshing), REFRESH_TIMEOUT_S)
        return self.listing(key_id)

    def _fresh(self) -> bool:
        return (self._checked_ms is not None
                and self._clock.now_ms() - self._checked_ms <= self._stale_ms)

    @property
    def _stale_ms(self) -> int:
        return int(STALE_INTERVALS * self.interval_s * 1000)

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="timewheel-key-lists")

    async def stop(self) -> None:
        """Stop at once, and drop this process's entry, so that the others stop counting it
        now rather than a stale period later: a process started meanwhile would name it (a
        rolling restart for step 2 of a key change right after the one for step 1 would name
        every step-0 process gone within the last 30 s). Neither waits long for a silent
        Redis: a shutdown must stay quick."""
        self._stopping.set()
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.wait([self._refreshing])
            self._refreshing = None
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.wait([self._task])
        self._task = None
        try:
            await asyncio.wait_for(self._store.forget_key_ids(self.process), FORGET_TIMEOUT_S)
        except Exception as exc:  # Redis away: the entry goes a stale period later anyway
            log.debug("key ids not forgotten: %s: %s", type(exc).__name__, exc)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.check()
            except Exception as exc:
                if _away(exc):  # the ticker says so; this waits for it
                    log.debug("key ids not compared: %s: %s", type(exc).__name__, exc)
                elif self._told.first(("failing", type(exc))):  # e.g. an ACL without the key
                    log.warning("encryption key ids not compared with the other processes' "
                                "(%s: %s): mismatched key lists will not be logged until it "
                                "works", type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval_s)


def _retrieved(task: asyncio.Task[list[Mismatch]]) -> None:
    """A check of ``listers`` that failed: what it waited for says so (a debug log)."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("key ids not compared: %s", task.exception())


def _away(exc: BaseException) -> bool:
    """Redis unreachable, timing out or full: what passes. Not a refusal it answered with (a
    wrong type at the key, an ACL that leaves it out) or a bug, which would stay."""
    return (isinstance(exc, StoreUnavailable)
            and (isinstance(exc, RedisFull) or not isinstance(exc.__cause__, ResponseError)))

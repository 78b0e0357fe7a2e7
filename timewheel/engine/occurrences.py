"""When a schedule fires: pure functions of the schedule and an instant (epoch milliseconds).

``every`` N seconds: the multiples of N * 1000 ms since the Unix epoch, so every process agrees
on the occurrences without talking to the others.

``cron``: cronsim matches the expression against naive wall-clock time in the schedule's zone;
zoneinfo maps each matching wall-clock time to an instant (docs/api.md):

- a wall-clock time that does not exist (the hour skipped when DST starts) is skipped;
- one that occurs twice (the hour repeated when DST ends) fires once, at its first instant.

Every occurrence is a whole second. The mapping wall time -> instant (``fold=0``) is monotonic,
so the occurrences of an expression are exactly the images of its matches, in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from cronsim import CronSim

_SECOND = timedelta(seconds=1)
# No zone has a DST shift longer than this (Antarctica/Troll has two hours).
_MAX_SHIFT = timedelta(hours=3)


@dataclass(frozen=True, slots=True)
class Recurrence:
    """A schedule's timing: exactly one of ``cron`` (with ``timezone``) and ``every``."""

    cron: str | None = None
    every: int | None = None
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of cron and every")
        if self.every is not None and self.every < 1:
            raise ValueError("every must be at least 1 second")

    def next_after(self, after_ms: int) -> int | None:
        """The first occurrence strictly after ``after_ms``; None if there is none (cronsim
        looks 50 years ahead)."""
        if self.every is not None:
            period = self.every * 1000
            return (after_ms // period + 1) * period
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        after_s = after_ms // 1000  # an occurrence at after_s * 1000 is not after after_ms
        start = _wall(after_s, zone)
        if _second_pass(after_s, zone):
            # In the repeated hour: every wall time up to its end maps to its first pass, which
            # is not after `after_ms`. Start the search at the end of the repeated hour.
            start = max(start, _wall(_end_of_second_pass(after_s, zone), zone) - _SECOND)
        for wall in _matches(self.cron, start, reverse=False):
            instant = _instant(wall, zone)
            if instant is not None and instant > after_s:
                return instant * 1000
        return None

    def latest_at_or_before(self, at_ms: int) -> int | None:
        """The last occurrence at or before ``at_ms``; None if there is none in 50 years."""
        if self.every is not None:
            period = self.every * 1000
            return at_ms // period * period
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        at_s = at_ms // 1000
        if _second_pass(at_s, zone):
            # Every wall time of the repeated hour has already had its (first) instant.
            start = _wall(_end_of_second_pass(at_s, zone), zone)
        else:
            start = _wall(at_s, zone) + _SECOND  # cronsim's reverse search excludes its start
        for wall in _matches(self.cron, start, reverse=True):
            instant = _instant(wall, zone)
            if instant is not None and instant <= at_s:
                return instant * 1000
        return None

    def between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Up to ``limit`` occurrences in ``(after_ms, until_ms]``, in order."""
        found: list[int] = []
        at = after_ms
        while len(found) < limit:
            nxt = self.next_after(at)
            if nxt is None or nxt > until_ms:
                break
            found.append(nxt)
            at = nxt
        return found


def _matches(expr: str, start: datetime, *, reverse: bool) -> Iterator[datetime]:
    """Naive wall-clock times matching ``expr``, strictly after (before) ``start``."""
    return iter(CronSim(expr, start, reverse=reverse))  # ends by itself after 50 years


def _wall(instant_s: int, zone: ZoneInfo) -> datetime:
    """The naive wall-clock time in ``zone`` at an instant."""
    return datetime.fromtimestamp(instant_s, tz=zone).replace(tzinfo=None)


def _second_pass(instant_s: int, zone: ZoneInfo) -> bool:
    """Whether the instant lies in the second pass of a repeated wall-clock hour."""
    return datetime.fromtimestamp(instant_s, tz=zone).fold == 1


def _end_of_second_pass(instant_s: int, zone: ZoneInfo) -> int:
    """The first instant after ``instant_s`` (inside a repeated hour's second pass) whose wall
    time is past the repeated hour: a binary search on whole seconds."""
    low, high = instant_s, instant_s + int(_MAX_SHIFT.total_seconds())
    while high - low > 1:  # invariant: low is in the second pass, high is not
        mid = (low + high) // 2
        if _second_pass(mid, zone):
            low = mid
        else:
            high = mid
    return high


def _instant(wall: datetime, zone: ZoneInfo) -> int | None:
    """The first instant (whole seconds) at which ``zone`` shows ``wall``; None when the wall
    time does not exist there (skipped by a DST change)."""
    first = wall.replace(tzinfo=zone, fold=0)
    instant = first.astimezone(UTC)
    # A wall time in a gap does not survive the round trip through UTC.
    if instant.astimezone(zone).replace(tzinfo=None) != wall:
        return None
    return int(instant.timestamp())


def next_after(spec: Mapping[str, Any], after_ms: int) -> int | None:
    """The next occurrence of a stored schedule spec ({cron, every, timezone, ...})."""
    return Recurrence(cron=spec["cron"], every=spec["every"],
                      timezone=spec["timezone"]).next_after(after_ms)


def latest_at_or_before(spec: Mapping[str, Any], at_ms: int) -> int | None:
    """The latest occurrence of a stored schedule spec at or before ``at_ms``."""
    return Recurrence(cron=spec["cron"], every=spec["every"],
                      timezone=spec["timezone"]).latest_at_or_before(at_ms)

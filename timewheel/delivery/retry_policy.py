"""What an attempt's answer means, and when the next attempt is due (docs/api.md, Callbacks)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Literal

BACKOFF_CAP_MS = 3_600_000
DEFAULT_MAX_ATTEMPTS = 5  # docs/api.md, POST /tasks
DEFAULT_BACKOFF_MS = 1000
JITTER = 0.2  # each delay is stretched by up to 20%, so retries of one burst spread out

Verdict = Literal["ok", "retry", "fail"]


def classify_status(status: int) -> Verdict:
    """2xx succeeds; 408, 429 and 5xx are worth another try; anything else (3xx: redirects are
    not followed, other 4xx) will not get better by asking again."""
    if 200 <= status < 300:
        return "ok"
    if status in (408, 429) or status >= 500:
        return "retry"
    return "fail"


@dataclass(frozen=True, slots=True)
class RetryDefaults:
    """A flow's retry defaults (PUT /flows): 0 where none is set. A task's own fields win;
    a task that set none gets its flow's, else the service's (5 attempts, 1 s)."""

    max_attempts: int = 0
    backoff_ms: int = 0
    max_backoff_ms: int = 0

    def max_attempts_for(self, own: int) -> int:
        """``own``: the task's stored max_attempts, 0 when it set none."""
        return own or self.max_attempts or DEFAULT_MAX_ATTEMPTS

    def backoff_ms_for(self, own: int) -> int:
        """``own``: the task's stored retry_backoff in ms, 0 when it set none."""
        return own or self.backoff_ms or DEFAULT_BACKOFF_MS

    @property
    def cap_ms(self) -> int:
        """No retry of the flow waits longer than this (Retry-After included)."""
        return self.max_backoff_ms or BACKOFF_CAP_MS


NO_DEFAULTS = RetryDefaults()


def backoff_ms(base_ms: int, attempt: int, rng: random.Random | None = None, *,
               cap_ms: int = BACKOFF_CAP_MS) -> int:
    """Delay after attempt number ``attempt`` (1-based): base, 2*base, 4*base, ... with jitter,
    never more than the cap."""
    delay = base_ms * 2 ** min(attempt - 1, 40)
    jitter = 1.0 + JITTER * (rng or random).random()
    return int(min(cap_ms, delay * jitter))


def retry_after_ms(value: str | None, now_ms: int) -> int | None:
    """``Retry-After`` as a delay in ms: delta-seconds or an HTTP date. None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # isdigit alone accepts "²" and "١٢"
        return int(value) * 1000
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if moment.tzinfo is None:
        return None
    return max(0, int(moment.timestamp() * 1000) - now_ms)


def next_due_ms(now_ms: int, base_ms: int, attempt: int, retry_after: str | None,
                rng: random.Random | None = None, *, cap_ms: int = BACKOFF_CAP_MS) -> int:
    """When the next attempt may start: the backoff, or later if the receiver asked for it with
    Retry-After, but never beyond the cap (the flow's max_backoff, else an hour)."""
    delay = backoff_ms(base_ms, attempt, rng, cap_ms=cap_ms)
    asked = retry_after_ms(retry_after, now_ms)
    if asked is not None:
        delay = max(delay, min(asked, cap_ms))
    return now_ms + delay

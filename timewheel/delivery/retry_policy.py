"""What an attempt's answer means, and when the next attempt is due (docs/api.md, Callbacks)."""

from __future__ import annotations

import random
from email.utils import parsedate_to_datetime
from typing import Literal

BACKOFF_CAP_MS = 3_600_000
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


def backoff_ms(base_ms: int, attempt: int, rng: random.Random | None = None) -> int:
    """Delay after attempt number ``attempt`` (1-based): base, 2*base, 4*base, ... with jitter,
    never more than the cap."""
    delay = base_ms * 2 ** min(attempt - 1, 40)
    jitter = 1.0 + JITTER * (rng or random).random()
    return int(min(BACKOFF_CAP_MS, delay * jitter))


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
                rng: random.Random | None = None) -> int:
    """When the next attempt may start: the backoff, or later if the receiver asked for it with
    Retry-After, but never beyond the cap."""
    delay = backoff_ms(base_ms, attempt, rng)
    asked = retry_after_ms(retry_after, now_ms)
    if asked is not None:
        delay = max(delay, min(asked, BACKOFF_CAP_MS))
    return now_ms + delay

"""retry_policy: which answers are retried, the backoff schedule, Retry-After (docs/api.md)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from timewheel.delivery.retry_policy import (
    BACKOFF_CAP_MS,
    backoff_ms,
    classify_status,
    next_due_ms,
    retry_after_ms,
)

NOW_MS = 1_800_000_000_000  # a whole second, so HTTP dates (whole seconds) convert exactly
CAP_MS = 3_600_000


class FixedRandom(random.Random):
    """A Random whose ``random()`` always answers ``value``: pins the jitter."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def expected_verdict(status: int) -> str:
    """The contract, written out independently of the code under test."""
    if 200 <= status <= 299:
        return "ok"
    if status in (408, 429) or 500 <= status <= 599:
        return "retry"
    return "fail"


def http_date(moment: datetime) -> str:
    return format_datetime(moment, usegmt=True)


def now_dt() -> datetime:
    return datetime.fromtimestamp(NOW_MS / 1000, tz=UTC)


# -- classify_status ---------------------------------------------------------------------------


def test_classify_status_every_code_from_100_to_599() -> None:
    """2xx succeed; 408, 429 and 5xx retry; 1xx, 3xx and every other 4xx fail at once."""
    verdicts = {status: classify_status(status) for status in range(100, 600)}
    assert verdicts == {status: expected_verdict(status) for status in range(100, 600)}
    assert sorted(s for s, v in verdicts.items() if v == "retry") == [
        408, 429, *range(500, 600)]
    assert [s for s, v in verdicts.items() if v == "ok"] == list(range(200, 300))


@pytest.mark.parametrize(("status", "verdict"), [
    (200, "ok"), (201, "ok"), (204, "ok"), (299, "ok"),
    (301, "fail"), (302, "fail"), (304, "fail"), (307, "fail"), (308, "fail"),
    (400, "fail"), (401, "fail"), (404, "fail"), (409, "fail"), (410, "fail"), (422, "fail"),
    (408, "retry"), (429, "retry"), (500, "retry"), (502, "retry"), (503, "retry"),
    (504, "retry"), (599, "retry"), (100, "fail"), (101, "fail"),
])
def test_classify_status_named_cases(status: int, verdict: str) -> None:
    """The cases receivers care about, spelled out one by one."""
    assert classify_status(status) == verdict


# -- backoff -----------------------------------------------------------------------------------


def test_backoff_doubles_without_jitter() -> None:
    """With the jitter at its floor the schedule is base, 2x, 4x, 8x ..."""
    rng = FixedRandom(0.0)
    assert [backoff_ms(1000, n, rng) for n in range(1, 9)] == [
        1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000]
    assert [backoff_ms(250, n, rng) for n in range(1, 5)] == [250, 500, 1000, 2000]


def test_backoff_jitter_stretches_by_at_most_a_fifth() -> None:
    """The jitter factor lies in [1.0, 1.2): 0.5 gives 1.1x, just under 1 gives just under 1.2x."""
    assert [backoff_ms(1000, n, FixedRandom(0.5)) for n in (1, 2, 3)] == [1100, 2200, 4400]
    nearly_one = FixedRandom(0.999999)
    assert [backoff_ms(1000, n, nearly_one) for n in (1, 2, 3)] == [1199, 2399, 4799]


def test_backoff_with_seeded_random_stays_in_bounds_and_is_reproducible() -> None:
    """Every delay is between 1.0x and 1.2x of base*2^(n-1); the same seed gives the same list."""
    base = 1000
    first = [backoff_ms(base, n, random.Random(7)) for n in range(1, 12)]
    again = [backoff_ms(base, n, random.Random(7)) for n in range(1, 12)]
    assert first == again
    rng = random.Random(1234)
    seen = []
    for _ in range(200):
        for n in range(1, 12):
            nominal = base * 2 ** (n - 1)
            delay = backoff_ms(base, n, rng)
            assert nominal <= delay <= nominal * 1.2
            seen.append(delay / nominal)
    # Seeded jitter actually spreads the delays (not always the floor or the ceiling).
    assert min(seen) < 1.02
    assert max(seen) > 1.18


def test_backoff_is_capped_at_one_hour() -> None:
    """Growth stops at 3600 s, including with jitter, huge attempt numbers and a 1 h base."""
    assert BACKOFF_CAP_MS == CAP_MS
    rng = FixedRandom(0.0)
    # 1000 * 2^11 = 2048 s is under the cap, 2^12 = 4096 s is over it.
    assert backoff_ms(1000, 12, rng) == 2_048_000
    assert backoff_ms(1000, 13, rng) == CAP_MS
    # 2048 s with 1.1x jitter is still under; with 1.999.. it would pass the cap.
    assert backoff_ms(1000, 12, FixedRandom(0.5)) == 2_252_800
    assert backoff_ms(2000, 12, FixedRandom(0.5)) == CAP_MS
    assert backoff_ms(1000, 100, rng) == CAP_MS
    assert backoff_ms(1000, 10_000, FixedRandom(0.999)) == CAP_MS
    assert backoff_ms(CAP_MS, 1, FixedRandom(0.999)) == CAP_MS


def test_backoff_without_rng_uses_the_module_random() -> None:
    """No rng given: still within the jitter bounds."""
    for n in range(1, 6):
        nominal = 500 * 2 ** (n - 1)
        assert nominal <= backoff_ms(500, n) <= nominal * 1.2


# -- Retry-After ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("120", 120_000), ("0", 0), ("1", 1000), (" 30 ", 30_000), ("3600", 3_600_000),
    ("86400", 86_400_000),
])
def test_retry_after_delta_seconds(value: str, expected: int) -> None:
    """Delta-seconds become milliseconds; surrounding whitespace is tolerated."""
    assert retry_after_ms(value, NOW_MS) == expected


def test_retry_after_http_date() -> None:
    """An HTTP date (IMF-fixdate, as format_datetime writes it) is a delay from now."""
    assert retry_after_ms(http_date(now_dt() + timedelta(seconds=90)), NOW_MS) == 90_000
    assert retry_after_ms(http_date(now_dt() + timedelta(hours=2)), NOW_MS) == 7_200_000
    # Not yet a whole second past the date's second: the delay counts from the exact now.
    assert retry_after_ms(http_date(now_dt() + timedelta(seconds=10)), NOW_MS + 250) == 9_750


def test_retry_after_date_in_the_past_means_now() -> None:
    """A date already gone is a zero delay, never negative."""
    assert retry_after_ms(http_date(now_dt() - timedelta(minutes=5)), NOW_MS) == 0
    assert retry_after_ms(http_date(now_dt()), NOW_MS) == 0


@pytest.mark.parametrize("value", [
    None, "", "   ", "soon", "-5", "1.5", "+10", "10s", "0x10", "Mon, 99 Foo 2027",
    "Thu, 32 Dec 2027 25:61:00 GMT", "2027-01-15T08:00:00Z",
])
def test_retry_after_malformed_is_ignored(value: str | None) -> None:
    """Anything that is neither delta-seconds nor an HTTP date is None (ignored)."""
    assert retry_after_ms(value, NOW_MS) is None


@pytest.mark.parametrize("value", ["\u00b2", "\u0661\u0662"])
def test_retry_after_non_ascii_digits_are_malformed(value: str) -> None:
    """RFC 9110 delta-seconds are ASCII digits; a receiver's odd header must not raise."""
    assert retry_after_ms(value, NOW_MS) is None


# -- next_due_ms ---------------------------------------------------------------------------------


def test_next_due_is_now_plus_backoff() -> None:
    """Without Retry-After the next attempt is due after the backoff, counted from now."""
    assert next_due_ms(NOW_MS, 1000, 1, None, FixedRandom(0.0)) == NOW_MS + 1000
    assert next_due_ms(NOW_MS, 1000, 3, None, FixedRandom(0.5)) == NOW_MS + 4400
    assert next_due_ms(NOW_MS, 1000, 40, None, FixedRandom(0.0)) == NOW_MS + CAP_MS


def test_next_due_honours_a_longer_retry_after() -> None:
    """A Retry-After longer than the backoff wins, in both forms."""
    rng = FixedRandom(0.0)
    assert next_due_ms(NOW_MS, 1000, 1, "120", rng) == NOW_MS + 120_000
    date = http_date(now_dt() + timedelta(seconds=300))
    assert next_due_ms(NOW_MS, 1000, 1, date, rng) == NOW_MS + 300_000


def test_next_due_keeps_the_backoff_over_a_shorter_retry_after() -> None:
    """Retry-After never makes the next attempt earlier than the backoff."""
    rng = FixedRandom(0.0)
    assert next_due_ms(NOW_MS, 10_000, 2, "5", rng) == NOW_MS + 20_000
    assert next_due_ms(NOW_MS, 10_000, 1, "0", rng) == NOW_MS + 10_000
    past = http_date(now_dt() - timedelta(hours=1))
    assert next_due_ms(NOW_MS, 10_000, 1, past, rng) == NOW_MS + 10_000


def test_next_due_caps_retry_after_at_one_hour() -> None:
    """Retry-After is honoured only up to the backoff cap, in both forms."""
    rng = FixedRandom(0.0)
    assert next_due_ms(NOW_MS, 1000, 1, "3600", rng) == NOW_MS + CAP_MS
    assert next_due_ms(NOW_MS, 1000, 1, "3601", rng) == NOW_MS + CAP_MS
    assert next_due_ms(NOW_MS, 1000, 1, "999999999999", rng) == NOW_MS + CAP_MS
    far = http_date(now_dt() + timedelta(days=3))
    assert next_due_ms(NOW_MS, 1000, 1, far, rng) == NOW_MS + CAP_MS
    assert next_due_ms(NOW_MS, 1000, 1, "3599", rng) == NOW_MS + 3_599_000


def test_next_due_ignores_malformed_retry_after() -> None:
    """A malformed Retry-After leaves the plain backoff."""
    rng = FixedRandom(0.0)
    for value in ("later", "-1", "1e3", "Fri, 99 Foo 2027 00:00:00 GMT"):
        assert next_due_ms(NOW_MS, 2000, 2, value, rng) == NOW_MS + 4000

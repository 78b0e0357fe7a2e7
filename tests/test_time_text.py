"""How times are written (domain.format_ms): RFC 3339 UTC with milliseconds, the same text
whatever was formatted before it (each second's text is kept, a few thousand at most)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from timewheel import domain
from timewheel.domain import format_ms

LAST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def reference(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC).replace(microsecond=(ms % 1000) * 1000)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_known_times() -> None:
    assert format_ms(None) is None
    assert format_ms(0) == "1970-01-01T00:00:00.000Z"
    assert format_ms(1_795_341_600_123) == "2026-11-22T10:00:00.123Z"
    assert format_ms(LAST_MS) == "9999-12-31T23:59:59.999Z"


@given(st.lists(st.integers(min_value=0, max_value=LAST_MS - 1), min_size=1, max_size=50))
def test_any_sequence_of_times_is_written_as_datetime_writes_it(times: list[int]) -> None:
    assert [format_ms(ms) for ms in times] == [reference(ms) for ms in times]
    # the same seconds again, now from what was kept, and their neighbours
    assert [format_ms(ms + 1) for ms in times] == [reference(ms + 1) for ms in times]


def test_the_kept_seconds_are_bounded_and_still_right_after_a_clear() -> None:
    start = 1_795_341_600_000
    for i in range(domain._MAX_SECONDS + 10):
        assert format_ms(start + i * 1000 + 7) == reference(start + i * 1000 + 7)
    assert 0 < len(domain._SECONDS) <= domain._MAX_SECONDS

"""``parse_execute_at``'s integer arithmetic against the Decimal code it replaced: the same
millisecond for every input, or the same error. Rounding up is what keeps a task from firing
before the instant its request spelled (DESIGN.md: never fire early), so it is compared on
every form a request can take, not only on the examples of tests/test_api.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal, InvalidOperation

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from timewheel.models import parse_execute_at

# -- the code before, frozen (timewheel/models/tasks.py until 2026-11-29) -------------------------

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)


def _ceil_ms(seconds: Decimal) -> int:
    return int((seconds * 1000).to_integral_value(rounding=ROUND_CEILING))


def frozen(value: str | int | float) -> int:
    if isinstance(value, str):
        if not _RFC3339.match(value):
            raise ValueError("must be an RFC 3339 date-time with offset, e.g. "
                             "2026-11-22T10:00:00Z, or Unix seconds as a number")
        try:
            moment = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValueError(f"not a valid date-time: {exc}") from exc
        whole = Decimal(int(moment.replace(microsecond=0).timestamp()))
        fraction = re.search(r"\.(\d+)", value)
        return _ceil_ms(whole + (Decimal("0." + fraction.group(1)) if fraction else 0))
    try:
        seconds = Decimal(str(value))
    except InvalidOperation as exc:
        raise ValueError("not a number") from exc
    if seconds < 0:
        raise ValueError("must be Unix epoch seconds >= 0")
    return _ceil_ms(seconds)


def outcome(parse: object, value: str | int | float) -> tuple[str, object]:
    try:
        return "ms", parse(value)  # type: ignore[operator]
    except ValueError as exc:
        return "error", str(exc)


def same(value: str | int | float) -> None:
    assert outcome(parse_execute_at, value) == outcome(frozen, value), value


# -- numbers -----------------------------------------------------------------------------------

@given(st.integers(min_value=-(2**70), max_value=2**70))
@example(0)
@example(-1)
def test_integers(value: int) -> None:
    same(value)


@given(st.integers(min_value=0, max_value=2**45), st.integers(min_value=0, max_value=9))
@example(1_800_000_060_000, 4)
@example(2**41 * 1000 - 1, 3)  # the fast path's last second
@example(2**41 * 1000, 3)
def test_decimals_as_a_request_spells_them(units: int, places: int) -> None:
    """What a JSON number with 0-9 decimals parses to: the double nearest to it."""
    same(units / 10**places)


@given(st.floats(allow_nan=False, allow_infinity=False))
@example(-0.0)
@example(5e-324)
@example(0.0005)
@example(0.0015)
@example(1_800_000_060.0001)
@example(float(2**41) - 2**-11)
@example(float(2**41))
@example(1e300)
def test_any_double(value: float) -> None:
    same(value)


# -- date-times --------------------------------------------------------------------------------

def wall(*fields: int) -> datetime:
    """A wall-clock time with no offset: the tests add the offset as text."""
    return datetime(*fields, tzinfo=UTC).replace(tzinfo=None)  # type: ignore[misc]


_MOMENTS = st.datetimes(min_value=wall(1, 1, 2), max_value=wall(9999, 12, 30))


@given(_MOMENTS, st.text(alphabet="0123456789", max_size=10),
       st.sampled_from(["Z", "z", "+00:00", "-00:00", "+02:00", "-08:30", "+14:00", "-23:59"]),
       st.sampled_from(["T", "t", " "]))
@example(wall(2027, 1, 15, 10), "1234", "+02:00", "T")
@example(wall(1969, 12, 31, 23, 59, 59), "5", "Z", "T")  # before the epoch: negative
@example(wall(2026, 11, 29), "000000001", "Z", "T")
@example(wall(2026, 11, 29), "999999999", "Z", "T")
@example(wall(2026, 11, 29), "0001", "Z", "T")
def test_date_times(moment: datetime, digits: str, offset: str, separator: str) -> None:
    """With 0-10 fraction digits (10 is refused, as is an empty fraction), any offset."""
    text = moment.replace(microsecond=0).isoformat(sep=separator)
    same(text + ("." + digits if digits or moment.microsecond % 2 else "") + offset)


@pytest.mark.parametrize("text", [
    "2026-11-29", "2026-11-29T03:40:00", "2026-02-30T00:00:00Z", "2026-11-29T24:00:00Z",
    # Arabic-Indic digits: the pattern's \d takes them, fromisoformat does not.
    "2026-11-29T03:40:00.\u0661\u0662\u0663Z", "\u0662\u0660\u0662\u0666-11-29T03:40:00Z",
    "2026-11-29T03:40:00+1:00", "",
    "1800000060", " 2026-11-29T03:40:00Z", "2026-11-29T03:40:00.Z",
])
def test_strings_refused_alike(text: str) -> None:
    same(text)


def test_the_epoch_and_around_it() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for delta in (timedelta(0), timedelta(milliseconds=-1), timedelta(microseconds=1)):
        same((epoch + delta).isoformat())

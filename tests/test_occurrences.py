"""Occurrences of ``every`` and ``cron`` schedules: pure functions of an injected instant."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from timewheel.engine.occurrences import Recurrence


def ms(text: str) -> int:
    """An RFC 3339 UTC instant as epoch milliseconds."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def iso(value: int | None) -> str | None:
    """Epoch milliseconds as a UTC string to compare with."""
    if value is None:
        return None
    return datetime.fromtimestamp(value / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def series(rec: Recurrence, after: str, count: int) -> list[str | None]:
    """The next ``count`` occurrences strictly after ``after``, as UTC strings."""
    out: list[str | None] = []
    at = ms(after)
    for _ in range(count):
        nxt = rec.next_after(at)
        out.append(iso(nxt))
        if nxt is None:
            break
        at = nxt
    return out


# -- every ------------------------------------------------------------------------------------

def test_every_counts_from_the_epoch() -> None:
    rec = Recurrence(every=60)
    assert rec.next_after(0) == 60_000
    assert rec.next_after(59_999) == 60_000
    assert rec.next_after(60_000) == 120_000  # strictly after
    assert rec.latest_at_or_before(60_000) == 60_000
    assert rec.latest_at_or_before(119_999) == 60_000
    # Any two processes agree: the result does not depend on when the schedule was made.
    assert rec.next_after(ms("2027-01-15T08:00:30.5Z")) == ms("2027-01-15T08:01:00Z")


def test_every_odd_period_is_aligned_to_the_epoch_not_to_the_minute() -> None:
    rec = Recurrence(every=7)
    nxt = rec.next_after(ms("2027-01-15T08:00:00Z"))
    assert nxt is not None and nxt % 7000 == 0
    assert rec.between(nxt - 1, nxt + 21_000, 10) == [nxt, nxt + 7000, nxt + 14_000, nxt + 21_000]


def test_every_one_second_between_is_bounded_by_limit() -> None:
    rec = Recurrence(every=1)
    assert rec.between(1000, 100_000, 3) == [2000, 3000, 4000]
    assert rec.between(1000, 1999, 3) == []


@pytest.mark.parametrize("kwargs", [{}, {"cron": "* * * * *", "every": 1}, {"every": 0}])
def test_recurrence_needs_exactly_one_valid_kind(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Recurrence(**kwargs)  # type: ignore[arg-type]


# -- cron, five and six fields ----------------------------------------------------------------

def test_five_field_cron_in_utc() -> None:
    rec = Recurrence(cron="*/15 * * * *")
    assert series(rec, "2027-01-15T08:07:00Z", 3) == [
        "2027-01-15T08:15:00Z", "2027-01-15T08:30:00Z", "2027-01-15T08:45:00Z"]
    assert iso(rec.latest_at_or_before(ms("2027-01-15T08:29:59.999Z"))) == "2027-01-15T08:15:00Z"
    assert iso(rec.latest_at_or_before(ms("2027-01-15T08:30:00Z"))) == "2027-01-15T08:30:00Z"


def test_six_field_cron_has_a_leading_seconds_field() -> None:
    rec = Recurrence(cron="*/2 * * * * *")
    assert series(rec, "2027-01-15T08:00:01Z", 3) == [
        "2027-01-15T08:00:02Z", "2027-01-15T08:00:04Z", "2027-01-15T08:00:06Z"]
    # A fraction of a second past an occurrence: the next one, not the same one again.
    assert iso(rec.next_after(ms("2027-01-15T08:00:02.500Z"))) == "2027-01-15T08:00:04Z"
    assert iso(rec.latest_at_or_before(ms("2027-01-15T08:00:03.999Z"))) == "2027-01-15T08:00:02Z"
    # 30 in the leading field is the second, not the minute.
    assert series(Recurrence(cron="30 0 12 * * *"), "2027-01-15T00:00:00Z", 1) == [
        "2027-01-15T12:00:30Z"]


def test_cron_in_a_zone_without_dst_change() -> None:
    rec = Recurrence(cron="0 9 * * 1-5", timezone="Asia/Tokyo")  # 09:00 JST = 00:00Z
    assert series(rec, "2027-01-15T00:00:00Z", 2) == [  # a Friday: next is Monday
        "2027-01-18T00:00:00Z", "2027-01-19T00:00:00Z"]


# -- DST: a 02:30 daily job -------------------------------------------------------------------

DAILY_0230 = "30 2 * * *"


@pytest.mark.parametrize(("zone", "before", "expected"), [
    # Berlin, 2025-03-30: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day.
    ("Europe/Berlin", "2025-03-28T12:00:00Z",
     ["2025-03-29T01:30:00Z", "2025-03-31T00:30:00Z", "2025-04-01T00:30:00Z"]),
    # New York, 2025-03-09: 02:00 EST jumps to 03:00 EDT.
    ("America/New_York", "2025-03-07T12:00:00Z",
     ["2025-03-08T07:30:00Z", "2025-03-10T06:30:00Z", "2025-03-11T06:30:00Z"]),
])
def test_spring_forward_skips_the_time_that_does_not_exist(
        zone: str, before: str, expected: list[str]) -> None:
    rec = Recurrence(cron=DAILY_0230, timezone=zone)
    assert series(rec, before, 3) == expected
    # The six-field spelling means the same.
    assert series(Recurrence(cron="0 " + DAILY_0230, timezone=zone), before, 3) == expected


@pytest.mark.parametrize(("zone", "before", "expected"), [
    # Berlin, 2025-10-26: 03:00 CEST goes back to 02:00 CET; 02:30 happens at 00:30Z and 01:30Z.
    ("Europe/Berlin", "2025-10-24T12:00:00Z",
     ["2025-10-25T00:30:00Z", "2025-10-26T00:30:00Z", "2025-10-27T01:30:00Z"]),
    # New York, 2025-11-02: 02:00 EDT goes back to 01:00 EST, so 01:xx repeats and 02:30
    # happens once, in EST: the daily job runs once that day, an hour later in UTC.
    ("America/New_York", "2025-10-31T12:00:00Z",
     ["2025-11-01T06:30:00Z", "2025-11-02T07:30:00Z", "2025-11-03T07:30:00Z"]),
])
def test_fall_back_fires_a_repeated_time_once(zone: str, before: str, expected: list[str]) -> None:
    rec = Recurrence(cron=DAILY_0230, timezone=zone)
    assert series(rec, before, 3) == expected
    assert series(Recurrence(cron="0 " + DAILY_0230, timezone=zone), before, 3) == expected


def test_new_york_repeated_hour_fires_once() -> None:
    # In New York the repeated hour is 01:00-02:00 local: a 01:30 job sees its time twice.
    rec = Recurrence(cron="30 1 * * *", timezone="America/New_York")
    assert series(rec, "2025-11-01T12:00:00Z", 2) == [
        "2025-11-02T05:30:00Z",  # 01:30 EDT, the first pass
        "2025-11-03T06:30:00Z"]  # not 06:30Z on the 2nd (01:30 EST, the second pass)


def test_inside_the_second_pass_the_repeated_time_has_already_fired() -> None:
    rec = Recurrence(cron=DAILY_0230, timezone="Europe/Berlin")
    second_pass = ms("2025-10-26T01:10:00Z")  # 02:10 CET, after 02:10 CEST an hour earlier
    assert iso(rec.next_after(second_pass)) == "2025-10-27T01:30:00Z"
    # Its latest occurrence is the first pass of 02:30, though 02:30 > 02:10 on the wall.
    assert iso(rec.latest_at_or_before(second_pass)) == "2025-10-26T00:30:00Z"


def test_frequent_cron_across_fall_back_follows_the_wall_clock() -> None:
    # Each wall-clock time fires once, so the repeated hour's second pass is skipped as a whole.
    rec = Recurrence(cron="0 * * * *", timezone="Europe/Berlin")
    assert series(rec, "2025-10-25T23:30:00Z", 4) == [
        "2025-10-26T00:00:00Z",  # 02:00 CEST
        "2025-10-26T02:00:00Z",  # 03:00 CET; 02:00 CET (01:00Z) is a repeat
        "2025-10-26T03:00:00Z", "2025-10-26T04:00:00Z"]
    # Spring forward: the hour 02:00-03:00 does not exist.
    assert series(rec, "2025-03-29T23:30:00Z", 3) == [
        "2025-03-30T00:00:00Z", "2025-03-30T01:00:00Z", "2025-03-30T02:00:00Z"]


def test_latest_at_or_before_skips_a_time_that_does_not_exist() -> None:
    rec = Recurrence(cron=DAILY_0230, timezone="Europe/Berlin")
    assert iso(rec.latest_at_or_before(ms("2025-03-30T12:00:00Z"))) == "2025-03-29T01:30:00Z"


# -- month ends and leap days -----------------------------------------------------------------

def test_day_31_skips_short_months() -> None:
    rec = Recurrence(cron="0 0 31 * *")
    assert series(rec, "2027-01-31T12:00:00Z", 3) == [
        "2027-03-31T00:00:00Z", "2027-05-31T00:00:00Z", "2027-07-31T00:00:00Z"]


def test_last_day_of_month() -> None:
    rec = Recurrence(cron="0 12 L * *", timezone="Europe/Berlin")
    assert series(rec, "2028-01-31T12:00:00Z", 3) == [
        "2028-02-29T11:00:00Z", "2028-03-31T10:00:00Z", "2028-04-30T10:00:00Z"]


def test_february_29_fires_in_leap_years_only() -> None:
    rec = Recurrence(cron="0 12 29 2 *")
    assert series(rec, "2025-01-01T00:00:00Z", 3) == [
        "2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z", "2036-02-29T12:00:00Z"]
    assert iso(rec.latest_at_or_before(ms("2031-06-01T00:00:00Z"))) == "2028-02-29T12:00:00Z"


def test_between_lists_cron_occurrences_in_a_window() -> None:
    rec = Recurrence(cron="*/20 * * * * *")
    start = ms("2027-01-15T08:00:00Z")
    assert rec.between(start, start + 60_000, 10) == [start + 20_000, start + 40_000,
                                                      start + 60_000]

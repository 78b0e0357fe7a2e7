"""The bytes of a callback request (timewheel/delivery/http1.py request_bytes): stored header
names and values were checked at creation, and are checked again here, so that no stored
value can split the request on the wire."""

from __future__ import annotations

import pytest

from timewheel.delivery import http1
from timewheel.delivery.http1 import origin_of, request_bytes

ORIGIN = origin_of("http://127.0.0.1:9/hook")


def test_headers_are_written_as_given_with_accept_and_length_added() -> None:
    data = request_bytes("POST", ORIGIN, [("X-One", "1"), ("webhook-id", "k")], b"{}")
    assert data == (b"POST /hook HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-One: 1\r\nwebhook-id: k\r\n"
                    b"Accept: */*\r\nContent-Length: 2\r\n\r\n{}")


def test_a_given_accept_header_is_not_doubled_whatever_its_case() -> None:
    for name in ("Accept", "accept", "ACCEPT"):
        data = request_bytes("GET", ORIGIN, [(name, "text/plain")], None)
        assert data.lower().count(b"accept:") == 1


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\0b"])
def test_a_value_with_cr_lf_or_nul_is_refused_naming_its_header(value: str) -> None:
    headers = [("X-Fine", "ok"), ("X-Bad", value), ("X-Last", "ok")]
    with pytest.raises(ValueError, match="'X-Bad'"):
        request_bytes("POST", ORIGIN, headers, b"")


@pytest.mark.parametrize("name", ["", "a b", "a:b", "é", "a\r\nb"])
def test_a_name_that_is_no_token_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a token"):
        request_bytes("POST", ORIGIN, [(name, "x")], b"")


def test_names_past_the_bound_of_checked_names_are_still_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "_CHECKED_NAMES", {})
    monkeypatch.setattr(http1, "_MAX_CHECKED_NAMES", 3)
    request_bytes("GET", ORIGIN, [(f"X-{i}", "v") for i in range(10)], None)
    assert len(http1._CHECKED_NAMES) == 3
    with pytest.raises(ValueError, match="not a token"):
        request_bytes("GET", ORIGIN, [("X 11", "v")], None)
    assert "X 11" not in http1._CHECKED_NAMES


def test_long_names_are_checked_every_time_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A header name may be as long as a request: keeping such names could hold gigabytes."""
    monkeypatch.setattr(http1, "_CHECKED_NAMES", {})
    long_name = "X-" + "a" * 1_000
    data = request_bytes("GET", ORIGIN, [(long_name, "v"), ("X-Short", "v")], None)
    assert f"{long_name}: v\r\n".encode() in data
    assert list(http1._CHECKED_NAMES) == ["X-Short"]

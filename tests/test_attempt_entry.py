"""An attempt's history entry as written (timewheel/store/attempts.py ``entry``): orjson
writes it, and the text must be json's, byte for byte, whatever the answer held; what orjson
refuses goes through json; every entry reads back as written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from timewheel.store import attempts

JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

ANSWERS: list[dict[str, Any]] = [
    {"status_code": 200, "headers": {"content-type": "text/plain", "content-length": "2"},
     "body": "ok"},
    {"status_code": 503, "headers": {"retry-after": "120", "x-request-id": "a\"b\\c"},
     "body": "naïve — 東京 🎉 \u2028 \u007f"},
    {"status_code": None, "error": "connect: [Errno 111] Connection refused\n\t\x00\x1f",
     "headers": None, "body": None},
    {"status_code": 200, "headers": {}, "body": ""},
]


@pytest.mark.parametrize("answer", ANSWERS)
def test_the_entry_is_the_text_json_writes(answer: dict[str, Any]) -> None:
    fields = {"attempt": 3, "started_ms": 1_800_000_000_123, "duration_ms": 12,
              "verdict": "retry", "error": None, "body_truncated": True,
              "next_attempt_ms": 1_800_000_060_000, "process": "host:1234", **answer}
    text = attempts.entry(**fields)
    assert isinstance(text, str)
    expected = {"n": 3, "s": 1_800_000_000_123, "d": 12, "o": "retry", "p": "host:1234"}
    if answer["status_code"] is not None:
        expected["c"] = answer["status_code"]
    if answer.get("error"):
        expected["e"] = answer["error"]
    if answer["headers"]:
        expected["h"] = answer["headers"]
    if answer["body"] is not None:
        expected["b"] = answer["body"]
    expected |= {"bt": 1, "na": 1_800_000_060_000}
    assert text == JSON(expected)
    assert attempts.AttemptRecord.decode(text).response_body == answer["body"]


def test_a_text_orjson_refuses_is_written_by_json() -> None:
    lone = "cut \ud800 here"  # a lone surrogate: not UTF-8, orjson refuses it
    text = attempts.entry(attempt=1, started_ms=1, duration_ms=1, verdict="ok", status_code=200,
                          error=None, headers=None, body=lone, body_truncated=False,
                          next_attempt_ms=None, process="p")
    assert text == JSON({"n": 1, "s": 1, "d": 1, "o": "delivered", "p": "p", "c": 200,
                         "b": lone})


def test_an_empty_body_is_not_sealed() -> None:
    """A sealed body costs ~45 bytes more than its text; an empty one has nothing to hide."""
    from timewheel.store.encryption import Cipher

    cipher = Cipher([("k0", bytes(range(32)))])
    common: dict[str, Any] = {"attempt": 1, "started_ms": 1, "duration_ms": 2,
                              "verdict": "ok", "status_code": 204, "error": None,
                              "headers": None, "body_truncated": False,
                              "next_attempt_ms": None, "process": "p", "key": "k",
                              "cipher": cipher}
    empty = json.loads(attempts.entry(body="", **common))
    assert (empty["b"], "bx" in empty) == ("", False)
    sealed = json.loads(attempts.entry(body="receipt", **common))
    assert ("b" in sealed, "bx" in sealed) == (False, True)
    assert attempts.AttemptRecord.decode(json.dumps(empty), key="k",
                                         cipher=cipher).response_body == ""

"""The task's plain values, shared by the API's models (timewheel/models), the store and the
engine: no pydantic and nothing of HTTP here, so the store can speak them.

``TaskStatus`` is the API's status enum and the store's: a plain ``StrEnum`` whose six words are
what a client sees and what the store's records decode to (a parked task reads as scheduled or
retrying), so one enum serves both rather than two that must be kept equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import lru_cache
from urllib.parse import urlsplit

KEY_PATTERN = r"^[A-Za-z0-9._:-]{1,200}$"

# A result callback (docs/api.md v3, "Result callbacks") is the task ``{key}.on_success`` or
# ``{key}.on_failure``; it lives in its parent's bucket (store/keys.py ``bucket_of``).
RESULT_SUFFIXES = (".on_success", ".on_failure")
# The key of a task that may exist: one a request may give (KEY_PATTERN), or a result task's,
# which is such a key and its suffix (up to 211 characters). The paths that read or act on a
# task (GET, DELETE, PATCH, /attempts, /replay) take it; creating keeps KEY_PATTERN.
EXISTING_KEY_PATTERN = r"^[A-Za-z0-9._:-]{1,200}(?:\.on_success|\.on_failure)?$"


def result_parent(key: str) -> str | None:
    """The key of the task whose result callback ``key`` names, or None."""
    for suffix in RESULT_SUFFIXES:
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[:-len(suffix)]
    return None


class Method(StrEnum):
    GET = "GET"
    POST = "POST"
    PUT = "PUT"
    PATCH = "PATCH"
    DELETE = "DELETE"


class TaskStatus(StrEnum):
    SCHEDULED = "scheduled"
    DELIVERING = "delivering"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class CallbackURL:
    """What the service reads from a ``callback_url``, parsed once (``callback_url``)."""

    problem: str | None  # why it is refused (the 422's message); None: a valid callback URL
    flow: str | None  # a valid URL's default flow (store/record.py ``default_flow``)


# ``str.isspace()`` or below U+0020: the same set, checked over every code point.
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f]")


@lru_cache(maxsize=2048)
def callback_url(url: str) -> CallbackURL:
    """A callback URL's verdict and default flow. Validation, the flow of a task without a
    ``flow_key`` and the requests of a batch (1000 items at most, validated before any is
    prepared) find it here instead of parsing the URL again; a URL of 2 KiB at most
    (MAX_URL_LENGTH) keeps the cache under ~10 MB. Pays for itself: without the cache the
    service spent 12 % more CPU per task on `python -m bench.batch --tasks 50000
    --concurrency 2` (bench/README.md, "What each mechanism pays for")."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        return CallbackURL(f"not a valid URL: {exc}", None)
    scheme = parts.scheme.lower()
    hostname = parts.hostname
    if scheme not in ("http", "https") or not hostname:
        return CallbackURL("must be an absolute http:// or https:// URL", None)
    if _SPACE_OR_CONTROL.search(url):
        return CallbackURL("must not contain whitespace or control characters", None)
    # Without an "@" in the netloc, urllib's username and password are None.
    if "@" in parts.netloc and (parts.username is not None or parts.password is not None):
        return CallbackURL("must not carry user:password (put credentials in headers)", None)
    host = hostname.lower().replace(":", "-")
    return CallbackURL(None, f"{host}:{port or (443 if scheme == 'https' else 80)}")


_SECONDS: dict[int, str] = {}  # epoch second -> its text: times a process formats repeat it
_MAX_SECONDS = 4096


def format_ms(ms: int | None) -> str | None:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds (``2026-11-22T10:00:00.123Z``).
    Each second's text is kept (a few thousand at most): a datetime's ``strftime`` costs ~3 µs,
    several times a task view, and a view, a batch's answer and a callback's
    ``timewheel-scheduled-at`` header mostly format seconds formatted just before."""
    if ms is None:
        return None
    second, millis = divmod(ms, 1000)
    text = _SECONDS.get(second)
    if text is None:
        if len(_SECONDS) >= _MAX_SECONDS:
            _SECONDS.clear()
        text = _SECONDS[second] = datetime.fromtimestamp(second, tz=UTC).strftime(
            "%Y-%m-%dT%H:%M:%S")
    return f"{text}.{millis:03d}Z"

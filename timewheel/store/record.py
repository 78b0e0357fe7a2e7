"""The task record: what a request becomes in Redis, and what Redis gives back.

``prepare`` turns a validated request into the exact bytes that each attempt will send, so the
dispatcher's hot path does no encoding and the signed body is the stored body.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from timewheel.models import (
    MAX_BODY_BYTES,
    TaskFields,
    TaskStatus,
    TaskView,
    format_ms,
    parse_execute_at,
)

DEFAULT_TIMEOUT_SECONDS = 10.0
PARKED = "waiting"  # the stored status of a task parked until its flow has room (lua/park.lua)

# The hash fields a view reads, in this order (Store.get and Store.list_failed).
VIEW_FIELDS = ("status", "exec", "due", "url", "method", "attempts", "max", "last_at",
               "last_code", "last_err", "created", "finished")


class BodyTooLarge(ValueError):
    """The encoded ``body`` is over MAX_BODY_BYTES (API.md: 413)."""


@dataclass(frozen=True, slots=True)
class NewTask:
    key: str
    url: str
    method: str
    headers: list[tuple[str, str]]
    body: bytes | None
    due_ms: int
    timeout_ms: int
    max_attempts: int
    backoff_ms: int
    fingerprint: str
    flow: str

    def fields(self) -> list[str | bytes | int]:
        """Field/value pairs of the record for ``lua/schedule.lua`` (ARGV[7..])."""
        return ["url", self.url, "method", self.method, "headers", json.dumps(self.headers),
                "body", self.body if self.body is not None else b"", "exec", self.due_ms,
                "max", self.max_attempts, "backoff", self.backoff_ms, "timeout", self.timeout_ms,
                "flow", self.flow]

    def view(self, now_ms: int) -> TaskView:
        return TaskView(
            key=self.key, status=TaskStatus.SCHEDULED, execute_at=_fmt(self.due_ms),
            callback_url=self.url, method=self.method, attempts=0, max_attempts=self.max_attempts,
            next_attempt_at=_fmt(self.due_ms), last_attempt_at=None, last_status_code=None,
            last_error=None, created_at=_fmt(now_ms), finished_at=None,
        )


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """A task this process claimed: everything needed to send its next attempt."""

    key: str
    bucket: int
    token: str
    due_ms: int
    execute_at_ms: int
    attempts: int  # attempts made before this one
    max_attempts: int
    backoff_ms: int
    timeout_ms: int
    url: str
    method: str
    headers: list[tuple[str, str]]
    body: bytes
    flow: str


def new_key() -> str:
    return secrets.token_urlsafe(16)


def default_flow(url: str) -> str:
    """The flow of a task that names none: its destination, ``host:port`` in lower case with
    the port always written, an IPv6 literal's colons as dashes (API.md ``flow_key``)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().replace(":", "-")
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    return f"{host}:{port}"


def encode_body(fields: TaskFields) -> tuple[bytes | None, str | None]:
    """The bytes to send and the Content-Type to add (None: the task's own headers say it)."""
    if "body" not in fields.model_fields_set:
        return None, None
    own_type = any(name.lower() == "content-type" for name in fields.headers)
    if isinstance(fields.body, str) and own_type:
        data = fields.body.encode()
        content_type = None
    else:
        # The request parser already refuses NaN and Infinity (api/routing.py).
        data = json.dumps(fields.body, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()
        content_type = "application/json"
    if len(data) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body is {len(data)} bytes encoded; at most {MAX_BODY_BYTES}")
    return data, content_type


def prepare(fields: TaskFields, key: str, now_ms: int, *, default_timeout: float) -> NewTask:
    """A validated request as the record to store. Settings-dependent limits are checked
    by the caller (api/tasks.py) before this runs."""
    body, content_type = encode_body(fields)
    headers = [(name, value) for name, value in fields.headers.items()
               if not (content_type and name.lower() == "content-type")]
    if content_type:
        headers.append(("Content-Type", content_type))
    due = due_ms(fields, now_ms)
    timeout = fields.timeout if fields.timeout is not None else default_timeout
    return NewTask(
        key=key, url=fields.callback_url, method=fields.method.value, headers=headers, body=body,
        due_ms=due, timeout_ms=max(1, round(timeout * 1000)), max_attempts=fields.max_attempts,
        backoff_ms=max(1, round(fields.retry_backoff * 1000)),
        fingerprint=fingerprint(fields),
        flow=fields.flow_key or default_flow(fields.callback_url),
    )


def due_ms(fields: TaskFields, now_ms: int) -> int:
    if fields.execute_at is not None:
        return parse_execute_at(fields.execute_at)
    if fields.delay is not None:
        return now_ms + round(fields.delay * 1000)
    return now_ms


def fingerprint(fields: TaskFields) -> str:
    """Identifies the request's content, so a repeated POST can be told from a conflicting one.
    ``execute_at`` is normalised (the same instant in any spelling); ``delay`` is kept as given,
    since the repeat of a POST with a delay is meant to be the same task."""
    content: dict[str, Any] = fields.model_dump(mode="json", exclude={"key"})
    if fields.execute_at is not None:
        content["execute_at"] = parse_execute_at(fields.execute_at)
    content["body_set"] = "body" in fields.model_fields_set
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _fmt(ms: int) -> str:
    text = format_ms(ms)
    assert text is not None
    return text


def _int(value: bytes | None) -> int | None:
    return int(value) if value else None


def _str(value: bytes | None) -> str | None:
    return value.decode() if value else None


def view_from_fields(key: str, values: list[bytes | None]) -> TaskView | None:
    """A view from the VIEW_FIELDS values of a record (None when the record does not exist)."""
    row = dict(zip(VIEW_FIELDS, values, strict=True))
    if row["status"] is None:
        return None
    stored = row["status"].decode()
    attempts = _int(row["attempts"]) or 0
    if stored == PARKED:  # waiting for its flow: to the client, still due
        stored = TaskStatus.RETRYING if attempts else TaskStatus.SCHEDULED
    status = TaskStatus(stored)
    waiting = status in (TaskStatus.SCHEDULED, TaskStatus.RETRYING)
    return TaskView(
        key=key, status=status, execute_at=_fmt(int(row["exec"] or 0)),
        callback_url=_str(row["url"]) or "", method=_str(row["method"]) or "",
        attempts=attempts, max_attempts=_int(row["max"]) or 0,
        next_attempt_at=format_ms(_int(row["due"])) if waiting else None,
        last_attempt_at=format_ms(_int(row["last_at"])),
        last_status_code=_int(row["last_code"]), last_error=_str(row["last_err"]),
        created_at=_fmt(int(row["created"] or 0)), finished_at=format_ms(_int(row["finished"])),
    )

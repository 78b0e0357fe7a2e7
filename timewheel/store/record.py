"""The task record: what a request becomes in Redis, and what Redis gives back.

``prepare`` turns a validated request into the exact bytes that each attempt will send, so the
dispatcher's hot path does no encoding and the signed body is the stored body. The bytes of the
stored record are timewheel/store/layout.py's.
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
from timewheel.store import layout

DEFAULT_TIMEOUT_SECONDS = 10.0
PARKED = "waiting"  # the stored status of a task parked until its flow has room (lua/park.lua)


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

    def record(self) -> bytes:
        """The record as ``lua/schedule.lua`` takes it (layout.template)."""
        return layout.template(
            url=self.url, method=self.method, headers=self.headers, body=self.body,
            due_ms=self.due_ms, timeout_ms=self.timeout_ms, max_attempts=self.max_attempts,
            backoff_ms=self.backoff_ms, fingerprint=self.fingerprint, flow=self.flow)

    def fields(self) -> list[bytes]:
        """The record's part of a script's arguments (``lua/sched_tombstone.lua`` ARGV[5])."""
        return [self.record()]

    def view(self, now_ms: int) -> TaskView:
        return TaskView(
            key=self.key, status=TaskStatus.SCHEDULED, execute_at=_fmt(self.due_ms),
            callback_url=self.url, method=self.method, attempts=0, max_attempts=self.max_attempts,
            next_attempt_at=_fmt(self.due_ms), last_attempt_at=None, last_status_code=None,
            last_error=None, created_at=_fmt(now_ms), finished_at=None,
        )


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """A task this process claimed: everything needed to time, route and record its next
    attempt. Headers and body come with ``Store.start`` (``Started``), just before sending,
    so a claimed task costs a few hundred bytes whatever its body."""

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
    flow: str


@dataclass(frozen=True, slots=True)
class Started:
    """What ``Store.start`` answers for one claim: the attempt number (0: the claim is not the
    caller's any more, do not send), and the headers and body to send, as stored now."""

    attempt: int
    headers: list[tuple[str, str]]
    body: bytes


NOT_STARTED = Started(0, [], b"")


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


def claimed_task(key: str, bucket: int, token: str, prefix: bytes) -> ClaimedTask:
    """A claim reply's task (its record's head, flow and url). Raises layout.BadRecord."""
    head, flow, url = layout.split(prefix)
    try:
        return ClaimedTask(
            key=key, bucket=bucket, token=token, due_ms=head["due"],
            execute_at_ms=head["exec"], attempts=head["att"], max_attempts=head["max"],
            backoff_ms=head["backoff"], timeout_ms=head["timeout"], url=url.decode(),
            method=layout.METHOD_NAMES[head["meth"]], flow=flow.decode())
    except (KeyError, UnicodeDecodeError) as exc:
        raise layout.BadRecord(f"{type(exc).__name__}: {exc}") from exc


def view_from_record(key: str, prefix: bytes, last_err: bytes) -> TaskView:
    """The view of a task from its record's head, flow and url (lua/view.lua) and last_err.
    Raises layout.BadRecord."""
    head, _, url = layout.split(prefix)
    try:
        stored = layout.STATUS_NAMES[head["st"]]
        method = layout.METHOD_NAMES[head["meth"]]
        text = url.decode(), last_err.decode()
    except (KeyError, UnicodeDecodeError) as exc:
        raise layout.BadRecord(f"{type(exc).__name__}: {exc}") from exc
    attempts = head["att"]
    if stored == PARKED:  # waiting for its flow: to the client, still due
        stored = TaskStatus.RETRYING if attempts else TaskStatus.SCHEDULED
    status = TaskStatus(stored)
    waiting = status in (TaskStatus.SCHEDULED, TaskStatus.RETRYING)
    return TaskView(
        key=key, status=status, execute_at=_fmt(head["exec"]), callback_url=text[0],
        method=method, attempts=attempts, max_attempts=head["max"],
        next_attempt_at=format_ms(head["due"]) if waiting else None,
        last_attempt_at=format_ms(head["last_at"] or None),
        last_status_code=head["last_code"] or None, last_error=text[1] or None,
        created_at=_fmt(head["created"]), finished_at=format_ms(head["finished"] or None),
    )

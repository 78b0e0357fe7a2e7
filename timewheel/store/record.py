"""The task record: what a request becomes in Redis (``NewTask``, built from a validated request
by timewheel/operations/prepare.py), and what Redis gives back (``TaskRecord``,
``ClaimedTask``, ``Started``): domain values only, no API model. The bytes of the stored record
are timewheel/store/layout.py's.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

from timewheel.domain import TaskStatus, callback_url
from timewheel.store import layout
from timewheel.store.encryption import (
    BadCiphertext,
    Cipher,
    UnknownKey,
    is_sealed,
    sealed_key_id,
)

PARKED = "waiting"  # the stored status of a task parked until its flow has room (lua/park.lua)


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
    on_success: str | None = None  # result callbacks (docs/api.md v3)
    on_failure: str | None = None

    def record(self, cipher: Cipher | None = None) -> bytes:
        """The record as ``lua/schedule.lua`` takes it (layout.template); with a ``cipher``
        (TIMEWHEEL_ENCRYPTION_KEYS), headers and body sealed."""
        return layout.template(
            url=self.url, method=self.method, headers=self.headers, body=self.body,
            due_ms=self.due_ms, timeout_ms=self.timeout_ms, max_attempts=self.max_attempts,
            backoff_ms=self.backoff_ms, fingerprint=self.fingerprint, flow=self.flow,
            key=self.key, cipher=cipher)

    def results(self) -> str:
        """The stored value of its result callbacks' URLs (lua/lib/results.lua): "" for none."""
        return encode_results(self.on_success, self.on_failure)

    def fields(self, cipher: Cipher | None = None) -> list[bytes]:
        """The record's part of a script's arguments (``lua/sched_tombstone.lua`` ARGV[5])."""
        return [self.record(cipher)]

    def as_record(self, now_ms: int) -> TaskRecord:
        """The task as the store would read it back right after creating it at ``now_ms``."""
        return TaskRecord(
            key=self.key, status=TaskStatus.SCHEDULED, callback_url=self.url,
            method=self.method, flow=self.flow, execute_at_ms=self.due_ms, due_ms=self.due_ms,
            attempts=0, max_attempts=self.max_attempts, timeout_ms=self.timeout_ms,
            backoff_ms=self.backoff_ms, created_ms=now_ms, last_attempt_ms=None,
            last_status_code=None, last_error=None, finished_ms=None, headers=self.headers,
            body=self.body or b"", on_success=self.on_success, on_failure=self.on_failure)


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A stored task as the store reads it back (``Store.get``, the listings): domain values,
    times in epoch ms. The API turns it into its view (timewheel/api/views.py)."""

    key: str
    status: TaskStatus  # as clients see it: a task parked for its flow is scheduled/retrying
    callback_url: str
    method: str
    flow: str
    execute_at_ms: int
    due_ms: int | None  # the next attempt's time; None once the task is delivering or finished
    attempts: int
    max_attempts: int
    timeout_ms: int
    backoff_ms: int
    created_ms: int
    last_attempt_ms: int | None
    last_status_code: int | None
    last_error: str | None
    finished_ms: int | None
    # What each attempt sends; None when a listing left it unread (its page's byte budget).
    headers: list[tuple[str, str]] | None
    body: bytes | None
    on_success: str | None = None
    on_failure: str | None = None


class ClaimedTask(NamedTuple):
    """A task this process claimed: everything needed to time, route and record its next
    attempt. Headers and body come with ``Store.start`` (``Started``), just before sending,
    so a claimed task costs a few hundred bytes whatever its body.

    A named tuple, not a frozen dataclass: one is made per claimed task, and a frozen
    dataclass's ``__init__`` (a setattr per field) took 4 us of ``claimed_task``'s 13."""

    key: str
    bucket: int
    token: str
    due_ms: int
    execute_at_ms: int
    created_ms: int  # a task created (or replaced) with a past due time is late from here
    attempts: int  # attempts made before this one
    max_attempts: int
    backoff_ms: int
    timeout_ms: int
    url: str
    method: str
    flow: str


class Started(NamedTuple):
    """What ``Store.start`` answers for one claim: the attempt number (0: the claim is not the
    caller's any more, do not send), and the headers and body to send, as stored now. (A named
    tuple: one is made per attempt, 0.37 us against 1.4 for a frozen dataclass.)"""

    attempt: int
    headers: list[tuple[str, str]]
    body: bytes
    # The task's result callbacks: its answer's body is kept for them (executor.py).
    on_success: str | None = None
    on_failure: str | None = None
    # Why this process cannot open the record (sealed under a key id TIMEWHEEL_ENCRYPTION_KEYS
    # does not list, or undecodable): the attempt is failed at its time with this reason as
    # its last_error, never sent (Executor.set_aside). None for a record to send.
    unsendable: str | None = None
    # The key id it is sealed under when that is why (the dispatcher hands such an attempt
    # back while another live process lists the key: timewheel/engine/key_lists.py).
    unknown_key: str | None = None


NOT_STARTED = Started(0, [], b"")


def encode_results(on_success: str | None, on_failure: str | None) -> str:
    """The stored value of a task's result callbacks (lua/lib/results.lua); "" for none."""
    if not on_success and not on_failure:
        return ""
    return f"{on_success or ''}\n{on_failure or ''}"


def decode_results(value: bytes | str | None) -> tuple[str | None, str | None]:
    """(on_success, on_failure) of a stored value."""
    if not value:
        return None, None
    text = value.decode() if isinstance(value, bytes) else value
    success, _, failure = text.partition("\n")
    return success or None, failure or None


def new_key() -> str:
    return secrets.token_urlsafe(16)


def default_flow(url: str) -> str:
    """The flow of a task that names none: its destination, ``host:port`` in lower case with
    the port always written, an IPv6 literal's colons as dashes (docs/api.md ``flow_key``)."""
    if type(url) is str:  # the parse validation made, for a valid callback URL
        flow = callback_url(url).flow
        if flow is not None:
            return flow
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().replace(":", "-")
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    return f"{host}:{port}"


# Positions of the head's values that a claimed task needs (layout.head_values).
_ATT, _MAX, _METH, _DUE, _EXEC, _CREATED, _BACKOFF, _TIMEOUT, _FL, _UL = (
    layout.AT[name] for name in ("att", "max", "meth", "due", "exec", "created", "backoff",
                                 "timeout", "fl", "ul"))
_METHODS = {code.encode(): name for code, name in layout.METHOD_NAMES.items()}


def due_of(record: bytes) -> int:
    """The time a stored record's task is due (from its head). Raises layout.BadRecord."""
    return int.from_bytes(layout.head_values(record)[_DUE], "big")


def claimed_task(key: str, bucket: int, token: str, prefix: bytes) -> ClaimedTask:
    """A claim reply's task (its record's head, flow and url). Raises layout.BadRecord.

    Reads the head's values by position, not through ``layout.split``'s dict: this runs once
    per claimed task (12.7 -> 1.8 us a call here, with the named tuple)."""
    h = layout.head_values(prefix)
    flow, url = layout.flow_and_url(prefix, h[_FL], h[_UL])
    try:
        return ClaimedTask(
            key, bucket, token, int.from_bytes(h[_DUE], "big"), int.from_bytes(h[_EXEC], "big"),
            int.from_bytes(h[_CREATED], "big"), h[_ATT], h[_MAX], h[_BACKOFF], h[_TIMEOUT],
            url.decode(), _METHODS[h[_METH]], flow.decode())
    except (KeyError, UnicodeDecodeError) as exc:
        raise layout.BadRecord(f"{type(exc).__name__}: {exc}") from exc


def open_request(key: str, headers: bytes, body: bytes, cipher: Cipher | None
                 ) -> tuple[list[tuple[str, str]], bytes]:
    """The headers and body a record stores (headers part, body part), opened when sealed.
    Raises UnknownKey, BadCiphertext, layout.BadRecord or UnicodeDecodeError."""
    if is_sealed(headers):
        if cipher is None:
            raise UnknownKey(sealed_key_id(headers))
        opened = cipher.open_task(key, headers)
        headers, body = opened.headers, opened.body
    return layout.decode_headers(headers), body


def unsendable_reason(exc: Exception) -> str:
    """The last_error of a record this process cannot open (undecodable, or sealed under a
    key id TIMEWHEEL_ENCRYPTION_KEYS does not list)."""
    if isinstance(exc, UnknownKey):
        return f"{exc}: list the key, then replay the task"
    return f"undecodable record: {exc}"


def record_from_reply(key: str, prefix: bytes, last_err: bytes, request: bytes | None,
                      results: bytes | None = None, cipher: Cipher | None = None) -> TaskRecord:
    """A task from lua/view.lua's reply: its record's head, flow and url, its last_err, its
    headers and body (None: not read), opened when sealed, and its result callbacks. Raises
    layout.BadRecord."""
    head, flow, url = layout.split(prefix)
    try:
        stored = layout.STATUS_NAMES[head["st"]]
        method = layout.METHOD_NAMES[head["meth"]]
        text = url.decode(), last_err.decode(), flow.decode()
    except (KeyError, UnicodeDecodeError) as exc:
        raise layout.BadRecord(f"{type(exc).__name__}: {exc}") from exc
    headers, body, unreadable = None, None, None
    if request is not None:
        hl = head["hl"]
        try:
            headers, body = open_request(key, request[:hl], request[hl:hl + head["bl"]], cipher)
        except (layout.BadRecord, UnicodeDecodeError, UnknownKey, BadCiphertext) as exc:
            # Such a task fails at its time, unsent (Store.start_many); a sealed body that does
            # not open is shown as none, and until it has failed, last_error says why.
            headers = []
            body = b"" if is_sealed(request[:hl]) else request[hl:hl + head["bl"]]
            unreadable = unsendable_reason(exc)
    attempts = head["att"]
    if stored == PARKED:  # waiting for its flow: to the client, still due
        stored = TaskStatus.RETRYING if attempts else TaskStatus.SCHEDULED
    status = TaskStatus(stored)
    try:
        on_success, on_failure = decode_results(results)
    except UnicodeDecodeError as exc:
        raise layout.BadRecord(f"result callbacks: {exc}") from exc
    waiting = status in (TaskStatus.SCHEDULED, TaskStatus.RETRYING)
    last_error = text[1] or None
    if unreadable is not None and not head["finished"]:
        last_error = f"{unreadable} (it fails when due, unsent)"
    return TaskRecord(
        key=key, status=status, callback_url=text[0], method=method, flow=text[2],
        execute_at_ms=head["exec"], due_ms=head["due"] if waiting else None, attempts=attempts,
        max_attempts=head["max"], timeout_ms=head["timeout"], backoff_ms=head["backoff"],
        created_ms=head["created"], last_attempt_ms=head["last_at"] or None,
        last_status_code=head["last_code"] or None, last_error=last_error,
        finished_ms=head["finished"] or None, headers=headers, body=body,
        on_success=on_success, on_failure=on_failure)

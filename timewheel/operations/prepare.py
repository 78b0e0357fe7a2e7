"""A validated request (timewheel/models) as the record the store keeps (``NewTask``).

``prepare`` turns a request into the exact bytes that each attempt will send, so the
dispatcher's hot path does no encoding and the signed body is the stored body; ``fingerprint``
tells a repeated POST from a conflicting one; ``template_task`` does the same for a schedule's
task template. The settings-dependent checks come before, in timewheel/operations/tasks.py.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
import math
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any

from timewheel.errors import BodyTooLarge
from timewheel.models import (
    MAX_BODY_BYTES,
    Method,
    TaskCreate,
    TaskFields,
    parse_execute_at,
)
from timewheel.store.record import NewTask, default_flow, encode_results

DEFAULT_TIMEOUT_SECONDS = 10.0


def encode_body(fields: TaskFields) -> tuple[bytes | None, str | None]:
    """The bytes to send and the Content-Type to add (None: the task's own headers say it)."""
    return _encode_body(fields, _plain_json(fields.body))


def sent_as_json(fields: TaskFields) -> bool:
    """Whether the task's body is sent as the JSON text of ``fields.body`` (with Content-Type
    application/json): then its view's body is ``fields.body`` again."""
    return "body" in fields.model_fields_set and not (
        isinstance(fields.body, str)
        and any(name.lower() == "content-type" for name in fields.headers))


def _encode_body(fields: TaskFields, plain: bool) -> tuple[bytes | None, str | None]:
    if "body" not in fields.model_fields_set:
        return None, None
    if not sent_as_json(fields):  # a string with a Content-Type of its own
        data = fields.body.encode()
        content_type = None
    else:
        # The request parser already refuses NaN and Infinity (api/routing.py).
        if plain:
            data = _compact(fields.body).encode()
        else:
            data = json.dumps(fields.body, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False).encode()
        content_type = "application/json"
    if len(data) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body is {len(data)} bytes encoded; at most {MAX_BODY_BYTES}")
    return data, content_type


def prepare(fields: TaskFields, key: str, now_ms: int, *, default_timeout: float) -> NewTask:
    """A validated request as the record to store. Settings-dependent limits are checked
    by the caller (operations/tasks.py) before this runs."""
    plain = _plain_json(fields.body)
    body, content_type = _encode_body(fields, plain)
    headers = [(name, value) for name, value in fields.headers.items()
               if not (content_type and name.lower() == "content-type")]
    if content_type:
        headers.append(("Content-Type", content_type))
    due = due_ms(fields, now_ms)
    timeout = fields.timeout if fields.timeout is not None else default_timeout
    return NewTask(
        key=key, url=fields.callback_url, method=fields.method.value, headers=headers, body=body,
        due_ms=due, timeout_ms=max(1, round(timeout * 1000)),
        # 0: not set by the request, so the flow's retry default applies when the attempt is
        # decided (timewheel/delivery/retry_policy.py RetryDefaults). The fingerprint still
        # covers the model's defaults, as it did for tasks stored before flows had defaults.
        max_attempts=fields.max_attempts if "max_attempts" in fields.model_fields_set else 0,
        backoff_ms=(max(1, round(fields.retry_backoff * 1000))
                    if "retry_backoff" in fields.model_fields_set else 0),
        fingerprint=_fingerprint(fields, plain),
        flow=fields.flow_key or default_flow(fields.callback_url),
        on_success=fields.on_success, on_failure=fields.on_failure,
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
    since the repeat of a POST with a delay is meant to be the same task.

    The hashed text is ``json.dumps(content, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)`` of the model's JSON-mode dump (without ``key``) plus ``body_set``:
    tasks stored by earlier builds are compared with it, so those bytes must never change
    (tests/test_fingerprint.py compares with a frozen copy of that code)."""
    return _fingerprint(fields, _plain_json(fields.body))


# The fields the fingerprint covers (all but ``key``), in the order of its sorted JSON.
_FINGERPRINTED = ("body", "callback_url", "delay", "execute_at", "flow_key", "headers",
                  "max_attempts", "method", "retry_backoff", "timeout")
# v3's result callbacks are folded in after that hash, and only when set (``_fingerprint``):
# a task without them keeps the fingerprint earlier builds stored.
_RESULT_FIELDS = frozenset({"on_success", "on_failure"})
# The models whose fingerprint _canonical_text writes from the attributes: exactly these
# fields, none excluded from the dump and no serializer of their own (ScheduleTask excludes
# two, so it is dumped). A field added to TaskFields takes both out until it is written there.
_BY_ATTRIBUTES = tuple(
    cls for cls in (TaskFields, TaskCreate)
    if sorted(set(cls.model_fields) - {"key"} - _RESULT_FIELDS) == list(_FINGERPRINTED)
    and not any(info.exclude for info in cls.model_fields.values())
    and not cls.__pydantic_decorators__.field_serializers
    and not cls.__pydantic_decorators__.model_serializers)
# json.dumps(..., separators=(",", ":"), ensure_ascii=False) with sort_keys (the fingerprint),
# and with allow_nan=False (the body as sent), made once: json.dumps builds its C encoder on
# every call, 1.3 us of the ~4 us a fingerprint's dump took. No circular-reference markers:
# only bodies _plain_json accepted (acyclic, depth-bounded) go through them, everything else
# through json.dumps as before.
# Pays for itself: with json.dumps in its place the service spent 14 % more CPU per task on
# `python -m bench.batch --tasks 50000 --concurrency 2` (bench/README.md, "What each mechanism
# pays for"). c_make_encoder is CPython's private accelerator: tests/test_library_internals.py
# checks that it is there and encodes as json.dumps does, so a Python that changes it fails CI.
def _json_encoder(*, sort_keys: bool, allow_nan: bool) -> Callable[[Any], str]:
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the pure-Python encoder json.dumps would use
        return json.JSONEncoder(sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False,
                                allow_nan=allow_nan, check_circular=False).encode
    chunks = make(None, None, encode_basestring, None, ":", ",", sort_keys, False, allow_nan)
    return lambda value: "".join(chunks(value, 0))


_canonical = _json_encoder(sort_keys=True, allow_nan=True)
_compact = _json_encoder(sort_keys=False, allow_nan=False)
_JSON_SCALARS = frozenset({str, int, bool, type(None)})
_JSON_CONTAINERS = frozenset({dict, list})
_MAX_PLAIN_DEPTH = 100


def _plain_json(value: Any) -> bool:
    """True when ``value`` is built only of exactly dict (str keys), list, str, int, bool,
    None and finite float, nested at most _MAX_PLAIN_DEPTH deep: what a request's JSON parses
    to. pydantic's JSON-mode dump of such a value is an equal value (nothing converted), and
    json.dumps needs neither ``default`` nor its circular-reference check for it."""
    if type(value) not in _JSON_CONTAINERS:
        return _plain_scalar(value)
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth >= _MAX_PLAIN_DEPTH:
            return False
        if type(node) is dict:
            if not all(type(key) is str for key in node):
                return False
            node = node.values()
        for item in node:
            kind = type(item)
            if kind in _JSON_CONTAINERS:
                stack.append((item, depth + 1))
            elif kind not in _JSON_SCALARS and not _plain_scalar(item):
                return False
    return True


def _plain_scalar(value: Any) -> bool:
    kind = type(value)
    return kind in _JSON_SCALARS or (kind is float and math.isfinite(value))


def _fingerprint(fields: TaskFields, plain: bool) -> str:
    """``fingerprint``; ``plain``: ``_plain_json(fields.body)``."""
    content = _content_fingerprint(fields, plain)
    results = encode_results(fields.on_success, fields.on_failure)
    if not results:
        return content
    return hashlib.sha256(f"{content}:results:{results}".encode()).hexdigest()


def _content_fingerprint(fields: TaskFields, plain: bool) -> str:
    """The fingerprint of everything but the result callbacks."""
    canonical = _canonical_text(fields) if plain and type(fields) in _BY_ATTRIBUTES else None
    if canonical is not None:
        try:
            return hashlib.sha256(canonical.encode()).hexdigest()
        except UnicodeEncodeError:  # a lone surrogate: fail as the original code fails
            pass
    # The original code, for anything the fast path does not take.
    content: dict[str, Any] = fields.model_dump(mode="json",
                                                exclude={"key", *_RESULT_FIELDS})
    if fields.execute_at is not None:
        content["execute_at"] = parse_execute_at(fields.execute_at)
    content["body_set"] = "body" in fields.model_fields_set
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _canonical_text(fields: TaskFields) -> str | None:
    """The fingerprint's canonical JSON written out field by field, or None if a value is not
    of the types this takes (then the caller dumps the model as before).

    It is the text json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) makes
    of model_dump(mode="json", exclude={"key"}) plus execute_at and body_set, for a model of
    _BY_ATTRIBUTES with a plain body (_plain_json): the keys in sorted order; each str through
    the encoder's own string function; each int and float as the encoder writes them
    (int.__repr__, float.__repr__ of a finite float); method, a StrEnum, dumps as its value;
    headers and body, already JSON values, through the same C encoder json.dumps uses. Dumping
    the model and encoding that dict took 6 us of a batched task's 9 us fingerprint (3.11's
    encoder costs ~0.3 us a key).

    Pays for itself: with the model dumped instead (the frozen code of tests/test_fingerprint.py)
    the service spent 15-17 % more CPU per task on `python -m bench.batch --tasks 50000
    --concurrency 2` (bench/README.md, "What each mechanism pays for")."""
    execute_at = fields.execute_at
    numbers = (fields.delay, None if execute_at is None else parse_execute_at(execute_at),
               fields.max_attempts, fields.retry_backoff, fields.timeout)
    texts = []
    for value in numbers:
        kind = type(value)
        if value is None:
            texts.append("null")
        elif kind is int:
            texts.append(int.__repr__(value))
        elif kind is float and math.isfinite(value):
            texts.append(float.__repr__(value))
        else:
            return None
    flow_key, method, headers = fields.flow_key, fields.method, fields.headers
    if (type(fields.callback_url) is not str or type(method) is not Method
            or type(headers) is not dict or (flow_key is not None and type(flow_key) is not str)):
        return None
    return "".join((
        '{"body":', _canonical(fields.body),
        ',"body_set":', "true" if "body" in fields.model_fields_set else "false",
        ',"callback_url":', encode_basestring(fields.callback_url),
        ',"delay":', texts[0], ',"execute_at":', texts[1],
        ',"flow_key":', "null" if flow_key is None else encode_basestring(flow_key),
        ',"headers":', _canonical(headers),
        ',"max_attempts":', texts[2], ',"method":', encode_basestring(method.value),
        ',"retry_backoff":', texts[3], ',"timeout":', texts[4], "}"))


def template_task(template: dict[str, Any], *, default_timeout: float) -> NewTask:
    """A schedule's task template validated and prepared as a POST /tasks body (execute_at 0),
    once per schedule version: its occurrences differ from it only in key, time and
    fingerprint (store/schedule_store.py ``occurrence_task``). Raises ValueError (pydantic's
    ValidationError) if the template does not validate."""
    fields = TaskFields.model_validate({**template, "execute_at": 0})
    return prepare(fields, "template", 0, default_timeout=default_timeout)

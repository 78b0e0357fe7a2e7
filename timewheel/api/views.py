"""The task view (docs/api.md "Task view", and v3: the request it sends): built here from the
store's domain record, so nothing under timewheel/store/ knows the API's models."""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi.responses import JSONResponse

from timewheel.delivery.retry_policy import NO_DEFAULTS
from timewheel.models import TaskView, format_ms
from timewheel.operations.records import TaskRecord

_JSON_TYPES = ("application/json",)


class FastJSONResponse(JSONResponse):
    """A JSONResponse encoded by orjson: a batch's 1,000 views took ~7 µs a task through
    ``json.dumps`` (py-spy; bench/README.md, "Packing, encoding and script text"). Same JSON
    values; what orjson refuses (an integer beyond 64 bits in a body) goes through json.dumps."""

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except orjson.JSONEncodeError:
            return super().render(content)


def task_view(record: TaskRecord) -> TaskView:
    """The API's view of a task. A record whose headers and body were left unread (a
    listing's byte budget) must not get here: the listing ends its page before it. Retry
    fields the task did not set come resolved to its flow's defaults
    (``TaskOperations.resolved``); one still unset shows the service's default."""
    headers = record.headers or []
    return TaskView(
        key=record.key, status=record.status, execute_at=_when(record.execute_at_ms),
        callback_url=record.callback_url, method=record.method, attempts=record.attempts,
        max_attempts=NO_DEFAULTS.max_attempts_for(record.max_attempts),
        next_attempt_at=format_ms(record.due_ms),
        last_attempt_at=format_ms(record.last_attempt_ms),
        last_status_code=record.last_status_code, last_error=record.last_error,
        created_at=_when(record.created_ms), finished_at=format_ms(record.finished_ms),
        headers=dict(headers), body=body_value(headers, record.body or b""),
        timeout=record.timeout_ms / 1000,
        retry_backoff=NO_DEFAULTS.backoff_ms_for(record.backoff_ms) / 1000,
        flow_key=record.flow, attempts_url=f"/tasks/{record.key}/attempts",
        on_success=record.on_success, on_failure=record.on_failure)


def body_value(headers: list[tuple[str, str]], body: bytes) -> Any:
    """The body as the view shows it: the JSON value when it is sent as JSON, else the text;
    None when there is none (no bytes and no Content-Type of its own)."""
    content_type = next((value for name, value in headers if name.lower() == "content-type"),
                        None)
    if not body and content_type is None:
        return None
    text = body.decode(errors="replace")  # bodies are stored from JSON text: UTF-8
    if content_type is not None and content_type.split(";")[0].strip().lower() in _JSON_TYPES:
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _when(ms: int) -> str:
    text = format_ms(ms)
    assert text is not None
    return text

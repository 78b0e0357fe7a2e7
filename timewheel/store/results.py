"""A result callback (docs/api.md v3, "Result callbacks") as the task lua/complete.lua creates.

The executor decides, with an attempt's outcome, what its result callback carries
(``ResultCallback``); ``Store.complete`` turns it into the record of the task
``{key}.on_success`` or ``{key}.on_failure`` at the very ``now_ms`` it passes to the script, so
the body's ``finished_at`` is the parent's ``finished_at``. The script creates that task in the
call that finishes the parent, in the parent's bucket (store/keys.py ``bucket_of``).

A result task is an ordinary task: POST to the URL, the parent's timeout, the defaults of
``POST /tasks`` for retries (5 attempts, 1 s backoff), its destination's flow, signed like any.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Literal

from timewheel.domain import format_ms
from timewheel.store.record import NewTask, default_flow

SUFFIX = {"ok": ".on_success", "fail": ".on_failure"}
MAX_ATTEMPTS = 5
BACKOFF_MS = 1000


@dataclass(frozen=True, slots=True)
class ResultCallback:
    """What an attempt that finished its task reports to the task's result callback."""

    url: str
    verdict: Literal["ok", "fail"]
    attempt: int
    status_code: int | None
    scheduled_at_ms: int
    timeout_ms: int
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b""  # already cut at TIMEWHEEL_RESULT_BODY_BYTES
    response_body_truncated: bool = False

    def payload(self, key: str, finished_ms: int) -> bytes:
        """The JSON body the result callback sends."""
        text = as_text(self.response_body, self.response_body_truncated)
        body: dict[str, object] = {
            "key": key, "outcome": "delivered" if self.verdict == "ok" else "failed",
            "attempt": self.attempt, "status_code": self.status_code,
            "response_headers": self.response_headers,
            "response_body": (text if text is not None
                              else base64.b64encode(self.response_body).decode()),
        }
        if text is None:
            body["response_body_base64"] = True
        body.update(response_body_truncated=self.response_body_truncated,
                    scheduled_at=format_ms(self.scheduled_at_ms),
                    finished_at=format_ms(finished_ms))
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    def task(self, key: str, finished_ms: int) -> NewTask:
        """The result task of the task ``key``, due at once."""
        return NewTask(
            key=key + SUFFIX[self.verdict], url=self.url, method="POST",
            headers=[("Content-Type", "application/json")],
            body=self.payload(key, finished_ms), due_ms=finished_ms,
            timeout_ms=self.timeout_ms, max_attempts=MAX_ATTEMPTS, backoff_ms=BACKOFF_MS,
            fingerprint=f"result:{key}{SUFFIX[self.verdict]}", flow=default_flow(self.url))


def as_text(body: bytes, truncated: bool) -> str | None:
    """The body as text when it is UTF-8 (a code point the cut left unfinished is dropped);
    None when it is not text."""
    try:
        return body.decode()
    except UnicodeDecodeError as exc:
        if truncated and exc.reason == "unexpected end of data":
            return body[:exc.start].decode()
        return None

"""Log output of ``timewheel serve``: text lines (the default) or one JSON object per line.

``TIMEWHEEL_LOG_FORMAT=text`` keeps the classic ``<time> <LEVEL> <logger>: <message>`` lines;
``json`` writes one object per line for log stores (Loki, Elasticsearch, Cloud Logging...)::

    {"time": "2026-11-22T10:00:00.123Z", "level": "INFO", "logger": "timewheel.engine.executor",
     "message": "callback invoice-42 attempt=2 503 0.041s -> retry",
     "task_key": "invoice-42", "flow_key": "api.example.com:443", "attempt": 2,
     "status_code": 503, "duration_ms": 41.2, "outcome": "retry", "error": "HTTP 503"}

Structured fields: code keeps its one readable %-style message per event (STYLE.md) and passes
the machine-readable parts through ``extra=``; the JSON formatter writes every such field as a
top-level key, the text formatter leaves them out (so text lines do not change). Use these names,
so that one query works across every log line of the service:

==================  =========  ===========================================================
``task_key``        str        the task's key
``flow_key``        str        the flow the attempt counts against
``attempt``         int        1, 2, 3, ... (the ``timewheel-attempt`` header's value)
``status_code``     int        the receiver's HTTP status; null when no answer came
``duration_ms``     float      how long the attempt took, in milliseconds
``outcome``         str        ``ok``, ``retry`` or ``fail`` for a callback
``error``           str        null for ``ok``; ``HTTP <status>`` for another answer; the error
                               kind and text when there was no answer
``request_id``      str        set for every record logged while an API request is served
==================  =========  ===========================================================

For example: ``log.info("callback %s attempt=%d %s %.3fs -> %s", key, attempt, code, took,
verdict, extra={"task_key": key, "attempt": attempt, "status_code": code,
"duration_ms": took * 1000, "outcome": verdict})``.

``request_id`` is not passed by hand: :class:`timewheel.api.request_id.RequestId` binds it in
:data:`REQUEST_ID` for the duration of a request, and :class:`RequestIdFilter` (installed on
the handler by :func:`configure_logging`) copies it onto every record emitted meanwhile.

Never log secrets. As a second line of defence the JSON formatter replaces the value of any
structured field whose name looks secret (contains ``token``, ``secret``, ``password``,
``passwd``, ``authorization``, ``cookie`` or ``api_key``: ``SECRET_WORDS``) with
``"[redacted]"``; settings themselves are pydantic ``SecretStr`` values, which render as
``**********`` in either format.

Library choice: python-json-logger, a formatter for the standard library's logging. Every
module of the package already logs through ``logging.getLogger(__name__)`` with %-style
messages, and so do uvicorn, redis-py and aiohttp; a formatter turns all of them into JSON
without changing a call site. structlog's stdlib integration would get there too, but through a
processor chain around the same stdlib records, more to configure and more per-record work on
a path that logs at thousands of callbacks a second.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Hashable
from contextvars import ContextVar
from typing import IO, Any, Literal

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

REQUEST_ID: ContextVar[str | None] = ContextVar("timewheel_request_id", default=None)
"""The id of the API request being served in this context (None outside requests)."""

# The documented structured fields, in the order a reader expects them.
FIELDS = ("task_key", "flow_key", "attempt", "status_code", "duration_ms", "outcome", "error",
          "request_id")

SECRET_WORDS = ("token", "secret", "password", "passwd", "authorization", "cookie", "api_key")
REDACTED = "[redacted]"

# uvicorn adds an ANSI-coloured copy of some messages as `color_message`: noise in JSON.
_SKIPPED = frozenset(RESERVED_ATTRS) | {"color_message"}


class RequestIdFilter(logging.Filter):
    """Copies the current request id (if any) onto each record as ``record.request_id``.

    Installed on the handler rather than on a logger: a logger's filters only see records
    logged on that very logger, a handler's see every record that reaches it."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        return True


class TimewheelJsonFormatter(JsonFormatter):
    """JSON lines with ``time`` (RFC 3339 UTC, milliseconds, as in API responses), ``level``,
    ``logger``, ``message``, then every structured field, with secret-looking ones redacted."""

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            reserved_attrs=sorted(_SKIPPED),
            json_ensure_ascii=False,
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{seconds}.{int(record.msecs):03d}Z"

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        for key in log_data:
            if _looks_secret(key):
                log_data[key] = REDACTED
        return log_data


class LogOnce:
    """Which conditions were logged already, so that one a poll meets every time (the
    dashboard lists schedules and topics every few seconds) is logged once per process rather
    than once per poll. Bounded: past ``limit`` conditions it forgets them all, so a line
    repeats at worst once every ``limit`` others."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._seen: set[Hashable] = set()

    def first(self, condition: Hashable) -> bool:
        """True the first time ``condition`` is met (log it then), False after."""
        if condition in self._seen:
            return False
        if len(self._seen) >= self.limit:
            self._seen.clear()
        self._seen.add(condition)
        return True


def _looks_secret(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in SECRET_WORDS)


def make_formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``fmt`` (``text`` or ``json``)."""
    if fmt == "json":
        return TimewheelJsonFormatter()
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"unknown log format {fmt!r}: expected 'text' or 'json'")


def configure_logging(level: str, fmt: LogFormat, *, stream: IO[str] | None = None) -> None:
    """Send every log record (the package's, uvicorn's, libraries') to ``stream`` (stderr by
    default) in format ``fmt``, at ``level`` and above.

    Called once by ``timewheel serve``; the package itself never configures logging, so an
    application embedding ``create_app`` keeps its own setup (and may call this too). Calling it
    again replaces the handler it installed before, so tests can switch formats.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(make_formatter(fmt))
    handler.addFilter(RequestIdFilter())
    handler.set_name("timewheel")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "timewheel"]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())

"""The soak's history: every client operation, every arrival at the receiver, every fault and
every serve process, one JSON object per line, appended as it happens (Jepsen-style).

Record types (the ``type`` field), all times Unix seconds from ``time.time()`` on this host:

- ``meta``: the run's settings (task timeout, lease margin, tick, bound, seed, ...).
- ``op``: one client operation. ``op`` is ``create`` (POST, batch item or PUT of a new key),
  ``replace`` (PUT of a key the load created before), ``cancel`` (DELETE /tasks/{key}),
  ``schedule_put`` or ``schedule_delete``; ``t0`` when it was sent, ``t1`` when its answer
  (or its failure) came back, ``status`` the HTTP status (or the batch item's), ``None`` when
  no answer came (connection refused, timeout); ``requested_at`` the execute_at the client
  asked for, ``execute_at`` the one the service acknowledged (from its task view).
- ``arrival``: one callback at the receiver: ``t``, ``key`` (webhook-id), ``attempt``,
  ``scheduled_at`` (parsed ``timewheel-scheduled-at``), ``answered`` (the status written back;
  0 = held past the task timeout, never answered in time), ``pid`` of the sending process.
- ``fault``: ``kind``, ``target``, ``start``, ``end``, ``detail``.
- ``proc``: one serve process incarnation: ``name``, ``pid``, ``start``, ``end``, ``ended``.
- ``late_write``: an attempt its process logged as written after its send-by (it was paused
  between the last check and the write): ``pid``, ``key``, ``attempt``, ``late_ms``; read
  from the processes' logs when the run ends (``logged_late_writes``).
- ``timed_out``: an attempt its process logged as timed out (no answer within the task's
  timeout; retried unless it was the last): ``pid``, ``key``, ``attempt``, ``t`` (the log
  line's time); read the same way (``logged_timeouts``).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

Event = dict[str, Any]


class History:
    """Append-only and thread-safe (the receiver runs on its own thread); kept in memory too."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._file = path.open("w", buffering=1)  # line-buffered: a crash keeps what happened

    def add(self, type_: str, **fields: Any) -> Event:
        event = {"type": type_, **fields}
        line = json.dumps(event)
        with self._lock:
            self._events.append(event)
            self._file.write(line + "\n")
        return event

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read(path: Path) -> list[Event]:
    return list(_lines(path))


def _lines(path: Path) -> Iterator[Event]:
    with path.open() as fh:
        for line in fh:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:  # blank, or the last line still being written
                continue


# timewheel/engine/last_check.py ``LastCheck.written``: its message, in either log format.
# Only a write whose last check said yes by the send-by: one with no such check is a bug.
_LATE_WRITE = re.compile(r"callback (\S+) attempt=(\d+) written (\d+) ms after its send-by; "
                         r"its last check, \d+ ms before the send-by, said yes")


def late_writes(lines: Iterable[str]) -> Iterator[tuple[str, int, int]]:
    """(key, attempt, ms after its send-by) of each write a serve process logged as late."""
    for line in lines:
        if "after its send-by" in line and (found := _LATE_WRITE.search(line)):
            yield found[1], int(found[2]), int(found[3])


def _log_lines(log_path: Path, start: int = 0, end: int | None = None) -> list[str]:
    """The lines of a serve process's log file, its bytes from ``start`` to ``end`` (None: the
    file's end); none if there is no file."""
    if not log_path.exists():
        return []
    with log_path.open("rb") as fh:
        fh.seek(start)
        data = fh.read() if end is None else fh.read(max(0, end - start))
    return data.decode(errors="replace").splitlines()


def logged_late_writes(log_path: Path, start: int = 0,
                       end: int | None = None) -> list[tuple[str, int, int]]:
    """``late_writes`` of a serve process's log file (see ``_log_lines``)."""
    return list(late_writes(_log_lines(log_path, start, end)))


# timewheel/engine/executor.py's outcome line of an attempt with no answer in time
# ("callback KEY attempt=N timeout: no answer within 2s 2.001s -> retry"), in the text format,
# whose line starts with the local time (logs.py TEXT_FORMAT: "2026-11-27 21:26:10,376 ...").
_TIMED_OUT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*callback (\S+) "
                        r"attempt=(\d+) timeout: ")


def timeouts(lines: Iterable[str]) -> Iterator[tuple[str, int, float]]:
    """(key, attempt, Unix time of the line) of each attempt a serve process logged as timed
    out (the soak's serve processes log text)."""
    for line in lines:
        if " timeout: " in line and (found := _TIMED_OUT.search(line)):
            # the service logs its local time, as this host reads it
            at = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").astimezone().timestamp()
            yield found[2], int(found[3]), at


def logged_timeouts(log_path: Path, start: int = 0,
                    end: int | None = None) -> list[tuple[str, int, float]]:
    """``timeouts`` of a serve process's log file (see ``_log_lines``)."""
    return list(timeouts(_log_lines(log_path, start, end)))

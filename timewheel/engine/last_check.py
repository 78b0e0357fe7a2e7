"""The sender's last check before an attempt's request is written, and what a write past the
attempt's send-by logs (bench/soak_history.py reads that line)."""

from __future__ import annotations

import logging

from timewheel.clock import Clock
from timewheel.engine.attempt import Attempt

log = logging.getLogger(__name__)


class LastCheck:
    """An attempt's last check before its request is written (``ready``), and the sender's
    word that it was written (``written``). Written after its send-by, the answer may come
    after the lease ran out and another process sent the task too: the process was paused
    (SIGSTOP, a CPU it did not get) between a check that said yes in time and the write, a
    window no check in user space can close (bench/README.md, "What the soak found"). That
    write is logged with both times, so the duplicate it may cause has its cause on record; a
    write past the send-by with no check in time before it would be a bug, and says so."""

    __slots__ = ("_attempt", "_checked_ms", "_clock", "_write_by")

    def __init__(self, clock: Clock, attempt: Attempt, write_by: int) -> None:
        self._clock, self._attempt, self._write_by = clock, attempt, write_by
        self._checked_ms: int | None = None  # when it last said yes

    def ready(self) -> bool:
        now = self._clock.now_ms()
        if now > self._write_by:
            return False
        self._checked_ms = now
        return True

    def written(self) -> None:
        attempt = self._attempt
        late_ms = self._clock.now_ms() - attempt.send_by_ms
        if late_ms <= 0:
            return
        task, number = attempt.task, attempt.started.attempt if attempt.started else 0
        fields = {"task_key": task.key, "attempt": number}
        if self._checked_ms is None or self._checked_ms > attempt.send_by_ms:
            log.error("callback %s attempt=%d written %d ms after its send-by with no last "
                      "check in time before it (a bug): another process may send it too",
                      task.key, number, late_ms, extra=fields)
            return
        log.warning("callback %s attempt=%d written %d ms after its send-by; its last check, "
                    "%d ms before the send-by, said yes (paused between the check and the "
                    "write): another process may send it too", task.key, number, late_ms,
                    attempt.send_by_ms - self._checked_ms, extra=fields)

"""One attempt on the wire: the request it sends, and what its answer means.

``Executor.send`` builds the callback's headers (Standard Webhooks id, timestamp and
signature; attempt number; scheduled time), sends it under the attempt's timeout and returns
the attempt's ``Outcome``, decided as a plain value: delivered, retry (with the next attempt's
time) or failed, with the history entry that lua/complete.lua appends, and, when the outcome
finishes a task that has a result callback for it, what that callback reports. It never
writes to Redis: timewheel/engine/recorder.py does that, in batches.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

from timewheel import __version__
from timewheel.clock import Clock
from timewheel.delivery.retry_policy import classify_status, next_due_ms
from timewheel.delivery.senders import Answer, Sender, SendError
from timewheel.delivery.signing import Signer
from timewheel.domain import format_ms
from timewheel.engine.attempt import Attempt
from timewheel.metrics import Metrics
from timewheel.store import Outcome, attempts
from timewheel.store.encryption import Cipher
from timewheel.store.record import Started
from timewheel.store.results import ResultCallback
from timewheel.tracing import Tracing, record_callback

log = logging.getLogger(__name__)

USER_AGENT = f"timewheel/{__version__}"
MAX_ERROR_CHARS = 500
PROCESS = f"{socket.gethostname()}:{os.getpid()}"  # an attempt's "process" in its history


class Executor:
    def __init__(self, clock: Clock, sender: Sender, metrics: Metrics, *,
                 signer: Signer | None, tracing: Tracing, log_deliveries: bool = False,
                 cipher: Cipher | None = None) -> None:
        self._clock = clock
        self._sender = sender
        self._metrics = metrics
        self._signer = signer
        self._tracing = tracing
        self._cipher = cipher  # seals the response body kept in the history (encryption.py)
        # Successes at DEBUG unless asked for: at thousands a second, a line each costs CPU.
        self._ok_level = logging.INFO if log_deliveries else logging.DEBUG
        self._outcome_counters = {"ok": metrics.outcomes["succeeded"],
                                  "retry": metrics.outcomes["retried"],
                                  "fail": metrics.outcomes["failed"]}

    async def send(self, attempt: Attempt, timeout_ms: int, ready: Callable[[], bool],
                   written: Callable[[], None] | None = None) -> Outcome:
        """Send the started attempt with the headers and body that lua/start.lua read (a claim
        carries no body: what is sent is what is stored at start), and decide its outcome.
        ``ready`` is asked once its connection is ready, just before the request is written;
        False raises NotWritten (nothing was written). ``written``: the sender calls it right
        after the write, if it can see that moment (Sender.send)."""
        task, started = attempt.task, attempt.started
        assert started is not None
        started_ms = self._clock.wall_ms()
        headers = self.headers(attempt, started, int(started_ms // 1000))
        answer: Answer | None = None
        error: SendError | None = None
        with self._tracing.callback_span(task.key, started.attempt, task.method,
                                         task.url) as span:
            try:
                if started.on_success or started.on_failure:
                    # Only a task with a result callback keeps its answer's body whole (up to
                    # TIMEWHEEL_RESULT_BODY_BYTES): the others pay nothing for the feature.
                    answer = await self._sender.send(
                        task.method, task.url, headers, started.body or None,
                        timeout_ms / 1000.0, ready=ready,
                        keep_body=max(self._sender.keep_body, self._sender.result_body),
                        written=written)
                else:
                    answer = await self._sender.send(
                        task.method, task.url, headers, started.body or None,
                        timeout_ms / 1000.0, ready=ready, written=written)
            except SendError as exc:
                error = exc
            # Only once written (NotWritten passed by): an attempt held back counts once.
            (self._metrics.lateness_first if started.attempt == 1
             else self._metrics.lateness_retry).observe(
                (started_ms - max(task.due_ms, task.created_ms)) / 1000.0)
            took_ms = self._clock.wall_ms() - started_ms
            self._metrics.duration.observe(took_ms / 1000.0)
            outcome = self.decide(attempt, answer, error, int(started_ms), took_ms)
            record_callback(span, status_code=outcome.status_code, outcome=outcome.kind,
                            error=outcome.error)
        return outcome

    def set_aside(self, attempt: Attempt) -> Outcome:
        """The outcome of a started attempt whose record this process cannot open
        (``Started.unsendable``): failed at its time, never sent, with the reason as its
        last_error and in its history, and its on_failure called; replayable once the key
        is listed."""
        task, started = attempt.task, attempt.started
        assert started is not None and started.unsendable is not None
        now_ms = int(self._clock.wall_ms())
        message = started.unsendable[:MAX_ERROR_CHARS]
        log.error("task %s cannot be sent, failing it: %s", task.key, message)
        self._outcome_counters["fail"].inc()
        history = attempts.entry(
            attempt=started.attempt, started_ms=now_ms, duration_ms=0, verdict="fail",
            status_code=None, error=message, headers=None, body=None, body_truncated=False,
            next_attempt_ms=None, process=PROCESS)
        return Outcome(task.key, task.token, "fail", None, message, None, now_ms, history,
                       self.result(attempt, "fail", None))

    def headers(self, attempt: Attempt, started: Started,
                timestamp: int) -> list[tuple[str, str]]:
        task = attempt.task
        headers = [*started.headers,
                   ("webhook-id", task.key),
                   ("webhook-timestamp", str(timestamp)),
                   ("timewheel-attempt", str(started.attempt)),
                   ("timewheel-scheduled-at", format_ms(task.execute_at_ms) or ""),
                   ("User-Agent", USER_AGENT)]
        if self._signer is not None:
            headers.append(("webhook-signature",
                            self._signer.sign(task.key, timestamp, started.body)))
        return headers

    def decide(self, attempt: Attempt, answer: Answer | None, error: SendError | None,
               started_ms: int, took_ms: float) -> Outcome:
        """What the answer (or the error) means for the task: a pure decision."""
        task, number = attempt.task, attempt.started.attempt if attempt.started else 0
        now = self._clock.now_ms()
        if answer is not None:
            verdict = classify_status(answer.status)
            code: int | None = answer.status
            message = None if verdict == "ok" else f"HTTP {answer.status}"
            retry_after = answer.retry_after
        else:
            assert error is not None
            verdict = "fail" if error.kind == "blocked" else "retry"
            code, message, retry_after = None, f"{error.kind}: {error}"[:MAX_ERROR_CHARS], None
        # The task's own retry fields win; else its flow's defaults as of its permit.
        retry = attempt.retry
        spent = verdict == "retry" and number >= retry.max_attempts_for(task.max_attempts)
        if spent:
            verdict = "fail"
        next_ms = (next_due_ms(now, retry.backoff_ms_for(task.backoff_ms), number, retry_after,
                               cap_ms=retry.cap_ms)
                   if verdict == "retry" else None)
        level = self._ok_level if verdict == "ok" else logging.INFO
        if log.isEnabledFor(level):  # not even the extra dict for a line nobody reads
            log.log(level, "callback %s attempt=%d %s %.3fs -> %s", task.key, number,
                    code if code is not None else message, took_ms / 1000.0, verdict,
                    extra={"task_key": task.key, "flow_key": task.flow, "attempt": number,
                           "status_code": code, "duration_ms": round(took_ms, 1),
                           "outcome": verdict, "error": message})
        self._outcome_counters[verdict].inc()
        keep = self._sender.keep_body  # the answer may carry more, for a result callback
        # An empty answer is "" (as in a result callback); null is no answer, or none kept.
        body = (answer.body[:keep].decode(errors="replace")
                if answer is not None and keep > 0 else None)
        history = attempts.entry(
            attempt=number, started_ms=started_ms, duration_ms=round(took_ms),
            # An answer is data (its status code), not an error: error names no answer.
            verdict=verdict, status_code=code, error=message if answer is None else None,
            headers=answer.headers if answer is not None else None,
            body=body,  # cut only where an excerpt is kept (0 keeps none: nothing cut)
            body_truncated=answer is not None and keep > 0 and (answer.body_truncated
                                                                or len(answer.body) > keep),
            next_attempt_ms=next_ms, process=PROCESS, key=task.key, cipher=self._cipher)
        return Outcome(task.key, task.token, verdict, code, message, next_ms, started_ms,
                       history, self.result(attempt, verdict, answer), spent)

    def result(self, attempt: Attempt, verdict: str, answer: Answer | None
               ) -> ResultCallback | None:
        """What the task's result callback reports, if this outcome finishes the task and the
        task has one for it (on_success for delivered, on_failure for failed)."""
        started = attempt.started
        if started is None or verdict == "retry":
            return None
        url = started.on_success if verdict == "ok" else started.on_failure
        if not url:
            return None
        limit = self._sender.result_body
        return ResultCallback(
            url=url, verdict="ok" if verdict == "ok" else "fail", attempt=started.attempt,
            status_code=answer.status if answer is not None else None,
            scheduled_at_ms=attempt.task.execute_at_ms, timeout_ms=attempt.task.timeout_ms,
            response_headers=answer.headers if answer is not None else {},
            response_body=answer.body[:limit] if answer is not None else b"",
            response_body_truncated=answer is not None and (answer.body_truncated
                                                            or len(answer.body) > limit))

"""Models of ``GET /tasks/{key}/attempts`` (docs/api.md v3, "The task view shows the request, and
every attempt")."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


class AttemptOutcome(StrEnum):
    DELIVERED = "delivered"  # a 2xx answer
    RETRY = "retry"  # will be tried again
    FAILED = "failed"  # no more attempts, or an answer that is never retried
    LOST = "lost"  # its process died or stalled: found by lease expiry, tried again
    CANCELLED = "cancelled"  # a DELETE stopped it before it was sent


class AttemptView(BaseModel):
    """One attempt of a task, as the API shows it. Times are RFC 3339 UTC with milliseconds;
    a field the attempt never had (no answer, never started) is null."""

    attempt: int = Field(description="the attempt's number, 1 for the first")
    started_at: str | None = Field(description="when the request went out")
    duration_ms: int | None = Field(description="from sending the request to its outcome")
    outcome: AttemptOutcome
    status_code: int | None = Field(description="the answer's HTTP status")
    error: str | None = Field(description="a connection error, timeout or refusal, in words")
    response_headers: dict[str, str] | None = Field(
        description="content-type, content-length, retry-after, location and an id header "
                    "of the answer; at most 10, values cut at 200 bytes")
    response_body: str | None = Field(description="the first bytes of the answer, as text "
                                      "(TIMEWHEEL_ATTEMPT_BODY_BYTES)")
    response_body_truncated: bool = Field(description="the answer was longer than the excerpt")
    next_attempt_at: str | None = Field(description="when the task is tried again (retry)")
    process: str | None = Field(description="the process that made the attempt, host:pid")


class AttemptList(BaseModel):
    """The kept attempts of a task (the last TIMEWHEEL_ATTEMPTS_KEPT), oldest first."""

    attempts: list[AttemptView]

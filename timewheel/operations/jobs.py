"""Bulk job operations: what ``POST /tasks/cancel``, ``POST /tasks/replay`` and
``GET /jobs/{id}`` do, without HTTP. The job itself is worked by the runners
(timewheel/jobs/runner.py) of every process."""

from __future__ import annotations

import secrets

from timewheel.clock import Clock
from timewheel.errors import InvalidInput, JobNotFound
from timewheel.jobs.sources import ACTS_ON
from timewheel.models.jobs import JobFilter, JobKind
from timewheel.store.job_store import JobRecord, JobStore


class JobOperations:
    def __init__(self, jobs: JobStore, clock: Clock) -> None:
        self.jobs = jobs
        self.clock = clock

    async def start(self, kind: JobKind, job_filter: JobFilter) -> str:
        """Record a new job (its runners start on it within a tick or so): its id. A status
        the kind cannot act on is refused before anything is stored."""
        status = job_filter.status
        if status is not None and status not in ACTS_ON[kind.value]:
            acts = ", ".join(s.value for s in ACTS_ON[kind.value])
            raise InvalidInput(("body", "status"),
                               f"a {kind.value} job acts on tasks that are {acts}", status.value)
        job_id = secrets.token_hex(8)
        await self.jobs.create(job_id, kind.value,
                               job_filter.model_dump_json(exclude_none=True),
                               now_ms=self.clock.now_ms())
        return job_id

    async def get(self, job_id: str) -> JobRecord:
        job = await self.jobs.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

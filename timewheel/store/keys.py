"""Redis key names. All keys of one task live under one ``{hash tag}``: its bucket's.

    bucket = crc32(task key) % buckets       (buckets is fixed per wheel and stored in Redis)
    except for a result callback's key, "<parent>.on_success" / "<parent>.on_failure", whose
    bucket is its parent's: lua/complete.lua creates it in the step that finishes the parent
    prefix = "{<key_prefix>:<bucket>}:"

Under a bucket prefix P (the Lua scripts derive these from P, see lua/claim.lua), layout 2:

    P t:<key>       string the task record (timewheel/store/layout.py)
    P a:<key>       list   the task's attempt history, once tried (lua/lib/attempts.lua)
    P r:<key>       string its result callbacks' URLs, only when it has any (lua/lib/results.lua)
    P ms:<minute>   zset   the minute slice: task key -> due_ms
    P md:<minute>   set    the minute's delete-set (cancelled or moved away)
    P mn            zset   minutes that have a slice (claim and listing skip empty minutes)
    P cur           string oldest minute that may still hold entries
    P ls            zset   claimed task key -> lease expiry ms (and a cancelled or PATCHed
                           task's whose attempt is still out: claim.lua records it lost
                           when none answers), and INDEX_KEEPER (below)
    P cl:<token>    list   keys one claim call took (lets a retried call return the same)
    P pw:<flow>     zset   the flow's parked tasks: task key -> due_ms (lua/park.lua)
    P pf            zset   flows with parked tasks -> due_ms of their earliest
    P pa            zset   every parked task of the bucket -> due_ms (listings)
    P fs, ff        zset   succeeded, failed (the dead letters): key -> finished ms, and
                           INDEX_KEEPER
    P fc:<start>    zset   a page of the cancelled index: key -> finished ms, for the finished
                           times from <start> (ms) up to the next page's start (lua/lib/record.lua)
    P fcp           zset   the cancelled index's pages: <start> -> <start>
    P fc            zset   the cancelled index as written before it had pages, and
                           INDEX_KEEPER: still read, trimmed and removed from until it empties
    P j:<job id>    hash   a bulk job's position and counts in this bucket (lua/job_step.lua)

Layout 1 used other names for every index (m:, d:, cursor, lease, c:, w:, wf, dead) and a hash
per record: timewheel/store/migrate.py converts a wheel written by it.

A flow's own keys share the flow's hash tag, "{<key_prefix>:f:<flow key>}:" (F below):

    F cfg          hash   set by PUT /flows: p parallelism, r rate, x paused ("1"), ma, rb,
                          mb retry defaults (attempts, backoff ms, max backoff ms)
    F held         zset   permits in use: permit id -> lease expiry ms, and INDEX_KEEPER
    F starts       zset   starts within the rate window: permit id -> ms (only with a rate)

Bulk jobs share one hash tag, "{<key_prefix>:jobs}:" (J below; lua/job_create.lua):

    J j:<job id>   hash   kind, filter, state, started, finished, the lease holder
    J running      zset   running jobs: job id -> lease expiry ms

and ``<key_prefix>:flows`` is the set of flows with limits set (for listings and metrics);
``<key_prefix>:ticks`` (zset process id -> its last tick, ms) spreads the processes' ticks
over the tick period (timewheel/engine/tick_phase.py); ``<key_prefix>:key-ids`` (hash process
id -> "<ms> <its encryption key ids>") lets each process see whether the others can open what it
seals (timewheel/engine/key_lists.py); ``<key_prefix>:sched:pass`` (string,
ms) is the schedules' last materializer pass, any process's, kept a day
(timewheel/store/schedule_store.py ``mark_pass``; schedules' own keys: docs/design.md).
The processes' counts of attempts waiting in memory for their flow share one hash tag,
"{<key_prefix>:wl}:" (lua/waiting_report.lua): ``live`` (zset process id -> expiry ms) and
``p:<process id>`` (hash flow -> count).

Topics share one hash tag, "{<key_prefix>:topics}:" (lua/topic_put.lua lists its keys); a
publish's record is in the bucket of its key, P pb:<publish key> (lua/publish.lua).

On a Redis Cluster each bucket is one hash slot, so a minute's load spreads over the cluster
while every script still touches a single slot.
"""

from __future__ import annotations

import zlib

from timewheel.domain import result_parent

DEFAULT_BUCKETS = 16

# The one member of the lease, finished and permit indexes that is no task or permit ('#' is
# outside KEY_PATTERN): it keeps ``ls``, ``fs``, ``ff``, ``fc`` and a flow's ``held`` skiplists
# (lua/lib/record.lua
# INDEX_KEEPER, which must spell it the same; a test reads it back from Redis). Nothing in the
# service lists it: lease ranges, listings and bulk jobs pass over it, and counts leave it out.
# Named here for what reads those indexes directly (counts, tests, tools).
INDEX_KEEPER = "#keeps-the-lease-index-a-skiplist#" + "#" * 222
INDEX_KEEPER_SCORE = 2**53 - 1
FINISHED_INDEX = {"succeeded": "fs", "failed": "ff", "cancelled": "fc"}


class Keyspace:
    def __init__(self, key_prefix: str, buckets: int = DEFAULT_BUCKETS) -> None:
        self.key_prefix = key_prefix
        self.buckets = buckets
        self._prefixes = [f"{{{key_prefix}:{b}}}:" for b in range(buckets)]

    @property
    def buckets_key(self) -> str:
        """Where the wheel's bucket count is stored (outside any bucket)."""
        return f"{self.key_prefix}:buckets"

    @property
    def ticks(self) -> str:
        """The processes' last tick times (timewheel/engine/tick_phase.py)."""
        return f"{self.key_prefix}:ticks"

    @property
    def key_ids(self) -> str:
        """Each process's encryption key ids (timewheel/engine/key_lists.py)."""
        return f"{self.key_prefix}:key-ids"

    def bucket_of(self, task_key: str) -> int:
        # A result callback's task shares its parent's slot, so that the script finishing the
        # parent can create it (docs/design.md, "Result callbacks").
        parent = result_parent(task_key)
        return zlib.crc32((parent or task_key).encode()) % self.buckets

    def prefix(self, bucket: int) -> str:
        return self._prefixes[bucket]

    def task(self, task_key: str) -> str:
        return f"{self.prefix(self.bucket_of(task_key))}t:{task_key}"

    def claim_call(self, bucket: int, token: str) -> str:
        """The keys one claim call took, under its token (lua/claim.lua)."""
        return f"{self.prefix(bucket)}cl:{token}"

    def attempts(self, bucket: int, task_key: str) -> str:
        """The task's attempt history (lua/lib/attempts.lua)."""
        return f"{self.prefix(bucket)}a:{task_key}"

    def results(self, bucket: int, task_key: str) -> str:
        """The URLs of the task's result callbacks (lua/lib/results.lua)."""
        return f"{self.prefix(bucket)}r:{task_key}"

    def slice(self, bucket: int, minute: int) -> str:
        return f"{self.prefix(bucket)}ms:{minute}"

    def delete_set(self, bucket: int, minute: int) -> str:
        return f"{self.prefix(bucket)}md:{minute}"

    def minutes(self, bucket: int) -> str:
        return f"{self.prefix(bucket)}mn"

    def cursor(self, bucket: int) -> str:
        return f"{self.prefix(bucket)}cur"

    def lease(self, bucket: int) -> str:
        return f"{self.prefix(bucket)}ls"

    def finished(self, bucket: int, status: str) -> str:
        """The index of finished tasks of one status (succeeded, failed; cancelled: the zset
        from before the cancelled index had pages)."""
        return f"{self.prefix(bucket)}{FINISHED_INDEX[status]}"

    def cancelled_pages(self, bucket: int) -> str:
        """The directory of the cancelled index's pages: each page's start, ms."""
        return f"{self.prefix(bucket)}fcp"

    def cancelled_page(self, bucket: int, start: int | str) -> str:
        """A page of the cancelled index, from its start (ms) up to the next page's."""
        return f"{self.prefix(bucket)}fc:{start}"

    def dead(self, bucket: int) -> str:
        """The dead letters: the failed tasks' index."""
        return self.finished(bucket, "failed")

    def waiting(self, bucket: int, flow: str) -> str:
        return f"{self.prefix(bucket)}pw:{flow}"

    def waiting_flows(self, bucket: int) -> str:
        return f"{self.prefix(bucket)}pf"

    def parked(self, bucket: int) -> str:
        """Every parked task of the bucket, by due time (for listings)."""
        return f"{self.prefix(bucket)}pa"

    def flow(self, flow: str) -> str:
        """The prefix of a flow's own keys: one hash slot per flow."""
        return f"{{{self.key_prefix}:f:{flow}}}:"

    @property
    def topics(self) -> str:
        """The prefix of every topic's keys: one hash slot (lua/topic_put.lua)."""
        return f"{{{self.key_prefix}:topics}}:"

    @property
    def jobs(self) -> str:
        """The prefix of the bulk jobs' keys: one hash slot for all of them."""
        return f"{{{self.key_prefix}:jobs}}:"

    def job(self, job_id: str) -> str:
        return f"{self.jobs}j:{job_id}"

    def job_state(self, bucket: int, job_id: str) -> str:
        """A bulk job's position and counts in one bucket."""
        return f"{self.prefix(bucket)}j:{job_id}"

    @property
    def configured_flows(self) -> str:
        return f"{self.key_prefix}:flows"

    @property
    def waiting_reports(self) -> str:
        """The prefix of every process's waiting report (one hash slot for all)."""
        return f"{{{self.key_prefix}:wl}}:"

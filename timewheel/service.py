"""Wheel: the parts of one ``timewheel serve`` process, built from Settings, started and
stopped in order (embedded Redis first and last). The operations the API calls are
timewheel/operations/ (``wheel.tasks``, ``wheel.flows``, ``wheel.schedules``, ...); this module
only wires."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from timewheel import __version__
from timewheel.clock import Clock, RedisClock
from timewheel.delivery.netguard import NetworkPolicy
from timewheel.delivery.senders import Sender, make_sender
from timewheel.delivery.signing import Signer
from timewheel.engine.dispatcher import Dispatcher
from timewheel.engine.key_lists import KeyListCheck
from timewheel.engine.materializer import Materializer
from timewheel.engine.publish_sweeper import PublishSweeper
from timewheel.engine.tick_phase import TickPhases
from timewheel.engine.ticker import Ticker, claim_tokens
from timewheel.errors import StoreUnavailable, WheelMismatch
from timewheel.jobs.runner import JobRunner
from timewheel.loops import stop_loop
from timewheel.metrics import Metrics
from timewheel.operations.flows import FlowOperations
from timewheel.operations.jobs import JobOperations
from timewheel.operations.schedules import ScheduleOperations, schedule_store
from timewheel.operations.stats import StatsOperations
from timewheel.operations.tasks import TaskLimits, TaskOperations
from timewheel.operations.topics import TopicOperations
from timewheel.settings import Settings
from timewheel.store import Store
from timewheel.store.connection import bucket_spread, make_redis
from timewheel.store.durability import Durability
from timewheel.store.embedded import DataDirInUse, EmbeddedRedis
from timewheel.store.flow_store import FlowStore
from timewheel.store.job_store import JobStore
from timewheel.store.publish import Publisher
from timewheel.store.redis_errors import redis_errors
from timewheel.store.schedule_store import ScheduleStore
from timewheel.store.topic_store import TopicStore
from timewheel.tracing import Tracing

log = logging.getLogger(__name__)


@dataclass
class Wheel:
    settings: Settings
    policy: NetworkPolicy
    metrics: Metrics
    redis: Redis | RedisCluster
    store: Store
    clock: Clock
    dispatcher: Dispatcher
    flow_store: FlowStore
    ticker: Ticker
    sender: Sender
    embedded: EmbeddedRedis | None = None
    schedule_store: ScheduleStore = field(init=False, repr=False)
    tasks: TaskOperations = field(init=False, repr=False)
    flows: FlowOperations = field(init=False, repr=False)
    stats: StatsOperations = field(init=False, repr=False)
    schedules: ScheduleOperations = field(init=False, repr=False)
    topics: TopicOperations = field(init=False, repr=False)
    materializer: Materializer = field(init=False, repr=False)
    sweeper: PublishSweeper | None = field(default=None, repr=False)
    jobs: JobOperations = field(init=False, repr=False)
    job_runner: JobRunner = field(init=False, repr=False)
    key_lists: KeyListCheck = field(init=False, repr=False)
    _ticker_task: asyncio.Task[None] | None = field(default=None, repr=False)
    _stop_task: asyncio.Task[None] | None = field(default=None, repr=False)

    @classmethod
    async def open(cls, settings: Settings, *, clock: Clock | None = None,
                   sender: Sender | None = None, metrics: Metrics | None = None) -> Wheel:
        log.info("timewheel %s starting with settings: %s", __version__, settings.summary())
        embedded = None
        url = settings.redis_url
        if url is None:
            embedded = EmbeddedRedis(settings.data_dir, appendfsync=settings.embedded_appendfsync)
            try:
                await asyncio.to_thread(embedded.start)
            except DataDirInUse as exc:  # refuse to start (uvicorn exits non-zero)
                log.critical("%s", exc)
                raise
            url = embedded.url
        redis = make_redis(url, cluster=settings.redis_cluster)
        metrics = metrics or Metrics()
        policy = NetworkPolicy(allow_private=settings.allow_private_networks,
                               allowed_networks=tuple(settings.allowed_networks))
        store = Store(redis, settings.key_prefix,
                      retention_ms=int(settings.retention_seconds * 1000),
                      lease_margin_ms=int(settings.lease_margin_seconds * 1000),
                      buckets=settings.buckets, attempts_kept=settings.attempts_kept,
                      cipher=settings.cipher())
        durability = Durability(settings.redis_wait_replicas, settings.redis_wait_timeout_ms)
        if durability.enabled:  # before the flow and schedule stores take scripts from it
            store.scripts.require_replicas(durability)
        clock = clock or RedisClock(redis)
        sender = sender or make_sender(settings.http_client, policy,
                                       max_connections=settings.max_concurrency,
                                       keep_body=settings.attempt_body_bytes,
                                       result_body=settings.result_body_bytes)
        signer = (Signer([s.get_secret_value() for s in settings.signing_secret])
                  if settings.signing_secret else None)
        flows = FlowStore(redis, store.keys, store.scripts,
                          default_parallelism=settings.flow_parallelism)
        tokens = claim_tokens()
        phases = TickPhases(store, int(settings.tick_seconds * 1000))
        key_lists = KeyListCheck(store, clock, phases.me,
                                 store.cipher.key_ids if store.cipher else ())
        dispatcher = Dispatcher(store, flows, clock, sender, metrics, signer=signer,
                                max_concurrency=settings.max_concurrency,
                                batch_deadline_ms=int(settings.batch_deadline_seconds * 1000),
                                tokens=tokens, flow_local_cap=settings.flow_local_waiting,
                                tracing=Tracing.from_env(),
                                log_deliveries=settings.log_deliveries,
                                key_listers=key_lists.listers)
        ticker = Ticker(store, clock, dispatcher, metrics,
                        tick_ms=int(settings.tick_seconds * 1000),
                        claim_batch=settings.claim_batch,
                        max_pending=settings.max_concurrency * 20, tokens=tokens,
                        phases=phases)
        wheel = cls(settings, policy, metrics, redis, store, clock, dispatcher, flows, ticker,
                    sender, embedded)
        limits = TaskLimits(max_horizon_seconds=settings.max_horizon_seconds,
                            batch_deadline_seconds=settings.batch_deadline_seconds)
        wheel.schedule_store = schedule_store(store, default_timeout=limits.default_timeout)
        wheel.tasks = TaskOperations(store, clock, policy, limits, metrics, flows)
        wheel.flows = FlowOperations(flows, clock, default_parallelism=settings.flow_parallelism)
        wheel.stats = StatsOperations(store, clock)
        wheel.schedules = ScheduleOperations(wheel.schedule_store, wheel.tasks, clock)
        publisher = Publisher(store)
        wheel.topics = TopicOperations(TopicStore(store), publisher, wheel.tasks, clock,
                                       policy, metrics)
        if isinstance(redis, RedisCluster):  # only a cluster's publishes are made in steps
            wheel.sweeper = PublishSweeper(publisher, clock)
        job_store = JobStore(store)
        wheel.jobs = JobOperations(job_store, clock)
        wheel.job_runner = JobRunner(job_store, clock, poll_s=settings.tick_seconds,
                                     lease_ms=int(settings.job_lease_seconds * 1000),
                                     step_tasks=settings.job_step_tasks,
                                     pause_s=settings.job_step_pause_seconds,
                                     busy_share=settings.job_busy_share)
        wheel.materializer = Materializer(store, wheel.schedule_store, clock,
                                          tick_ms=int(settings.tick_seconds * 1000))
        wheel.key_lists = key_lists
        try:
            await store.init()
            await clock.refresh()
            if isinstance(redis, RedisCluster):
                await _report_spread(redis, store)
        except StoreUnavailable as exc:
            # Stay up: the API answers 503 and the ticker retries until Redis is back.
            log.error("Redis unavailable at start-up: %s", exc)
        except WheelMismatch as exc:
            # Refuse to start (uvicorn exits non-zero); stop the embedded Redis first.
            log.critical("%s", exc)
            await wheel.close()
            raise
        return wheel

    def start_ticker(self) -> None:
        self._ticker_task = asyncio.create_task(self.ticker.run(), name="timewheel-ticker")
        self.materializer.start()
        if self.sweeper is not None:
            self.sweeper.start()
        self.job_runner.start()
        self.key_lists.start()

    def begin_stop(self) -> asyncio.Task[None]:
        """Stop claiming, hand back what has not started, let attempts in flight finish within
        the batch deadline: at SIGTERM, while the API still answers the requests under way
        (``timewheel.cli``). uvicorn runs the lifespan's ``close`` only once those are done, up
        to the batch deadline + 5 s later; a wheel that kept ticking meanwhile claimed and sent
        tasks after its SIGTERM, whose attempts could then outlast the grace period. The same
        task for every call."""
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(self._stop_work(), name="timewheel-stop")
        return self._stop_task

    async def close(self) -> None:
        """Stop claiming, hand back or finish what is in flight (``begin_stop``, if SIGTERM has
        not already begun it), then close everything."""
        await self.begin_stop()
        await self.sender.aclose()
        with contextlib.suppress(Exception):
            await self.redis.aclose()
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)

    async def _stop_work(self) -> None:
        """The loops stop together, each within about a second however silent Redis is
        (timewheel/loops.py): one after another, each waiting on Redis, they took 11 s. Then
        the dispatcher hands back and finishes what it holds."""
        stops = [self.key_lists.stop(), self.job_runner.stop(), self.materializer.stop(),
                 self._stop_ticker()]
        if self.sweeper is not None:
            stops.append(self.sweeper.stop())
        for failed in await asyncio.gather(*stops, return_exceptions=True):
            if isinstance(failed, Exception):  # a bug: the shutdown goes on
                log.error("a loop's stop failed", exc_info=failed)
        await self.dispatcher.stop(self.settings.batch_deadline_seconds)

    async def _stop_ticker(self) -> None:
        """Like the other loops (timewheel/loops.py): its claims are bounded (CLAIM_WAIT_S,
        engine/ticker.py), but the rest of a pass is not (the clock's TIME, the flows' poll,
        the tick's note: a socket timeout each, 9 s cut off from Redis). A claim cancelled
        unanswered is what a claim left to finish on its own becomes at the ticker's end."""
        self.ticker.stop()
        await stop_loop(self._ticker_task)


async def _report_spread(redis: RedisCluster, store: Store) -> None:
    """Log how many buckets each master serves: a bucket is one hash slot, so this is how a
    minute's due load is shared (docs/design.md, "Choosing the bucket count")."""
    async with redis_errors("bucket spread"):
        spread = await bucket_spread(redis, store.keys)
    shares = ", ".join(f"{node}={count}" for node, count in spread.items())
    log.info("Redis Cluster: %d buckets over %d masters (buckets per master: %s)",
             store.keys.buckets, len(spread), shares)
    idle = [node for node, count in spread.items() if count == 0]
    if idle:
        log.warning("Redis Cluster masters %s serve no bucket and take no share of the due "
                    "load; a new wheel with more buckets (TIMEWHEEL_BUCKETS) spreads it",
                    ", ".join(idle))

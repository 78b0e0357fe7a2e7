"""Prometheus metrics, one registry per app (no module-level state: tests build many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Lateness is milliseconds-scale when healthy and seconds-scale after an outage.
_LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                     60, 300)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.scheduled = Counter("timewheel_tasks_scheduled", "Tasks created or replaced",
                                 registry=r)
        self.cancelled = Counter("timewheel_tasks_cancelled", "Tasks cancelled", registry=r)
        self.callbacks = Counter(
            "timewheel_callbacks", "Callback attempts sent, by outcome: succeeded, retried, "
            "failed, or abandoned (no answer yet when the process stopped: its lease sends it "
            "again)", ["outcome"], registry=r)
        self.lateness = Histogram(
            "timewheel_callback_lateness_seconds",
            "Start of an attempt minus the time it was due (execute_at for first attempts), "
            "or minus the time it was created or replaced when that is later",
            ["attempt"], buckets=_LATENESS_BUCKETS, registry=r)
        self.duration = Histogram("timewheel_callback_duration_seconds",
                                  "Time from sending a callback to its answer", registry=r)
        self.claimed = Counter("timewheel_tasks_claimed", "Tasks claimed by this process",
                               registry=r)
        self.skipped = Counter("timewheel_claims_dropped",
                               "Claimed tasks not sent: cancelled or replaced after the claim, "
                               "or handed back", registry=r)
        self.inflight = Gauge("timewheel_callbacks_in_flight", "Attempts being sent now",
                              registry=r)
        self.flow_waiting = Gauge(
            "timewheel_flow_waiting_local",
            "Due tasks this process holds while they wait for a permit of their flow", registry=r)
        self.flow_parked = Counter(
            "timewheel_flow_parked", "Tasks set aside in Redis to wait for their flow",
            registry=r)
        self.flow_unparked = Counter(
            "timewheel_flow_unparked", "Parked tasks taken back by this process", registry=r)
        # Per flow, only for flows with limits set (api/flows.py refreshes them per scrape).
        self.flow_in_flight = Gauge("timewheel_flow_in_flight",
                                    "Permits held over every process, per configured flow",
                                    ["flow"], registry=r)
        self.flow_waiting_total = Gauge("timewheel_flow_waiting",
                                        "Due tasks waiting for a permit or a resume, per "
                                        "configured flow: parked in Redis or held by a "
                                        "process (GET /flows' waiting)", ["flow"],
                                        registry=r)
        self.flow_series: set[str] = set()
        self.redis_up = Gauge("timewheel_redis_up",
                              "1 when Redis answered this scrape's reads, 0 when it did not "
                              "(the per-flow series are then left out)", registry=r)
        self.redis_memory = Gauge("timewheel_redis_memory_used_ratio",
                                  "used_memory / maxmemory of the fullest Redis primary at "
                                  "this scrape (0: no maxmemory set; NaN: Redis did not "
                                  "answer); at 1 Redis refuses writes and no callback is "
                                  "sent", registry=r)
        self.ticks = Counter("timewheel_ticks", "Ticker passes", registry=r)
        self.tick_errors = Counter("timewheel_tick_errors", "Ticker passes that failed",
                                   registry=r)
        # Children resolved once: labels() costs a lock and a dict lookup per callback.
        self.outcomes = {name: self.callbacks.labels(name)
                         for name in ("succeeded", "retried", "failed", "abandoned")}
        self.lateness_first = self.lateness.labels("first")
        self.lateness_retry = self.lateness.labels("retry")

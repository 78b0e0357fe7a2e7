"""Ticker: what one tick claims, how it loops and bounds itself, and how run() rides out an
outage. A real Redis behind the Store, a FakeClock, and a fake dispatcher that only records."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import START_MS
from tests.support.lost_reply import first_reply_lost
from tests.support.waiting import wait_until
from timewheel.clock import FakeClock
from timewheel.engine import ticker as ticker_module
from timewheel.engine.soon_claims import SOON_LEAD_MS, SoonClaims
from timewheel.engine.ticker import LOOKAHEAD_MARGIN_MS, Ticker
from timewheel.errors import StoreUnavailable
from timewheel.metrics import Metrics
from timewheel.models import TaskFields
from timewheel.operations.prepare import prepare
from timewheel.store import Store
from timewheel.store.record import ClaimedTask

URL = "http://127.0.0.1:9/hook"
TICK_MS = 1000


class FakeDispatcher:
    """Records submit() calls; in_flight = what it was handed plus ``busy`` (settable)."""

    def __init__(self, busy: int = 0) -> None:
        self.busy = busy
        self.calls: list[tuple[list[ClaimedTask], int]] = []

    @property
    def in_flight(self) -> int:
        return self.busy + sum(len(tasks) for tasks, _ in self.calls)

    @property
    def holding(self) -> int:
        return self.in_flight

    def submit(self, tasks: list[ClaimedTask], claimed_at_ms: int) -> None:
        self.calls.append((list(tasks), claimed_at_ms))

    @property
    def keys(self) -> list[str]:
        return [task.key for tasks, _ in self.calls for task in tasks]

    async def poll_flows(self, tick_ms: int = 1000) -> None:
        self.polls = getattr(self, "polls", 0) + 1


class FlakyStore:
    """Fault-injecting wrapper: while ``down``, claim raises StoreUnavailable as a dead Redis
    would; everything else goes to the real Store. Counts claim calls.

    ``down`` takes effect at a pass's first bucket and holds for the whole pass: a test that
    flips it while a pass is half-way would otherwise make a partly failed pass (a different
    log line, tested on its own below) whenever the flip lands between two buckets."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.down = False
        self._down_this_pass = False
        self.claims = 0
        self.limits: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def claim(self, bucket: int, **kwargs: Any) -> tuple[bool, list[ClaimedTask]]:
        self.claims += 1
        if bucket == 0:
            self._down_this_pass = self.down
        if self._down_this_pass:
            raise StoreUnavailable("claim: ConnectionError: Connection refused (injected)")
        self.limits.append(kwargs["limit"])
        return await self._store.claim(bucket, **kwargs)


async def add(store: Store, key: str, due_ms: int) -> None:
    fields = TaskFields(callback_url=URL, execute_at=due_ms / 1000)
    task = prepare(fields, key, START_MS, default_timeout=10.0)
    assert task.due_ms == due_ms
    await store.schedule(task, replace=False, now_ms=START_MS)


def keys_in_bucket(store: Store, bucket: int, count: int) -> list[str]:
    keys = (f"k{i}" for i in range(100_000))
    found = [key for key in keys if store.keys.bucket_of(key) == bucket]
    return found[:count]


async def statuses(store: Store, keys: list[str]) -> dict[str, str]:
    out = {}
    for key in keys:
        view = await store.get(key)
        assert view is not None
        out[key] = view.status.value
    return out


def make_ticker(store: Store | FlakyStore, clock: FakeClock, dispatcher: FakeDispatcher, *,
                claim_batch: int = 100, max_pending: int = 100_000, tick_ms: int = TICK_MS
                ) -> tuple[Ticker, Metrics]:
    metrics = Metrics()
    ticker = Ticker(store, clock, dispatcher, metrics, tick_ms=tick_ms,  # type: ignore[arg-type]
                    claim_batch=claim_batch, max_pending=max_pending)
    return ticker, metrics




# -- tick() --------------------------------------------------------------------------------------


async def test_tick_claims_exactly_what_is_due_by_the_next_tick_plus_margin(
        store: Store, fake_clock: FakeClock) -> None:
    """One tick claims, in every bucket, the late tasks and those due up to now + tick + margin
    (inclusive), and nothing later; the next tick claims the rest as they come due."""
    horizon = START_MS + TICK_MS + LOOKAHEAD_MARGIN_MS
    offsets = [-3_600_000, -61_000, -1, 0, 1, 500, 999, 1000, 1249, 1250]
    later = [1251, 1500, 2000, 59_999, 60_000, 3_600_000]
    due: dict[str, int] = {}
    for i in range(64):  # 64 keys spread over the 16 buckets
        due[f"task-{i}"] = START_MS + (offsets + later)[i % (len(offsets) + len(later))]
    for key, when in due.items():
        await add(store, key, when)
    expected = sorted(k for k, when in due.items() if when <= horizon)
    assert len({store.keys.bucket_of(k) for k in expected}) > 8
    dispatcher = FakeDispatcher()
    ticker, metrics = make_ticker(store, fake_clock, dispatcher)

    assert await ticker.tick() == len(expected)
    assert sorted(dispatcher.keys) == expected
    assert {at for _, at in dispatcher.calls} == {START_MS}
    assert all(t.due_ms == due[t.key] for tasks, _ in dispatcher.calls for t in tasks)
    states = await statuses(store, list(due))
    assert {k for k, s in states.items() if s == "delivering"} == set(expected)
    assert {k for k, s in states.items() if s == "scheduled"} == set(due) - set(expected)
    assert metrics.registry.get_sample_value("timewheel_tasks_claimed_total") == len(expected)

    # Same instant again: everything due is already claimed.
    assert await ticker.tick() == 0
    # One tick later the window has moved by a tick.
    fake_clock.advance(TICK_MS)
    second = sorted(k for k, when in due.items() if horizon < when <= horizon + TICK_MS)
    assert await ticker.tick() == len(second)
    assert sorted(dispatcher.keys) == sorted(expected + second)


async def test_tick_loops_until_nothing_more_is_due(store: Store, fake_clock: FakeClock) -> None:
    """With claim_batch 7 and 100 due tasks, one tick claims all 100 (looping on `more`),
    each exactly once, never more than 7 per claim call."""
    keys = [f"bulk-{i}" for i in range(100)]
    for i, key in enumerate(keys):
        await add(store, key, START_MS - 30_000 + i * 100)
    flaky = FlakyStore(store)
    dispatcher = FakeDispatcher()
    ticker, _ = make_ticker(flaky, fake_clock, dispatcher, claim_batch=7)

    assert await ticker.tick() == 100
    assert sorted(dispatcher.keys) == sorted(keys)
    assert len(dispatcher.keys) == 100  # none twice
    assert set(flaky.limits) == {7}
    assert all(len(tasks) <= 7 for tasks, _ in dispatcher.calls)
    assert set((await statuses(store, keys)).values()) == {"delivering"}
    assert await ticker.tick() == 0


async def test_tick_loops_within_one_bucket(store: Store, fake_clock: FakeClock) -> None:
    """100 due tasks all in one bucket, claim_batch 7: still all claimed in one tick, in
    calls of at most 7."""
    keys = keys_in_bucket(store, 5, 100)
    for key in keys:
        await add(store, key, START_MS)
    dispatcher = FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher, claim_batch=7)
    assert await ticker.tick() == 100
    assert sorted(dispatcher.keys) == sorted(keys)
    sizes = [len(tasks) for tasks, _ in dispatcher.calls if tasks]
    assert sizes == [7] * 14 + [2]


async def test_tick_claims_nothing_at_max_pending(store: Store, fake_clock: FakeClock) -> None:
    """While the dispatcher already holds max_pending tasks, a tick does not even ask Redis."""
    for i in range(20):
        await add(store, f"wait-{i}", START_MS)
    flaky = FlakyStore(store)
    dispatcher = FakeDispatcher(busy=50)
    ticker, _ = make_ticker(flaky, fake_clock, dispatcher, max_pending=50)

    assert await ticker.tick() == 0
    assert flaky.claims == 0
    assert dispatcher.calls == []
    assert set((await statuses(store, [f"wait-{i}" for i in range(20)])).values()) == {
        "scheduled"}

    dispatcher.busy = 0  # room again: the next tick takes them all
    assert await ticker.tick() == 20


async def test_tick_stops_claiming_at_max_pending(store: Store, fake_clock: FakeClock) -> None:
    """The claims of one tick stop when the dispatcher is full: 100 due in one bucket,
    max_pending 48 → exactly 48 claimed, the rest left scheduled for later ticks."""
    keys = keys_in_bucket(store, 3, 100)
    for key in keys:
        await add(store, key, START_MS)
    dispatcher = FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher, claim_batch=7, max_pending=48)
    assert await ticker.tick() == 48
    states = await statuses(store, keys)
    assert sorted(states.values()).count("delivering") == 48
    assert sorted(states.values()).count("scheduled") == 52
    assert await ticker.tick() == 0  # still full
    dispatcher.calls.clear()  # the dispatcher finished them
    assert await ticker.tick() == 48


async def test_each_claim_call_reads_the_clock_afresh(store: Store,
                                                      fake_clock: FakeClock) -> None:
    """A slow pass (here each claim call takes 300 ms of the clock) must not claim later
    buckets with the "now" of the first one: their tasks would be handed over as claimed
    too early and miss their start deadline. Each call's now and horizon, and the claimed-at
    the dispatcher gets, are the clock's when that call is made."""
    class SlowStore(FlakyStore):
        def __init__(self, inner: Store) -> None:
            super().__init__(inner)
            self.seen: list[tuple[int, int, int]] = []  # (clock, now_ms, horizon_ms)

        async def claim(self, bucket: int, **kwargs: Any) -> tuple[bool, list[ClaimedTask]]:
            self.seen.append((fake_clock.now_ms(), kwargs["now_ms"], kwargs["horizon_ms"]))
            reply = await super().claim(bucket, **kwargs)
            fake_clock.advance(300)
            return reply

    late = keys_in_bucket(store, store.keys.buckets - 1, 1)[0]
    await add(store, late, START_MS + TICK_MS + LOOKAHEAD_MARGIN_MS + 2_000)
    slow = SlowStore(store)
    dispatcher = FakeDispatcher()
    ticker, _ = make_ticker(slow, fake_clock, dispatcher)
    await ticker.tick()
    assert len(slow.seen) == store.keys.buckets
    assert all(now == clock and horizon == clock + TICK_MS + LOOKAHEAD_MARGIN_MS
               for clock, now, horizon in slow.seen)
    assert slow.seen[-1][1] == START_MS + 300 * (store.keys.buckets - 1)
    # The last bucket's call came 4.5 s into the pass: its horizon reached the late task.
    assert dispatcher.keys == [late]
    assert dispatcher.calls[-1][1] == slow.seen[-1][0]


# -- run() through an outage ---------------------------------------------------------------------


async def test_run_rides_out_an_outage_and_logs_it_once(
        store: Store, fake_clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """While claims fail, run() keeps looping (backing off) and logs one error for the whole
    outage; once Redis answers it resumes by itself, claims what is due, and says so once."""
    caplog.set_level(logging.INFO, logger="timewheel.engine.ticker")
    flaky = FlakyStore(store)
    flaky.down = True
    dispatcher = FakeDispatcher()
    ticker, metrics = make_ticker(flaky, fake_clock, dispatcher, tick_ms=5)

    def errors() -> float:
        return metrics.registry.get_sample_value("timewheel_tick_errors_total") or 0.0

    runner = asyncio.create_task(ticker.run())
    try:
        await wait_until(lambda: errors() >= 4, "four failed ticks")
        await add(store, "after-outage", START_MS)  # written straight to the real Redis
        assert dispatcher.calls == []
        flaky.down = False
        await wait_until(lambda: "after-outage" in dispatcher.keys, "the ticker to resume")
        failed_ticks = int(errors())
    finally:
        ticker.stop()
        await asyncio.wait_for(runner, 10)

    assert runner.result() is None
    assert failed_ticks >= 4
    assert errors() == failed_ticks  # no failure after the store came back
    assert dispatcher.keys == ["after-outage"]
    records = [r for r in caplog.records if r.name == "timewheel.engine.ticker"]
    assert [r.levelno for r in records] == [logging.ERROR, logging.WARNING]
    assert records[0].getMessage().startswith(
        "Redis unavailable, ticker backing off until it returns: claim: ConnectionError")
    assert records[1].getMessage() == (
        f"Redis answers again after {failed_ticks} failed ticks; ticker resumed")
    assert (await statuses(store, ["after-outage"])) == {"after-outage": "delivering"}


async def test_run_logs_each_outage_once(store: Store, fake_clock: FakeClock,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """Two separate outages: one error and one recovery line each, nothing per failed tick."""
    caplog.set_level(logging.INFO, logger="timewheel.engine.ticker")
    flaky = FlakyStore(store)
    dispatcher = FakeDispatcher()
    ticker, metrics = make_ticker(flaky, fake_clock, dispatcher, tick_ms=5)

    def errors() -> float:
        return metrics.registry.get_sample_value("timewheel_tick_errors_total") or 0.0

    def ticks() -> float:
        return metrics.registry.get_sample_value("timewheel_ticks_total") or 0.0

    runner = asyncio.create_task(ticker.run())
    try:
        for outage in (1, 2):
            before = errors()
            flaky.down = True
            await wait_until(lambda b=before: errors() >= b + 3, f"outage {outage}")
            flaky.down = False
            seen = ticks()
            await wait_until(lambda seen=seen: ticks() >= seen + 2, "a good tick")
    finally:
        ticker.stop()
        await asyncio.wait_for(runner, 10)

    records = [r for r in caplog.records if r.name == "timewheel.engine.ticker"]
    assert [r.levelno for r in records] == [logging.ERROR, logging.WARNING] * 2


class OneBucketBroken(FlakyStore):
    """Claims of one bucket raise what redis-py's cluster client raised on a half-moved slot
    (an AttributeError, not a StoreUnavailable); the other buckets answer."""

    def __init__(self, store: Store, broken: int | None) -> None:
        super().__init__(store)
        self.broken = broken

    async def claim(self, bucket: int, **kwargs: Any) -> tuple[bool, list[ClaimedTask]]:
        if bucket == self.broken:
            raise AttributeError("'NoneType' object has no attribute 'execute_command'")
        return await super().claim(bucket, **kwargs)


@pytest.mark.parametrize("broken", [None, 3])
async def test_a_broken_bucket_does_not_stop_the_others(
        store: Store, fake_clock: FakeClock, broken: int | None) -> None:
    """One bucket's claim fails with an unexpected error: the buckets after it are claimed in
    the same tick (isolation), and the failure is counted. Control (none broken): every
    bucket's task is claimed."""
    keys = [keys_in_bucket(store, bucket, 1)[0] for bucket in range(store.keys.buckets)]
    for key in keys:
        await add(store, key, START_MS + 100)
    dispatcher = FakeDispatcher()
    ticker, metrics = make_ticker(OneBucketBroken(store, broken), fake_clock, dispatcher)
    await ticker.tick()
    expected = [k for b, k in enumerate(keys) if b != broken]
    assert sorted(dispatcher.keys) == sorted(expected)
    errors = metrics.registry.get_sample_value("timewheel_tick_errors_total") or 0.0
    assert errors == (0 if broken is None else 1)


async def test_a_pass_failing_in_part_is_logged_at_1_2_4_passes_and_when_it_ends(
        store: Store, fake_clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """A bucket that keeps failing (a full Redis refuses the buckets that hold tasks, one
    master refuses) while the others answer: every pass is counted, but a line is logged at
    the 1st, 2nd, 4th, 8th pass in a row, not one a tick, and one when all answer again."""
    broken = OneBucketBroken(store, 3)
    ticker, metrics = make_ticker(broken, fake_clock, FakeDispatcher())
    with caplog.at_level(logging.WARNING, logger="timewheel.engine.ticker"):
        for _ in range(10):
            await ticker.tick()
        broken.broken = None
        await ticker.tick()
        await ticker.tick()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.rsplit("(", 1)[1] for line in lines[:-1]] == [
        "1 passes in a row)", "2 passes in a row)", "4 passes in a row)", "8 passes in a row)"]
    assert lines[-1] == "every bucket claimed again, after 10 passes that failed in part"
    assert metrics.registry.get_sample_value("timewheel_tick_errors_total") == 10


async def test_every_bucket_failing_raises_so_the_loop_backs_off(
        store: Store, fake_clock: FakeClock) -> None:
    flaky = FlakyStore(store)
    flaky.down = True
    ticker, _ = make_ticker(flaky, fake_clock, FakeDispatcher())
    with pytest.raises(StoreUnavailable):
        await ticker.tick()
    assert flaky.claims == store.keys.buckets  # each bucket was tried once




async def test_a_claim_whose_reply_was_lost_is_sent_again_as_it_was(
        store: Store, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim call that ran in Redis but whose reply never came (the socket timeout, 5 s
    later): the same call is sent again, same token and same now, and claim.lua hands back
    what the token took. The task is dispatched in the same tick, with the claim time its
    lease in Redis was set from, not the later one (the dispatcher's send-by derives from
    it). On the code before, the task waited out its lease, leased to nobody."""
    key = keys_in_bucket(store, 0, 1)[0]
    await add(store, key, START_MS + 100)
    lost, calls = first_reply_lost(store.scripts.claim,
                                   lambda: fake_clock.advance(5_000))  # the timeout's wait
    monkeypatch.setattr(store.scripts, "claim", lost)
    dispatcher = FakeDispatcher()
    ticker, metrics = make_ticker(store, fake_clock, dispatcher)
    assert await ticker.tick() == 1
    claimed = [([task.key for task in tasks], at) for tasks, at in dispatcher.calls if tasks]
    assert claimed == [([key], START_MS)]  # claimed at the first call's now
    assert calls[1] == calls[0]  # token, now, horizon and limit as they were
    assert (metrics.registry.get_sample_value("timewheel_tick_errors_total") or 0.0) == 0.0


# -- SoonClaims: tasks made due before the next tick (timewheel/engine/soon_claims.py) ------

LONG_TICK_MS = 60_000  # run() ticks once at its start, then not again within a test


class CountedClaims:
    """Wraps ``store.claim``: counts the calls."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        claim = store.claim

        async def counted(bucket: int, **kwargs: Any) -> tuple[bool, list[ClaimedTask]]:
            self.calls += 1
            return await claim(bucket, **kwargs)

        monkeypatch.setattr(store, "claim", counted)


async def started(ticker: Ticker, dispatcher: FakeDispatcher) -> asyncio.Task[None]:
    runner = asyncio.create_task(ticker.run())
    await wait_until(lambda: getattr(dispatcher, "polls", 0) >= 1, "the first tick")
    return runner


def soon(ticker: Ticker) -> SoonClaims:
    assert ticker.soon is not None
    return ticker.soon


async def test_a_task_made_due_before_the_next_tick_is_claimed_just_before_it_is_due(
        store: Store, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick claims only up to the next one, so a task created, rescheduled or replayed to a
    time before it would wait for that tick, up to a tick late. While run() runs, the store
    tells the ticker, which claims the task's bucket SOON_LEAD_MS before the task is due; a
    task due after the next tick is left to that tick. After stop(), the store tells nobody."""
    dispatcher = FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher, tick_ms=LONG_TICK_MS)
    runner = await started(ticker, dispatcher)
    claims = CountedClaims(store, monkeypatch)
    bucket = store.keys.bucket_of("soon")
    try:
        await add(store, "soon", START_MS + 300)
        assert soon(ticker).pending == {bucket: START_MS + 300 - SOON_LEAD_MS}
        fake_clock.advance(300 - SOON_LEAD_MS)
        await wait_until(lambda: "soon" in dispatcher.keys, "the task due soon to be claimed")
        assert claims.calls == 1 and soon(ticker).pending == {}

        await add(store, "after-next-tick", fake_clock.now_ms() + LONG_TICK_MS + SOON_LEAD_MS)
        assert soon(ticker).pending == {}
        due = await store.reschedule("after-next-tick", due_ms=fake_clock.now_ms() + 2000,
                                     max_attempts=None, now_ms=fake_clock.now_ms())
        assert due.name == "RESCHEDULED"
        fake_clock.advance(2000 - SOON_LEAD_MS)
        await wait_until(lambda: "after-next-tick" in dispatcher.keys, "the moved task")
    finally:
        ticker.stop()
        await asyncio.wait_for(runner, 10)
    assert store.due_soon.__name__ == "_nobody_listens"


async def test_a_burst_of_creates_shares_one_claim(store: Store, fake_clock: FakeClock,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifty tasks due soon in one bucket, created at once: one claim takes them all."""
    dispatcher = FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher, tick_ms=LONG_TICK_MS)
    runner = await started(ticker, dispatcher)
    claims = CountedClaims(store, monkeypatch)
    keys = keys_in_bucket(store, 3, 50)
    try:
        await asyncio.gather(*(add(store, key, START_MS + 500) for key in keys))
        fake_clock.advance(500)
        await wait_until(lambda: set(keys) <= set(dispatcher.keys), "all fifty claimed")
    finally:
        ticker.stop()
        await asyncio.wait_for(runner, 10)
    assert sorted(dispatcher.keys) == sorted(keys)
    assert claims.calls == 1


async def test_claims_between_ticks_keep_to_max_pending_and_go_on_while_more(
        store: Store, fake_clock: FakeClock) -> None:
    """Bounded work, as at a tick: with room for 3, tasks due soon in two buckets are claimed
    3 in all, one claim at a time; with room, a bucket with more than a claim's batch is
    claimed to its end (two claims of 4 and one of 2 for 10)."""
    dispatcher = FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher, tick_ms=LONG_TICK_MS, max_pending=3,
                            claim_batch=4)
    runner = await started(ticker, dispatcher)
    keys = keys_in_bucket(store, 1, 5) + keys_in_bucket(store, 2, 5)
    try:
        for key in keys:
            await add(store, key, START_MS + 300)
        fake_clock.advance(300)
        await wait_until(lambda: soon(ticker).pending == {} and len(dispatcher.keys) == 3,
                         "three claimed")
    finally:
        ticker.stop()
        await asyncio.wait_for(runner, 10)
    assert len(dispatcher.keys) == 3

    dispatcher = FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher, tick_ms=LONG_TICK_MS, claim_batch=4)
    runner = await started(ticker, dispatcher)  # its first tick claims what is left
    more = keys_in_bucket(store, 5, 10)
    try:
        for key in more:
            await add(store, key, fake_clock.now_ms() + 300)
        fake_clock.advance(300)
        await wait_until(lambda: set(more) <= set(dispatcher.keys), "all ten claimed")
    finally:
        ticker.stop()
        await asyncio.wait_for(runner, 10)
    assert [len(tasks) for tasks, _ in dispatcher.calls][-3:] == [4, 4, 2]


async def test_a_steady_stream_of_creates_costs_a_claim_per_delay_not_per_create(
        store: Store, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """500 creates in one bucket, one every 2 ms (the wheel's clock), each due 300 ms after
    it is made: a claim at the earliest one's time takes every task due by the next tick, so
    the stream costs one claim per 250 ms (300 less SOON_LEAD_MS), not one per create."""
    dispatcher = FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher, tick_ms=LONG_TICK_MS,
                            claim_batch=1000)  # each claim call takes all it finds
    runner = await started(ticker, dispatcher)
    claims = CountedClaims(store, monkeypatch)
    keys = keys_in_bucket(store, 4, 500)
    try:
        for key in keys:
            await add(store, key, fake_clock.now_ms() + 300)
            fake_clock.advance(2)
            await asyncio.sleep(0)  # the claim, when its time has come, runs meanwhile
        fake_clock.advance(300)
        await wait_until(lambda: set(keys) <= set(dispatcher.keys), "all claimed")
    finally:
        ticker.stop()
        await asyncio.wait_for(runner, 10)
    elapsed = 2 * len(keys) + 300
    assert claims.calls <= elapsed // (300 - SOON_LEAD_MS) + 1, claims.calls


class SlowClaimStore:
    """Every bucket has plenty due; bucket 0's claim waits for ``reply`` (a slow round trip).
    Counts the claims out at once."""

    def __init__(self) -> None:
        self.ready = True
        self.keys = SimpleNamespace(buckets=2)
        self.due_soon: Any = None
        self.reply = asyncio.Event()
        self.out = 0
        self.most_out = 0

    def node_of(self, bucket: int) -> str:
        return f"node-{bucket}"  # each bucket on a node of its own

    async def claim(self, bucket: int, *, limit: int, **_: Any) -> tuple[bool, list[Any]]:
        self.out += 1
        self.most_out = max(self.most_out, self.out)
        try:
            if bucket == 0:
                await self.reply.wait()
            return True, [ClaimedTask(key=f"{bucket}-{i}", bucket=bucket, token="t", due_ms=0,
                                      execute_at_ms=0, created_ms=0, attempts=0, max_attempts=5,
                                      backoff_ms=1000, timeout_ms=10_000, url=URL,
                                      method="POST", flow="f") for i in range(limit)]
        finally:
            self.out -= 1


async def test_a_claim_between_ticks_waits_for_the_ticks_claim_under_way(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: a claim between ticks read the room while a tick's claim was out,
    and both claimed into it (20 held with max_pending 10). The room a claim takes is now
    reserved while it is out: the claim between ticks finds none left. (Not one left to
    finish on its own: that gives its room back, tested below.)"""
    monkeypatch.setattr(ticker_module, "CLAIM_WAIT_S", 60.0)
    store, dispatcher = SlowClaimStore(), FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher,  # type: ignore[arg-type]
                            claim_batch=10, max_pending=10)
    runner = asyncio.create_task(ticker.run())
    try:
        await wait_until(lambda: store.out == 1, "the tick's claim of bucket 0 to be out")
        store.due_soon(1, fake_clock.now_ms() + 100)  # a POST due in 100 ms, bucket 1
        fake_clock.advance(100)
        await wait_until(lambda: soon(ticker).pending == {}, "the claim between ticks to go")
        store.reply.set()
        await wait_until(lambda: len(dispatcher.keys) == 10, "the tick's claim to come back")
    finally:
        ticker.stop()
        await asyncio.wait_for(runner, 10)
    assert store.most_out == 1
    assert dispatcher.in_flight == 10


class SilentBucketStore(SlowClaimStore):
    """Four buckets with one task each due; buckets 1 and 2 are on one master, whose claims
    wait for ``reply`` once ``silent`` (it stopped answering); 0 and 3 on masters of their own,
    which answer at once."""

    def __init__(self, silent: bool = True) -> None:
        super().__init__()
        self.keys = SimpleNamespace(buckets=4)
        self.claims: list[int] = []
        self.silent = silent

    def node_of(self, bucket: int) -> str:
        return "silent-master" if bucket in (1, 2) else f"node-{bucket}"

    async def claim(self, bucket: int, *, limit: int, **_: Any) -> tuple[bool, list[Any]]:
        self.claims.append(bucket)
        key = f"{bucket}-{len(self.claims)}"  # bucket, and which claim it was
        if self.silent and self.node_of(bucket) == "silent-master":
            await self.reply.wait()
        return False, [ClaimedTask(key=key, bucket=bucket, token="t", due_ms=0,
                                   execute_at_ms=0, created_ms=0, attempts=0, max_attempts=5,
                                   backoff_ms=1000, timeout_ms=10_000, url=URL,
                                   method="POST", flow="f")]


class Drained(FakeDispatcher):
    """Sends what it is handed at once: holds nothing."""

    @property
    def holding(self) -> int:
        return 0


async def test_a_silent_masters_claim_does_not_hold_the_other_buckets(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a Redis Cluster one silent master held every tick on its first bucket, for as long as
    the client retried (tests/cluster/test_silent_master.py). Its claim is now left to finish
    on its own after CLAIM_WAIT_S: the buckets of other masters are claimed in the same pass,
    the master's other buckets are skipped (a pass waits once a silent master, not once a
    bucket), as are its buckets in the next passes and between ticks (counted as failed), and
    the left claim's tasks are handed over when it answers."""
    monkeypatch.setattr(ticker_module, "CLAIM_WAIT_S", 0.05)
    store, dispatcher = SilentBucketStore(), FakeDispatcher()
    ticker, metrics = make_ticker(store, fake_clock, dispatcher,  # type: ignore[arg-type]
                                  claim_batch=10, max_pending=1000)
    await ticker.tick()
    assert store.claims == [0, 1, 3]
    assert sorted(dispatcher.keys) == ["0-1", "3-3"]
    assert metrics.registry.get_sample_value("timewheel_tick_errors_total") == 1
    await ticker.tick()
    assert store.claims == [0, 1, 3, 0, 3]  # the silent master's buckets skipped
    assert await ticker._claim_within_room(2) == (False, 0)  # and between ticks
    assert metrics.registry.get_sample_value("timewheel_tick_errors_total") == 2
    store.reply.set()
    await wait_until(lambda: "1-2" in dispatcher.keys, "the left claim to come back")
    await wait_until(lambda: ticker._left == {}, "the master to be free")
    await ticker.tick()
    assert store.claims[-4:] == [0, 1, 2, 3]


async def test_a_left_claim_gives_its_room_back(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: a left claim kept its room reserved for as long as it stayed out, so
    with max_pending near a batch the other masters' buckets got no room at all, and the pass
    ended as if the dispatcher were full, with no error counted. Its room is given back when
    it is left (it may pass max_pending by one batch when it answers)."""
    monkeypatch.setattr(ticker_module, "CLAIM_WAIT_S", 0.05)
    store, dispatcher = SilentBucketStore(), Drained()
    ticker, metrics = make_ticker(store, fake_clock, dispatcher,  # type: ignore[arg-type]
                                  claim_batch=10, max_pending=10)
    for _ in range(3):
        await ticker.tick()
    assert store.claims == [0, 1, 3, 0, 3, 0, 3]
    assert ticker._reserved == 0
    assert metrics.registry.get_sample_value("timewheel_tick_errors_total") == 3
    store.reply.set()
    await wait_until(lambda: ticker._left == {}, "the master to be free")


async def silent_after_the_first_tick(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch, claim_wait_s: float
) -> tuple[SilentBucketStore, Ticker, asyncio.Task[None]]:
    """A running ticker (one tick a minute) whose master of buckets 1 and 2 stops answering
    after its first tick."""
    monkeypatch.setattr(ticker_module, "CLAIM_WAIT_S", claim_wait_s)
    store, dispatcher = SilentBucketStore(silent=False), Drained()
    ticker, _ = make_ticker(store, fake_clock, dispatcher,  # type: ignore[arg-type]
                            tick_ms=60_000)
    runner = asyncio.create_task(ticker.run())
    await wait_until(lambda: getattr(dispatcher, "polls", 0) >= 1, "the first tick")
    store.silent = True
    return store, ticker, runner


async def test_a_claim_between_ticks_is_left_too_and_shutdown_does_not_wait_for_it(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: claims between ticks went to the silent master without the limit,
    one at a time, so every other bucket's claim between ticks waited behind it, and stop()
    waited for it too."""
    store, ticker, runner = await silent_after_the_first_tick(fake_clock, monkeypatch, 0.05)
    try:
        store.due_soon(1, fake_clock.now_ms() + 100)
        fake_clock.advance(100)
        await wait_until(lambda: len(ticker._left) == 1, "the claim of bucket 1 to be left")
        store.due_soon(3, fake_clock.now_ms() + 100)
        fake_clock.advance(100)
        await wait_until(lambda: store.claims[-1] == 3, "bucket 3's claim between ticks")
    finally:
        ticker.stop()
        done, _ = await asyncio.wait({runner}, timeout=10)
        store.reply.set()
        await runner
    assert done, "run() waited for the silent master's claim"


class BatchSilentStore(SilentBucketStore):
    """SilentBucketStore whose claims each return ``limit`` tasks."""

    async def claim(self, bucket: int, *, limit: int, **_: Any) -> tuple[bool, list[Any]]:
        self.claims.append(bucket)
        n = len(self.claims)
        if self.silent and self.node_of(bucket) == "silent-master":
            await self.reply.wait()
        return False, [ClaimedTask(key=f"{bucket}-{n}-{i}", bucket=bucket, token="t", due_ms=0,
                                   execute_at_ms=0, created_ms=0, attempts=0, max_attempts=5,
                                   backoff_ms=1000, timeout_ms=10_000, url=URL,
                                   method="POST", flow="f") for i in range(limit)]


async def test_two_left_claims_of_one_node_pass_max_pending_by_one_batch_at_most(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a second review: a tick's claim and one between ticks, out at once on one
    silent master and both left, both gave their room back; the others filled max_pending,
    and when the master answered it was passed by two batches. Only the first left claim of a
    node gives its room back now."""
    monkeypatch.setattr(ticker_module, "CLAIM_WAIT_S", 0.05)
    store, dispatcher = BatchSilentStore(), FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher,  # type: ignore[arg-type]
                            claim_batch=10, max_pending=30)
    claims = [asyncio.create_task(ticker._claim_within_room(b)) for b in (1, 2)]
    for claim in claims:
        with pytest.raises(StoreUnavailable):
            await claim
    assert len(ticker._left) == 2  # the same bucket, or two of one node: both tracked
    await ticker.tick()
    await ticker.tick()
    store.reply.set()
    await wait_until(lambda: ticker._left == {}, "the master to answer")
    assert dispatcher.holding <= 30 + 10, dispatcher.holding


async def test_the_same_bucket_left_twice_is_tracked_twice(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a second review: left claims were kept by bucket, so a second left claim of
    the same bucket hid the first (never cancelled at shutdown; its node freed by the other's
    end)."""
    monkeypatch.setattr(ticker_module, "CLAIM_WAIT_S", 0.05)
    store, dispatcher = BatchSilentStore(), FakeDispatcher()
    ticker, _ = make_ticker(store, fake_clock, dispatcher,  # type: ignore[arg-type]
                            claim_batch=10, max_pending=1000)
    claims = [asyncio.create_task(ticker._claim_within_room(1)) for _ in range(2)]
    for claim in claims:
        with pytest.raises(StoreUnavailable):
            await claim
    assert len(ticker._left) == 2
    store.reply.set()
    await wait_until(lambda: ticker._left == {}, "the master to answer")


async def test_shutdown_cancels_a_claim_between_ticks_left_during_it(
        fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a second review: stop() while a claim between ticks waited on a silent master;
    run() took the left claims before it awaited the claims between ticks, whose claim was left
    after that, and it still ran (and handed tasks over) after run() returned."""
    store, ticker, runner = await silent_after_the_first_tick(fake_clock, monkeypatch, 0.3)
    try:
        n = len(store.claims)
        store.due_soon(1, fake_clock.now_ms() + 100)
        fake_clock.advance(100)
        await wait_until(lambda: len(store.claims) > n, "the claim between ticks to be out")
    finally:
        ticker.stop()
        await asyncio.wait_for(runner, 10)
    still_out = [claim for claim in ticker._left if not claim.done()]
    store.reply.set()
    assert not still_out, "a left claim still runs after run() returned"

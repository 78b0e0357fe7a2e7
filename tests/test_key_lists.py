"""Each process's encryption key ids, compared across the wheel (timewheel/engine/key_lists.py):
a process that cannot open what another seals is named in an error log, once, and hands such a
task back while another live process lists its key (timewheel/engine/dispatcher.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import respx
from redis.asyncio import Redis

from tests.conftest import START_MS
from tests.test_dispatcher import URL, Harness
from tests.test_store import claim_all
from timewheel.clock import FakeClock
from timewheel.engine.key_lists import KeyListCheck, Mismatch, mismatches
from timewheel.errors import StoreUnavailable
from timewheel.models import TaskFields
from timewheel.operations.prepare import prepare
from timewheel.store import Store
from timewheel.store.encryption import Cipher

INTERVAL_MS = 10_000


@pytest.mark.parametrize(("mine", "others", "expected"), [
    # The safe steps of a key change (docs/security.md): k2 listed last everywhere, then first.
    (("k1", "k2"), {"b": ("k1",)}, []),
    (("k2", "k1"), {"b": ("k1", "k2")}, []),
    ((), {"b": ()}, []),  # encryption off everywhere
    # Step 1 skipped: the new process seals with k2, which the old one does not list.
    (("k2", "k1"), {"old": ("k1",)}, [Mismatch("old", "mine", "k2")]),
    (("k1",), {"new": ("k2", "k1")}, [Mismatch("new", "theirs", "k2")]),
    # Encryption off beside a sealing process: it fails what that one seals, and that one
    # reads its plaintext records as they are (no mismatch that way round).
    ((), {"b": ("k1",)}, [Mismatch("b", "theirs", "k1")]),
    (("k1",), {"b": ()}, [Mismatch("b", "mine", "k1")]),
    # Disjoint lists: both ways, by process id.
    (("k1",), {"z": ("k9",), "a": ("k1",)}, [Mismatch("z", "theirs", "k9"),
                                            Mismatch("z", "mine", "k1")]),
])
def test_what_does_not_fit(mine: tuple[str, ...], others: dict[str, tuple[str, ...]],
                           expected: list[Mismatch]) -> None:
    assert mismatches(mine, others) == expected


async def test_processes_see_each_others_key_ids_and_forget_the_stale(store: Store,
                                                                     redis: Redis) -> None:
    stale = 3 * INTERVAL_MS
    assert await store.note_key_ids("a", ("k2", "k1"), START_MS, stale_ms=stale) == {
        "a": ("k2", "k1")}
    assert await store.note_key_ids("b", (), START_MS + 1, stale_ms=stale) == {
        "a": ("k2", "k1"), "b": ()}
    later = START_MS + stale + 1  # a has not noted its ids for longer than that: gone
    assert await store.note_key_ids("b", (), later, stale_ms=stale) == {"b": ()}
    assert await redis.hkeys(store.keys.key_ids) == [b"b"]
    assert 0 < await redis.pttl(store.keys.key_ids) <= stale


async def test_a_process_that_cannot_open_what_another_seals_is_named_once(
        store: Store, fake_clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """Step 1 of a key change skipped in a rolling deploy: the new process (k2 first) and the
    old one (k1 only) each log the other, once however many checks."""
    old = KeyListCheck(store, fake_clock, "host:1:old", ("k1",))
    new = KeyListCheck(store, fake_clock, "host:2:new", ("k2", "k1"))
    caplog.set_level(logging.ERROR, logger="timewheel.engine.key_lists")
    assert await old.check() == []  # alone
    assert await new.check() == [Mismatch("host:1:old", "mine", "k2")]
    assert await old.check() == [Mismatch("host:2:new", "theirs", "k2")]
    for _ in range(3):
        fake_clock.advance(INTERVAL_MS)
        await new.check()
        await old.check()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith(
        "process host:1:old does not list key id 'k2', which this process seals payloads with")
    assert messages[1].startswith(
        "process host:2:new seals payloads with key id 'k2', which this process's "
        "TIMEWHEEL_ENCRYPTION_KEYS does not list")
    # Once the old process has been replaced (it notes no more), nothing is left to tell.
    fake_clock.advance(4 * INTERVAL_MS)
    assert await new.check() == []


async def test_the_check_runs_at_start_and_stops(store: Store, fake_clock: FakeClock,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    await store.note_key_ids("host:1:old", ("k1",), fake_clock.now_ms(), stale_ms=30_000)
    check = KeyListCheck(store, fake_clock, "host:2:new", ("k2", "k1"), interval_s=0.01)
    caplog.set_level(logging.ERROR, logger="timewheel.engine.key_lists")
    check.start()
    try:
        for _ in range(200):  # its first check comes at once, then every 10 ms
            if caplog.records:
                break
            await asyncio.sleep(0.01)
    finally:
        await check.stop()
    assert [r.getMessage()[:33] for r in caplog.records] == ["process host:1:old does not list "]


@pytest.mark.parametrize("value", [b"junk k1", b"", b"\xff\xfe k1", b"1.5e12 k1",
                                   str(START_MS + 10 * 30_000).encode() + b" k9"])
async def test_an_entry_that_does_not_parse_or_is_from_the_future_is_dropped(
        store: Store, redis: Redis, value: bytes) -> None:
    """Written by hand, by another program, or noted before the wheel's clock stepped back:
    it must not stop every process's check (nor count as a live process) for as long as the
    others keep the hash alive."""
    await redis.hset(store.keys.key_ids, "odd", value)
    assert await store.note_key_ids("a", ("k1",), START_MS, stale_ms=30_000) == {"a": ("k1",)}
    assert await redis.hkeys(store.keys.key_ids) == [b"a"]


async def test_a_stopped_process_counts_no_more(store: Store, fake_clock: FakeClock,
                                                redis: Redis,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """Step 1 of a key change (k2 listed last) rolled out, then at once step 2 (k2 first): a
    step-2 process that starts just after the last k1-only process stopped must not name it."""
    old = KeyListCheck(store, fake_clock, "host:1:old", ("k1",), interval_s=60)
    old.start()
    for _ in range(200):
        if await redis.hexists(store.keys.key_ids, "host:1:old"):
            break
        await asyncio.sleep(0.01)
    await old.stop()
    assert await redis.hkeys(store.keys.key_ids) == []
    caplog.set_level(logging.ERROR, logger="timewheel.engine.key_lists")
    fake_clock.advance(1000)
    assert await KeyListCheck(store, fake_clock, "host:2:new", ("k2", "k1")).check() == []
    assert caplog.records == []


class _SilentRedis:
    """A store whose Redis never answers (stopped, cut off)."""

    async def note_key_ids(self, *args: object, **kwargs: object) -> dict[str, tuple[str, ...]]:
        await asyncio.Event().wait()
        raise AssertionError

    async def forget_key_ids(self, process: str) -> None:
        await asyncio.Event().wait()


async def test_stop_is_quick_while_redis_is_silent(fake_clock: FakeClock) -> None:
    """SIGTERM must stay quick: stop does not wait for a check (or its own entry's removal)
    that Redis does not answer."""
    check = KeyListCheck(_SilentRedis(), fake_clock, "host:1:a", ("k1",))  # type: ignore[arg-type]
    check.start()
    await asyncio.sleep(0.05)  # its first check is in flight
    await asyncio.wait_for(check.stop(), 2)


async def test_a_check_redis_refuses_is_a_warning_once_and_redis_away_is_quiet(
        store: Store, fake_clock: FakeClock, redis: Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """An answer that will not change by itself (here a wrong type at the key; an ACL that
    leaves it out is the same) turns the check off for good: said once, at WARNING. Redis away
    passes: only debug, the ticker says so."""
    await redis.set(store.keys.key_ids, "not a hash")
    check = KeyListCheck(store, fake_clock, "host:1:a", ("k1",), interval_s=0.01)
    caplog.set_level(logging.DEBUG, logger="timewheel.engine.key_lists")
    check.start()
    try:
        for _ in range(300):
            if sum("not compared" in r.getMessage() for r in caplog.records) >= 1:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # ~10 more checks, refused alike
    finally:
        await check.stop()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert "WRONGTYPE" in warned[0].getMessage()

    caplog.clear()
    silent = KeyListCheck(_Unreachable(), fake_clock, "host:2:b", ("k1",),  # type: ignore[arg-type]
                          interval_s=0.01)
    silent.start()
    await asyncio.sleep(0.1)
    await silent.stop()
    assert caplog.records and all(r.levelno == logging.DEBUG for r in caplog.records)


class _Unreachable:
    """A store whose Redis refuses connections."""

    async def note_key_ids(self, *args: object, **kwargs: object) -> dict[str, tuple[str, ...]]:
        raise StoreUnavailable("note_key_ids: ConnectionError: connection refused") from (
            ConnectionError("connection refused"))

    async def forget_key_ids(self, process: str) -> None:
        raise StoreUnavailable("forget_key_ids: ConnectionError: connection refused")


async def test_listing_names_the_live_processes_that_list_a_key_id(
        store: Store, fake_clock: FakeClock) -> None:
    """What the dispatcher asks before it fails a task sealed under a key id this process does
    not list: the others that do, as the last check saw them; none before the first check,
    and none once that check is older than a process stays live (Redis away since)."""
    await store.note_key_ids("host:1:new", ("k2", "k1"), fake_clock.now_ms(), stale_ms=30_000)
    await store.note_key_ids("host:3:off", (), fake_clock.now_ms(), stale_ms=30_000)
    old = KeyListCheck(store, fake_clock, "host:2:old", ("k1",))
    assert old.listing("k2") == []
    await old.check()
    assert (old.listing("k2"), old.listing("k1"), old.listing("k9")) == (
        ["host:1:new"], ["host:1:new"], [])
    fake_clock.advance(3 * INTERVAL_MS)
    assert old.listing("k2") == ["host:1:new"]
    fake_clock.advance(1)
    assert old.listing("k2") == []


# -- the dispatcher: a task this process cannot open ---------------------------------------------

K0 = ("k0", bytes(range(32)))
K1 = ("k1", bytes(range(32, 64)))


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as mock:
        yield mock


async def sealer_and_mine(redis: Redis) -> tuple[Store, Store]:
    """A process that seals under k0, and this one, which lists only k1."""
    sealer = Store(redis, "tw", retention_ms=86_400_000, lease_margin_ms=5000,
                   cipher=Cipher([K0]))
    await sealer.init()
    mine = Store(redis, "tw", retention_ms=86_400_000, lease_margin_ms=5000,
                 cipher=Cipher([K1]))
    return sealer, mine


@pytest.mark.parametrize("listers", [["host:1:new"], []])
async def test_a_task_sealed_under_a_key_this_process_lacks_is_handed_back_while_another_lists_it(
        redis: Redis, fake_clock: FakeClock, router: respx.MockRouter,
        caplog: pytest.LogCaptureFixture, listers: list[str]) -> None:
    """Step 1 of a key change skipped: a new process sealed the task under k0; this one lists
    only k1. While another live process lists k0, the attempt is handed back unsent and
    uncounted before its due time, for that one to claim; with none, it fails for good here,
    unsent, as before (tests/test_encryption.py)."""
    route = router.post(URL).respond(200)
    sealer, mine = await sealer_and_mine(redis)
    asked: list[str] = []

    async def key_listers(key_id: str) -> list[str]:
        asked.append(key_id)
        return listers

    harness = Harness(mine, fake_clock, key_listers=key_listers)
    caplog.set_level(logging.WARNING, logger="timewheel.engine.dispatcher")
    try:
        task = prepare(TaskFields(callback_url=URL, delay=1.0, headers={"X-Secret": "s"}),
                       "sealed-1", fake_clock.now_ms(), default_timeout=10.0)
        await sealer.schedule(task, replace=False, now_ms=fake_clock.now_ms())
        [claimed] = await harness.claim("sealed-1")
        harness.dispatcher.submit([claimed], fake_clock.now_ms())
        if listers:  # handed back at its start check, before its due time
            fake_clock.set(claimed.due_ms - 5)
            await harness.settle()
            assert await harness.raw("sealed-1") == {
                "status": "scheduled", "attempts": "0", "due": str(claimed.due_ms)}
            assert await harness.lease("sealed-1") == []
            # The process that lists k0 claims it and opens it.
            fake_clock.set(claimed.due_ms)
            [again] = await claim_all(sealer, fake_clock.now_ms())
            [started] = await sealer.start(again.bucket, claims=[("sealed-1", again.token)])
            assert (started.attempt, dict(started.headers)["X-Secret"]) == (1, "s")
            assert [r.getMessage() for r in caplog.records
                    if r.name == "timewheel.engine.dispatcher"] == [
                "tasks sealed under key id 'k0', which this process does not list, are handed "
                "back for the processes that list it (host:1:new), and sent late"]
        else:
            fake_clock.set(claimed.due_ms)
            await harness.settle()
            view = await harness.view("sealed-1")
            assert (view.status, view.attempts) == ("failed", 1)
            assert view.last_error is not None and "key id 'k0'" in view.last_error
        assert asked == ["k0"]
        assert route.call_count == 0
    finally:
        await harness.dispatcher.stop(0.1)
        await harness.sender.aclose()


@pytest.mark.parametrize("checked_before_ms", [None, 3 * INTERVAL_MS + 1])
async def test_a_stale_or_missing_snapshot_is_checked_again_before_a_task_is_failed(
        redis: Redis, fake_clock: FakeClock, router: respx.MockRouter,
        checked_before_ms: int | None) -> None:
    """Redis away for longer than a process stays live (or this process just started), and
    back: the ticker claims at once (its backoff is 5 s at most), the key-list check only at
    its next interval (10 s). Meanwhile the snapshot says no process lists k0, although the
    one that does runs and noted it. The task is handed back to that one, not failed for good."""
    route = router.post(URL).respond(200)
    sealer, mine = await sealer_and_mine(redis)
    old = KeyListCheck(mine, fake_clock, "host:2:old", ("k1",))
    if checked_before_ms is not None:
        await sealer.note_key_ids("host:1:new", ("k0",), fake_clock.now_ms(), stale_ms=30_000)
        await old.check()
        fake_clock.advance(checked_before_ms)  # Redis away: no check since
    # Redis answers again; the process that lists k0 has noted it since, this one not yet.
    await sealer.note_key_ids("host:1:new", ("k0",), fake_clock.now_ms(), stale_ms=30_000)
    harness = Harness(mine, fake_clock, key_listers=old.listers)
    try:
        task = prepare(TaskFields(callback_url=URL, delay=1.0), "sealed-1",
                       fake_clock.now_ms(), default_timeout=10.0)
        await sealer.schedule(task, replace=False, now_ms=fake_clock.now_ms())
        [claimed] = await harness.claim("sealed-1")
        harness.dispatcher.submit([claimed], fake_clock.now_ms())
        fake_clock.set(claimed.due_ms)
        await harness.settle()
        assert await harness.raw("sealed-1") == {
            "status": "scheduled", "attempts": "0", "due": str(claimed.due_ms)}
        assert await harness.dead() == []
        assert route.call_count == 0
    finally:
        await harness.dispatcher.stop(0.1)
        await harness.sender.aclose()


async def test_listers_checks_again_once_for_its_callers_and_not_while_stopping(
        store: Store, fake_clock: FakeClock, redis: Redis) -> None:
    """``listers`` with no snapshot checks once for every caller meanwhile; Redis away, it
    answers none (the task fails as before); stopped, it no longer notes this process."""
    await store.note_key_ids("host:1:new", ("k0",), fake_clock.now_ms(), stale_ms=30_000)
    old = KeyListCheck(store, fake_clock, "host:2:old", ("k1",))
    noted: list[str] = []
    real = store.note_key_ids

    async def counting(process: str, *args: object, **kwargs: object
                       ) -> dict[str, tuple[str, ...]]:
        noted.append(process)
        return await real(process, *args, **kwargs)  # type: ignore[arg-type]

    store.note_key_ids = counting  # type: ignore[method-assign]
    assert await asyncio.gather(old.listers("k0"), old.listers("k0"), old.listers("k9")) == [
        ["host:1:new"], ["host:1:new"], []]
    assert noted == ["host:2:old"]
    await old.listers("k0")  # fresh: no check
    assert noted == ["host:2:old"]

    away = KeyListCheck(_Unreachable(), fake_clock, "host:3:b", ("k1",))  # type: ignore[arg-type]
    assert await asyncio.wait_for(away.listers("k0"), 2) == []

    fake_clock.advance(3 * INTERVAL_MS + 1)
    old.start()
    await old.stop()
    noted.clear()
    assert await old.listers("k0") == []
    assert noted == []
    assert b"host:2:old" not in await redis.hkeys(store.keys.key_ids)

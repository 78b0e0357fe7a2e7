"""Payload encryption at rest against a real Redis (timewheel/store/encryption.py): what the
record holds, what start and the views hand back, the unknown key id, the keyed fingerprint, and
the rotation's compare-and-set (a change made while it runs is never undone)."""

from __future__ import annotations

import base64
import dataclasses
import logging

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from tests.test_store import claim_all
from timewheel.settings import Settings
from timewheel.store import Store, layout
from timewheel.store.encryption import Cipher, UnknownKey, parse_keys
from timewheel.store.record import NewTask
from timewheel.store.replies import RekeyReply, ScheduleReply
from timewheel.store.rotation import Rotation
from timewheel.store.task_store import Outcome

NOW = 1_800_000_000_000
K0 = ("k0", bytes(range(32)))
K1 = ("k1", bytes(range(32, 64)))
SECRET_HEADER = "s3cret-header-value"
SECRET_BODY = b'{"card":"4111-1111-1111-1111"}'


def sealed_task(key: str, due_ms: int = NOW, body: bytes = SECRET_BODY) -> NewTask:
    return NewTask(key=key, url="http://127.0.0.1:9/cb", method="POST",
                   headers=[("X-Api-Key", SECRET_HEADER), ("Content-Type", "application/json")],
                   body=body, due_ms=due_ms, timeout_ms=10_000, max_attempts=5,
                   backoff_ms=1000, fingerprint=f"fp-{key}-{body!r}", flow="127.0.0.1:9")


async def make_store(redis: Redis, *keys: tuple[str, bytes]) -> Store:
    store = Store(redis, "tw", retention_ms=86_400_000, lease_margin_ms=5000,
                  cipher=Cipher(list(keys)) if keys else None)
    await store.init()
    return store


async def raw_dump(redis: Redis) -> bytes:
    """Every value of every key, as bytes (strings and lists: what a task writes)."""
    out = []
    async for name in redis.scan_iter():
        kind = await redis.type(name)
        if kind == b"string":
            out.append(await redis.get(name))
        elif kind == b"list":
            out += await redis.lrange(name, 0, -1)
        elif kind == b"zset":
            out += [m for m, _ in await redis.zrange(name, 0, -1, withscores=True)]
        elif kind == b"hash":
            out += [v for pair in (await redis.hgetall(name)).items() for v in pair]
        elif kind == b"set":
            out += list(await redis.smembers(name))
    return b"\n".join(out)


async def test_sealed_record_holds_no_plaintext_and_start_opens_it(redis: Redis) -> None:
    store = await make_store(redis, K0)
    assert await store.schedule(sealed_task("pay-1"), replace=False, now_ms=NOW) == 0
    dump = await raw_dump(redis)
    assert SECRET_HEADER.encode() not in dump and b"4111" not in dump and b"X-Api-Key" not in dump
    record = await store.record("pay-1")
    assert record is not None and record["body"] == b"" and record["headers"][:4] == b"\0\x02k0"
    # The fingerprint in the head is keyed: not the unkeyed SHA-256 prefix a dump could test.
    assert record["fp"] != layout.fp_bytes(sealed_task("pay-1").fingerprint)

    view = await store.get("pay-1")
    assert view is not None and view.body == SECRET_BODY
    assert view.headers == [("X-Api-Key", SECRET_HEADER), ("Content-Type", "application/json")]
    [claimed] = await claim_all(store, NOW)
    [started] = await store.start(claimed.bucket, claims=[("pay-1", claimed.token)])
    assert (started.attempt, started.body) == (1, SECRET_BODY)
    assert ("X-Api-Key", SECRET_HEADER) in started.headers


async def test_control_without_keys_the_dump_shows_the_payload(redis: Redis) -> None:
    store = await make_store(redis)
    await store.schedule(sealed_task("pay-1"), replace=False, now_ms=NOW)
    dump = await raw_dump(redis)
    assert SECRET_HEADER.encode() in dump and b"4111" in dump


async def test_a_repeated_create_is_recognised_across_keys(redis: Redis) -> None:
    """The keyed fingerprint still tells a repeat (200) from a conflict (409): under the same
    key, under an older key not yet rotated, and for a record stored before encryption."""
    plain = await make_store(redis)
    await plain.schedule(sealed_task("old"), replace=False, now_ms=NOW)
    first = await make_store(redis, K0)
    await first.schedule(sealed_task("a"), replace=False, now_ms=NOW)
    assert await first.schedule(sealed_task("a"), replace=False, now_ms=NOW) == 2
    assert await first.schedule(sealed_task("a", body=b"{}"), replace=False, now_ms=NOW) == -1
    rotated = await make_store(redis, K1, K0)
    assert await rotated.schedule(sealed_task("a"), replace=False, now_ms=NOW) == 2
    assert await rotated.schedule(sealed_task("a", body=b"{}"), replace=False, now_ms=NOW) == -1
    assert await rotated.schedule(sealed_task("old"), replace=False, now_ms=NOW) == 2
    assert await rotated.schedule(sealed_task("old", body=b"{}"), replace=False,
                                  now_ms=NOW) == ScheduleReply.CONFLICT


async def test_a_ciphertext_moved_to_another_task_does_not_open(redis: Redis) -> None:
    store = await make_store(redis, K0)
    for key in ("a", "b"):
        await store.schedule(sealed_task(key), replace=False, now_ms=NOW)
    a, b = await store.record("a"), await store.record("b")
    assert a is not None and b is not None
    await redis.set(store.keys.task("b"), layout.encode({**b, "headers": a["headers"]}))
    [claimed] = [c for c in await claim_all(store, NOW) if c.key == "b"]
    [started] = await store.start(claimed.bucket, claims=[("b", claimed.token)])
    assert (started.attempt, started.headers, started.body) == (1, [], b"")
    assert started.unsendable is not None and "does not verify" in started.unsendable
    view = await store.get("b")  # the executor fails it at its time (Executor.set_aside)
    assert view is not None and view.status == "delivering"


async def test_unknown_key_id_fails_the_task_with_its_reason(redis: Redis) -> None:
    old = await make_store(redis, K0)
    await old.schedule(sealed_task("x"), replace=False, now_ms=NOW)
    store = await make_store(redis, K1)
    reason = ("encrypted with key id 'k0', which TIMEWHEEL_ENCRYPTION_KEYS does not list: "
              "list the key, then replay the task")
    # Pending, its view cannot show what it will send: it says why, not "no headers, no body".
    pending = await store.get("x")
    assert pending is not None and (pending.headers, pending.body) == ([], b"")
    assert pending.last_error == f"{reason} (it fails when due, unsent)"
    [claimed] = await claim_all(store, NOW)
    [started] = await store.start(claimed.bucket, claims=[("x", claimed.token)])
    assert (started.attempt, started.body, started.unsendable) == (1, b"", reason)
    # Failed as the executor fails it (tests/test_dispatcher.py: at its time, unsent).
    await store.complete(claimed.bucket, now_ms=NOW, outcomes=[
        Outcome("x", claimed.token, "fail", error=reason, started_ms=NOW)])
    view = await store.get("x")
    assert view is not None and view.status == "failed" and view.last_error == reason
    # Listed again, a replay delivers it with its payload.
    both = await make_store(redis, K1, K0)
    assert await both.replay("x", now_ms=NOW + 1) == 1
    [claimed] = await claim_all(both, NOW + 1)
    [started] = await both.start(claimed.bucket, claims=[("x", claimed.token)])
    assert (started.attempt, started.body) == (1, SECRET_BODY)  # a replay counts anew


async def test_response_bodies_in_the_history_are_sealed(redis: Redis) -> None:
    from timewheel.store import attempts

    store = await make_store(redis, K0)
    await store.schedule(sealed_task("h"), replace=False, now_ms=NOW)
    [claimed] = await claim_all(store, NOW)
    await store.start(claimed.bucket, claims=[("h", claimed.token)])
    entry = attempts.entry(attempt=1, started_ms=NOW, duration_ms=3, verdict="retry",
                           status_code=503, error=None, headers=None, body="balance: 1234.56",
                           body_truncated=False, next_attempt_ms=NOW + 1000, process="p",
                           key="h", cipher=store.cipher)
    await store.complete(claimed.bucket, now_ms=NOW, outcomes=[
        Outcome("h", claimed.token, "retry", 503, "HTTP 503", NOW + 1000, NOW, entry)])
    assert b"1234.56" not in await raw_dump(redis)
    [kept] = await store.attempts("h") or []
    assert kept.response_body == "balance: 1234.56"
    # A rotation that does not list k0 cannot open it: counted (keys rotate exits 3), left.
    history = f"{{tw:{claimed.bucket}}}:a:h"
    before = await redis.lrange(history, 0, -1)
    assert len(before) == 1
    blind = await Rotation(redis, "tw", Cipher([K1])).run()
    assert (blind.attempts_rekeyed, blind.attempts_unreadable) == (0, 1)
    assert await redis.lrange(history, 0, -1) == before
    # Rotated to k1, then read with k1 alone.
    report = await Rotation(redis, "tw", Cipher([K1, K0])).run()
    assert (report.attempts_rekeyed, report.attempts_unreadable) == (1, 0)
    [kept] = await (await make_store(redis, K1)).attempts("h") or []
    assert kept.response_body == "balance: 1234.56"


async def test_rotation_seals_every_record_under_the_first_key(redis: Redis) -> None:
    plain = await make_store(redis)
    await plain.schedule(sealed_task("before"), replace=False, now_ms=NOW)
    old = await make_store(redis, K0)
    for i in range(30):
        await old.schedule(sealed_task(f"t{i}", NOW + 60_000), replace=False, now_ms=NOW)
    await old.cancel("t0", now_ms=NOW)  # finished records are rotated too (replayable)
    lines: list[str] = []
    report = await Rotation(redis, "tw", Cipher([K1, K0]), step=7).run(
        lambda counts: lines.append(counts.line()))
    assert (report.tasks_rekeyed, report.tasks_current, report.tasks_changed) == (31, 0, 0)
    # Progress after each step of 7 (31 tasks), each line once.
    assert [line.split()[0] for line in lines] == [
        f"tasks_rekeyed={n}" for n in (7, 14, 21, 28, 31)]
    assert len(set(lines)) == len(lines) and lines[-1] == report.line()
    again = await Rotation(redis, "tw", Cipher([K1, K0])).run()
    assert (again.tasks_rekeyed, again.tasks_current) == (0, 31)
    new = await make_store(redis, K1)  # k0 no longer needed
    for key in ("before", "t0", "t29"):
        view = await new.get(key)
        assert view is not None and view.body == SECRET_BODY, key
    # The keyed fingerprint followed: a repeat is still a repeat under k1 alone.
    assert await new.schedule(sealed_task("t5", NOW + 60_000), replace=False, now_ms=NOW) == 2
    assert await new.schedule(sealed_task("before"), replace=False, now_ms=NOW) == 2


async def test_rekey_never_undoes_a_change_made_after_the_read(redis: Redis) -> None:
    """The rotation read a record, then a PUT replaced it: the script refuses to write the
    old request back (CHANGED), and the replacement stays."""
    old = await make_store(redis, K0)
    await old.schedule(sealed_task("r"), replace=False, now_ms=NOW)
    read = await old.record("r")
    assert read is not None
    cipher = Cipher([K1, K0])
    opened = cipher.open_task("r", read["headers"])
    resealed = cipher.seal_task("r", opened.h12, opened.headers, opened.body)
    replaced = dataclasses.replace(sealed_task("r"), body=b'{"v":2}')
    await old.schedule(replaced, replace=True, now_ms=NOW + 1)
    rotation = Rotation(redis, "tw", cipher)
    reply = await rotation._rekey(keys=[old.keys.prefix(old.keys.bucket_of("r"))], args=[
        "r", read["headers"], read["body"], read["fp"], resealed,
        cipher.fingerprint(opened.h12)])
    assert RekeyReply(int(reply)) is RekeyReply.CHANGED
    view = await old.get("r")
    assert view is not None and view.body == b'{"v":2}'
    # A cancel in between changes no request: the rekey goes ahead and the task stays
    # cancelled.
    read = await old.record("r")
    assert read is not None
    await old.cancel("r", now_ms=NOW + 2)
    opened = cipher.open_task("r", read["headers"])
    reply = await rotation._rekey(keys=[old.keys.prefix(old.keys.bucket_of("r"))], args=[
        "r", read["headers"], read["body"], read["fp"],
        cipher.seal_task("r", opened.h12, opened.headers, opened.body),
        cipher.fingerprint(opened.h12)])
    assert RekeyReply(int(reply)) is RekeyReply.REKEYED
    view = await (await make_store(redis, K1)).get("r")
    assert view is not None and view.status == "cancelled" and view.body == b'{"v":2}'
    assert await redis.ttl(old.keys.task("r")) > 0  # its retention TTL kept


@pytest.mark.parametrize(("value", "message"), [
    ("k0", "entry 1 is not <id>:<base64 key>"),
    ("k0:not base64!", "key 'k0' is not valid base64"),
    (f"k0:{base64.b64encode(bytes(16)).decode()}", "key 'k0' is 16 bytes"),
    (f"k0:{base64.b64encode(bytes(32)).decode()},k0:{base64.b64encode(bytes(32)).decode()}",
     "key id 'k0' is listed twice"),
    (f"bad id:{base64.b64encode(bytes(32)).decode()}", "entry 1 is not"),
    (",", "lists no key"),  # "${NEW},${OLD}" with both unset: not "encryption off"
    (" , ,", "lists no key"),
])
def test_bad_keys_are_refused_without_echoing_them(value: str, message: str) -> None:
    """The message names the entry, never its key (the CLI prints messages without the
    input: tests/e2e/test_encryption.py checks the refusal of `timewheel serve`)."""
    with pytest.raises(ValidationError, match=message) as caught:
        Settings(encryption_keys=value)  # type: ignore[arg-type]
    [error] = caught.value.errors(include_input=False)
    assert message in error["msg"] and "AAAAAAAA" not in error["msg"]


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_key_list_is_encryption_off(value: str) -> None:
    assert Settings(encryption_keys=value).cipher() is None  # type: ignore[arg-type]


def test_the_settings_summary_redacts_the_keys() -> None:
    value = f"k0:{base64.b64encode(bytes(range(32))).decode()}"
    settings = Settings(encryption_keys=value)  # type: ignore[arg-type]
    assert "encryption_keys=<redacted:1>" in settings.summary()
    assert value.split(":")[1] not in settings.summary()
    assert settings.cipher() is not None and parse_keys(value)[0][0] == "k0"


def test_unknown_key_message() -> None:
    assert str(UnknownKey("k0")) == ("encrypted with key id 'k0', which "
                                     "TIMEWHEEL_ENCRYPTION_KEYS does not list")


def test_keys_generate_prints_an_entry_the_settings_take(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    from timewheel.cli import main

    with pytest.raises(SystemExit) as done:
        main(["keys", "generate", "--id", "k9"])
    assert done.value.code == 0
    line = capsys.readouterr().out.strip()
    [(key_id, secret)] = parse_keys(line)
    assert key_id == "k9" and len(secret) == 32
    assert Settings(encryption_keys=line).cipher() is not None  # type: ignore[arg-type]
    with pytest.raises(SystemExit) as done:
        main(["keys", "generate", "--id", "no spaces"])
    assert done.value.code == 2


async def test_schedule_specs_are_sealed_and_rotated(redis: Redis,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A schedule's task template (headers and body) is sealed in its spec; GET opens it; the
    rotation seals it anew under the first key; a spec under an unlisted key makes no
    occurrences (specs() leaves it out), the listing leaves it out, and GET says why."""
    from timewheel.errors import RecordUnreadable
    from timewheel.operations.prepare import template_task
    from timewheel.store.schedule_store import ScheduleStore

    def schedules(store: Store) -> ScheduleStore:
        return ScheduleStore(store, template_task=lambda t: template_task(t, default_timeout=10))

    spec = {"cron": None, "every": 3600, "timezone": "UTC", "task": {
        "callback_url": "http://127.0.0.1:9/cb", "headers": {"X-Api-Key": SECRET_HEADER},
        "body": {"card": "4111-1111-1111-1111"}}}
    old = schedules(await make_store(redis, K0))
    await old.put("nightly", spec, paused=False, now_ms=NOW, next_after=lambda s, t: t + 3600_000)
    assert SECRET_HEADER.encode() not in await raw_dump(redis)
    assert b"4111" not in await raw_dump(redis)
    got = await old.get("nightly")
    assert got is not None and got.spec == spec
    bucket = old.bucket_of("nightly")
    assert "nightly" in await old.specs(bucket, ["nightly"])

    only_k1 = schedules(await make_store(redis, K1))
    assert await only_k1.specs(bucket, ["nightly"]) == {}
    with pytest.raises(RecordUnreadable, match="key id 'k0'"):
        await only_k1.get("nightly")
    await only_k1.put("open", spec, paused=False, now_ms=NOW,
                      next_after=lambda s, t: t + 3600_000)
    with caplog.at_level(logging.WARNING, "timewheel.store.schedule_store"):
        for _ in range(3):  # the dashboard lists every few seconds: one line, not one a poll
            listed, _ = await only_k1.page(10, None)  # the listing still answers, without it
            assert [r.id for r in listed] == ["open"]
    [line] = [r.getMessage() for r in caplog.records if "listing" in r.getMessage()]
    assert line.startswith("schedule left out of the listing: schedule 'nightly'")
    assert "key id 'k0'" in line

    report = await Rotation(redis, "tw", Cipher([K1, K0])).run()
    assert report.schedules_rekeyed == 1
    got = await only_k1.get("nightly")
    assert got is not None and got.spec == spec
    assert b"4111" not in await raw_dump(redis)


async def test_topic_specs_are_sealed_and_rotated(redis: Redis,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A topic's endpoints' headers go into every task its publishes make, and hold receivers'
    credentials: sealed in its spec, opened by GET and by a publish, sealed anew by the
    rotation; a spec under an unlisted key raises RecordUnreadable, saying which key."""
    from timewheel.errors import RecordUnreadable
    from timewheel.store.topic_store import TopicStore

    endpoints = [{"name": "a", "url": "http://127.0.0.1:9/a",
                  "headers": {"Authorization": f"Bearer {SECRET_HEADER}"}}]
    old = TopicStore(await make_store(redis, K0))
    await old.put("orders", endpoints, now_ms=NOW)
    await old.put("other", endpoints, now_ms=NOW)
    assert SECRET_HEADER.encode() not in await raw_dump(redis)
    got = await old.get("orders")
    assert got is not None and got.endpoints == endpoints
    page, _ = await old.page(10, None)
    assert [t.endpoints for t in page] == [endpoints, endpoints]

    only_k1 = TopicStore(await make_store(redis, K1))
    with pytest.raises(RecordUnreadable, match=r"topic 'orders'.*key id 'k0'"):
        await only_k1.get("orders")
    with caplog.at_level(logging.WARNING, "timewheel.store.topic_store"):
        for _ in range(3):  # left out, the listing still answers; logged once, not a poll
            assert await only_k1.page(10, None) == ([], None)
    assert sorted(r.getMessage().split(":")[1] for r in caplog.records) == [
        " topic 'orders'", " topic 'other'"]

    report = await Rotation(redis, "tw", Cipher([K1, K0])).run()
    assert (report.topics_rekeyed, report.topics_unreadable) == (2, 0)
    got = await only_k1.get("orders")
    assert got is not None and got.endpoints == endpoints
    assert SECRET_HEADER.encode() not in await raw_dump(redis)
    again = await Rotation(redis, "tw", Cipher([K1])).run()
    assert (again.topics_rekeyed, again.topics_unreadable) == (0, 0)  # current already


async def test_a_topic_stored_before_encryption_is_read_and_sealed_by_the_rotation(
        redis: Redis) -> None:
    from timewheel.store.topic_store import TopicStore

    endpoints = [{"name": "a", "url": "http://127.0.0.1:9/a", "headers": {"X-K": SECRET_HEADER}}]
    await TopicStore(await make_store(redis)).put("orders", endpoints, now_ms=NOW)
    assert SECRET_HEADER.encode() in await raw_dump(redis)  # plaintext: no keys then
    sealed = TopicStore(await make_store(redis, K0))
    got = await sealed.get("orders")
    assert got is not None and got.endpoints == endpoints
    assert (await Rotation(redis, "tw", Cipher([K0])).run()).topics_rekeyed == 1
    assert SECRET_HEADER.encode() not in await raw_dump(redis)
    got = await sealed.get("orders")
    assert got is not None and got.endpoints == endpoints


@pytest.mark.parametrize("sealed", [True, False], ids=["keys", "control without keys"])
async def test_a_result_task_is_sealed_like_any_task(redis: Redis, sealed: bool) -> None:
    """The result task complete.lua creates carries the receiver's answer as its body: sealed
    too when keys are set, and it opens to the payload when started. Control: without keys
    the answer shows in the dump."""
    from timewheel.store.results import ResultCallback

    store = await make_store(redis, *([K0] if sealed else []))
    task = dataclasses.replace(sealed_task("r"), on_success="http://127.0.0.1:9/done")
    await store.schedule(task, replace=False, now_ms=NOW)
    [claimed] = await claim_all(store, NOW)
    await store.start(claimed.bucket, claims=[("r", claimed.token)])
    result = ResultCallback(url="http://127.0.0.1:9/done", verdict="ok", attempt=1,
                            status_code=200, scheduled_at_ms=NOW, timeout_ms=10_000,
                            response_body=b"receipt 987654")
    await store.complete(claimed.bucket, now_ms=NOW + 5, outcomes=[
        Outcome("r", claimed.token, "ok", 200, None, None, NOW, "", result)])
    assert (b"987654" in await raw_dump(redis)) is not sealed
    [result_task] = await claim_all(store, NOW + 10)
    assert result_task.key == "r.on_success"
    [started] = await store.start(result_task.bucket, claims=[(result_task.key, result_task.token)])
    assert b"receipt 987654" in started.body


async def test_pausing_a_schedule_that_does_not_open_still_cancels_its_occurrences(
        redis: Redis) -> None:
    """(A review's doubt.) The pause is written, then the spec was read for the occurrences'
    stand-in template: under a key id no longer listed, that read failed, and the occurrences
    already created went on to fire although the pause had taken. They are cancelled; the
    answer is still the 500 naming the key (the schedule cannot be shown)."""
    from timewheel.clock import FakeClock
    from timewheel.engine.materializer import Materializer
    from timewheel.engine.occurrences import next_after
    from timewheel.errors import RecordUnreadable
    from timewheel.operations.schedules import ScheduleOperations, schedule_store

    old_store = await make_store(redis, K0)
    old = schedule_store(old_store, default_timeout=10.0)
    spec = {"cron": None, "every": 1, "timezone": "UTC",
            "task": {"callback_url": "http://127.0.0.1:9/cb"}}
    await old.put("hb", spec, paused=False, now_ms=NOW, next_after=next_after)
    await Materializer(old_store, old, clock=None, tick_ms=1000).tick(NOW)  # type: ignore[arg-type]
    occurrences = [f"hb.{NOW + 1000}", f"hb.{NOW + 2000}"]
    new = schedule_store(await make_store(redis, K1), default_timeout=10.0)
    ops = ScheduleOperations(new, None, FakeClock(NOW))  # type: ignore[arg-type]
    with pytest.raises(RecordUnreadable, match="key id 'k0'"):
        await ops.pause("hb")
    for key in occurrences:
        view = await old_store.get(key)
        assert view is not None and view.status == "cancelled", key


async def test_a_history_entry_not_as_written_is_left_and_the_rotation_goes_on(
        redis: Redis) -> None:
    """An entry without its attempt number (written by hand, another program) is left as it
    is, as before the history's unreadable count: it must not stop the whole rotation."""
    store = await make_store(redis, K0)
    await store.schedule(sealed_task("h"), replace=False, now_ms=NOW)
    await redis.rpush(f"{{tw:{store.keys.bucket_of('h')}}}:a:h", '{"bx": "AAAA"}')
    report = await Rotation(redis, "tw", Cipher([K1, K0])).run()
    assert (report.tasks_rekeyed, report.attempts_rekeyed, report.attempts_unreadable) == (
        1, 0, 0)

"""Claims and starts on the layout-2 record: claim replies carry no
headers or bodies, ``start`` hands over what is stored at that moment, and a record that cannot
be decoded is failed with the reason instead of holding back the others."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import respx
from redis.asyncio import Redis

from tests.support.bucket_state import (
    FLOW,
    M0,
    MARGIN,
    NOW,
    B,
    dump,
    minutes,
    rec,
    seed,
)
from tests.test_dispatcher import DUE_MS, URL, Harness, router, wheel
from tests.test_store import claim_all, task
from timewheel.models import MAX_BODY_BYTES, TaskStatus
from timewheel.store import Store, layout
from timewheel.store.record import NOT_STARTED, ClaimedTask, claimed_task
from timewheel.store.scripts import lua_dir

__all__ = ["router", "wheel"]  # fixtures of tests/test_dispatcher.py used here


async def test_claim_replies_carry_no_bodies(store: Store, redis: Redis) -> None:
    """Ten due tasks with 1 MiB bodies: the claim reply is a few hundred bytes per task (it
    carried every body before layout 2); start hands each body over, byte for byte."""
    body = b"b" * MAX_BODY_BYTES
    keys = [f"big-{i}" for i in range(10)]
    await seed(redis, {**{f"t:{k}": rec(due=NOW + i, body=body, headers="X-N:" + k)
                          for i, k in enumerate(keys)},
                       f"ms:{M0}": {k: NOW + i for i, k in enumerate(keys)}, **minutes(M0),
                       "cur": str(M0)})
    reply = await store.scripts.claim(keys=[store.keys.prefix(B)],
                                      args=[NOW + 100, NOW + 100, 100, "tok", MARGIN, 10, 1])
    assert reply[:2] == [0, 10]
    assert sum(len(part) for part in reply[2:]) < 10 * 200
    started = await store.start(B, claims=[(k, "tok") for k in keys])
    assert [(s.attempt, s.headers, s.body) for s in started] == [
        (1, [("X-N", k)], body) for k in keys]


# lua/lib/record.lua reads the head and the next READ_AHEAD bytes in one GETRANGE; flow and url
# (claim) and headers and body (start) come from those bytes when they are in them, else from
# a GETRANGE of their own. A part that ends just inside, exactly at, or just past the end of
# the read-ahead, and a url longer than all of it.
READ_AHEAD = int(re.search(r"local READ_AHEAD = (\d+)",
                           (lua_dir() / "lib" / "record.lua").read_text())[1])


@pytest.mark.parametrize("url_len, headers_len, past_the_read_ahead", [
    (40, 200, -1), (40, 200, 0), (40, 200, 1), (40, 2000, -900), (1500, 100, 700),
])
async def test_claim_and_start_read_parts_across_the_read_ahead(
        store: Store, redis: Redis, url_len: int, headers_len: int,
        past_the_read_ahead: int) -> None:
    url = ("http://127.0.0.1:9/" + "u" * url_len)[:url_len]
    headers = ("X-Long:" + "h" * headers_len)[:headers_len]
    # The body ends `past_the_read_ahead` bytes after the read-ahead's last byte.
    used = len(FLOW) + len(url) + len(headers)
    body = b"0123456789" * 300
    body = body[:max(0, READ_AHEAD + past_the_read_ahead - used)]
    await seed(redis, {"t:k": rec(url=url.encode(), headers=headers.encode(), body=body),
                       f"ms:{M0}": {"k": NOW}, **minutes(M0), "cur": str(M0)})
    [claimed] = await claim_all(store, NOW)
    assert claimed.url == url
    [started] = await store.start(claimed.bucket, claims=[("k", claimed.token)])
    assert (started.attempt, started.headers, started.body) == (
        1, [("X-Long", headers[len("X-Long:"):])], body)


async def test_start_reads_what_is_stored_at_start(store: Store) -> None:
    """A PUT between claim and start (a new body): the old claim cannot start (as before
    layout 2, when it held the old body from its claim reply); the new one is claimed and
    started with the new body."""
    await store.schedule(task("k", NOW), replace=False, now_ms=NOW)
    [old] = await claim_all(store, NOW)
    new = dataclasses.replace(task("k", NOW + 10), body=b"version 2")
    assert await store.schedule(new, replace=True, now_ms=NOW + 1) == 1
    assert await store.start(old.bucket, claims=[("k", old.token)]) == [
        NOT_STARTED]
    [fresh] = await claim_all(store, NOW + 10)
    [started] = await store.start(fresh.bucket, claims=[("k", fresh.token)])
    assert (started.attempt, started.body) == (1, b"version 2")


async def test_dispatcher_sends_the_body_read_at_start(wheel: Harness,
                                                       router: respx.MockRouter) -> None:
    """End to end through the dispatcher: the task held since its claim is replaced (same due
    time, new body) before it starts; only the new body is ever sent, once."""
    route = router.post(URL).respond(200)
    await wheel.add(body={"version": 1})
    held = await wheel.claim()
    wheel.dispatcher.submit(held, wheel.clock.now_ms())
    await wheel.add(replace=True, body={"version": 2})
    wheel.clock.set(DUE_MS)
    await wheel.settle()
    assert route.call_count == 0  # the old claim did not start
    await wheel.fire()
    assert [call.request.content for call in route.calls] == [b'{"version":2}']


async def test_an_undecodable_record_is_failed_at_claim(store: Store, redis: Redis) -> None:
    """A record whose url is not UTF-8 is failed with the reason; the others are claimed."""
    await seed(redis, {"t:a": rec(due=NOW), "t:bad": rec(due=NOW + 1, url=b"http://\xff/"),
                       "t:c": rec(due=NOW + 2),
                       f"ms:{M0}": {"a": NOW, "bad": NOW + 1, "c": NOW + 2}, **minutes(M0),
                       "cur": str(M0)})
    _, tasks = await store.claim(B, now_ms=NOW + 5, horizon_ms=NOW + 5, limit=10, token="tok")
    assert [t.key for t in tasks] == ["a", "c"]
    bad = (await dump(redis))["t:bad"]
    assert (bad["st"], bad["finished"]) == ("f", NOW + 5)
    assert bad["last_err"].startswith(b"undecodable record: ")
    assert (await dump(redis))["ff"] == {"bad": NOW + 5}


async def test_undecodable_headers_are_started_unsendable(store: Store, redis: Redis) -> None:
    """A record whose headers cannot be read is started with the reason, to be failed unsent
    at its time by the executor (tests/test_dispatcher.py); the other attempts of the same
    start call go ahead."""
    await seed(redis, {"t:a": rec("delivering", claim="tok"),
                       "t:bad": rec("delivering", claim="tok", headers="no colon"),
                       "ls": {"a": NOW + 9, "bad": NOW + 9}})
    started = await store.start(B, claims=[("a", "tok"), ("bad", "tok")])
    assert [(s.attempt, s.unsendable is None) for s in started] == [(1, True), (1, False)]
    assert (started[1].unsendable or "").startswith("undecodable record: ")
    [view] = await store.views(B, ["bad"])
    assert view is not None and view.status is TaskStatus.DELIVERING
    assert (await dump(redis))["ls"] == {"a": NOW + 9, "bad": NOW + 9}


# -- a claim reply's task (record.claimed_task reads the head by position) -----------------------

def _claim_prefix(**fields: Any) -> bytes:
    raw = layout.template(url="http://127.0.0.1:9/cb", method="PUT", headers=[("a", "1")],
                          body=b"x", due_ms=1_800_000_000_123, timeout_ms=9_000,
                          max_attempts=4, backoff_ms=700, fingerprint="f", flow="flow-1")
    head = layout.unpack_head(raw)
    head.update(fields)
    whole = layout.pack_head(head) + raw[layout.HEAD_SIZE:]
    return whole[:layout.HEAD_SIZE + head["fl"] + head["ul"]]


def test_a_claimed_task_has_what_the_head_flow_and_url_say() -> None:
    prefix = _claim_prefix(att=2, exec=1_800_000_000_000, created=1_799_999_999_000)
    head, flow, url = layout.split(prefix)
    assert claimed_task("k", 3, "tok", prefix) == ClaimedTask(
        key="k", bucket=3, token="tok", due_ms=head["due"], execute_at_ms=head["exec"],
        created_ms=head["created"], attempts=2, max_attempts=4, backoff_ms=700,
        timeout_ms=9_000, url=url.decode(), method="PUT", flow=flow.decode())
    assert (head["due"], head["exec"], head["created"]) == (
        1_800_000_000_123, 1_800_000_000_000, 1_799_999_999_000)


@pytest.mark.parametrize("damage", ["short head", "version", "method", "url past the end",
                                    "flow not UTF-8"])
def test_a_damaged_claim_prefix_is_a_bad_record_as_split_says(damage: str) -> None:
    prefix = _claim_prefix()
    if damage == "short head":
        prefix = prefix[:layout.HEAD_SIZE - 1]
    elif damage == "version":
        prefix = bytes([3]) + prefix[1:]
    elif damage == "method":
        prefix = _claim_prefix(meth="X")
    elif damage == "url past the end":
        prefix = prefix[:-1]
    else:
        prefix = prefix[:layout.HEAD_SIZE] + b"\xff" + prefix[layout.HEAD_SIZE + 1:]
    with pytest.raises(layout.BadRecord):
        claimed_task("k", 0, "tok", prefix)
    if damage not in ("method", "flow not UTF-8"):  # split reads neither
        with pytest.raises(layout.BadRecord):
            layout.split(prefix)

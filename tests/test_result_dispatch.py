"""Result callbacks through the dispatcher (respx answers): the executor keeps the answer's body
only for a task that has a result callback, bounded by TIMEWHEEL_RESULT_BODY_BYTES, and the
outcome that finishes the task creates its result task, which is then sent like any task."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from tests.support.waiting import wait_until
from tests.test_dispatcher import URL, Harness
from timewheel.clock import FakeClock
from timewheel.store import Store

OK_URL = "http://127.0.0.1:9/results/ok"
FAIL_URL = "http://127.0.0.1:9/results/failed"


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as mock:
        yield mock


@pytest.fixture
async def wheel(store: Store, fake_clock: FakeClock, router: respx.MockRouter
                ) -> AsyncIterator[Harness]:
    harness = Harness(store, fake_clock)
    yield harness
    await harness.dispatcher.stop(0.1)
    await harness.sender.aclose()


def checks(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The last check and the word of the write that every send gets (LastCheck)."""
    return {"ready": kwargs["ready"], "written": kwargs["written"]}


@pytest.fixture
def sent_with(wheel: Harness, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of every request the sender sends."""
    calls: list[dict[str, Any]] = []
    send = wheel.sender.send

    async def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return await send(*args, **kwargs)
    monkeypatch.setattr(wheel.sender, "send", spy)
    return calls


async def test_delivered_task_creates_its_success_task(
        wheel: Harness, router: respx.MockRouter, sent_with: list[dict[str, Any]]) -> None:
    """The answer's whole body (3,000 bytes, more than the history's 1,024) goes into the
    result; the history keeps its own cut; the result task is then sent like any task."""
    answer = "ü" + "x" * 2998
    router.post(URL).respond(200, text=answer, headers={"X-Request-Id": "r-1"})
    results = router.post(OK_URL).respond(204)
    await wheel.add("job-1", on_success=OK_URL, on_failure=FAIL_URL)
    await wheel.fire("job-1")

    assert sent_with == [{**checks(sent_with[0]), "keep_body": 65536}]
    record = await wheel.store.get("job-1.on_success")
    assert record is not None and await wheel.store.get("job-1.on_failure") is None
    assert (record.callback_url, record.method, record.status.value) == (OK_URL, "POST",
                                                                         "scheduled")
    payload = json.loads(record.body or b"")
    parent = await wheel.view("job-1")
    assert payload == {
        "key": "job-1", "outcome": "delivered", "attempt": 1, "status_code": 200,
        "response_headers": {"content-type": "text/plain; charset=utf-8",
                             "content-length": str(len(answer.encode())),
                             "x-request-id": "r-1"},
        "response_body": answer, "response_body_truncated": False,
        "scheduled_at": parent.execute_at, "finished_at": parent.finished_at}
    attempts = await wheel.store.attempts("job-1")
    assert attempts is not None and attempts[0].response_body_truncated
    assert attempts[0].response_body == ("ü" + "x" * 1022)  # its first 1,024 bytes

    await wheel.fire("job-1.on_success")
    assert results.call_count == 1
    request = results.calls.last.request
    assert json.loads(request.content) == payload
    assert request.headers["webhook-id"] == "job-1.on_success"
    assert (await wheel.view("job-1.on_success")).status == "succeeded"
    assert sent_with[1] == checks(sent_with[1])  # a result task keeps no body


async def test_a_task_without_result_callback_keeps_no_more_body(
        wheel: Harness, router: respx.MockRouter, sent_with: list[dict[str, Any]]) -> None:
    router.post(URL).respond(200, text="y" * 5000)
    await wheel.add("job-1")
    await wheel.fire("job-1")
    assert sent_with == [checks(sent_with[0])]
    assert await wheel.store.get("job-1.on_success") is None


async def test_the_body_is_cut_at_the_setting(wheel: Harness, router: respx.MockRouter) -> None:
    wheel.sender.result_body = 100
    router.post(URL).respond(200, content=b"\x00\xff" * 200)
    await wheel.add("job-1", on_success=OK_URL)
    await wheel.fire("job-1")
    record = await wheel.store.get("job-1.on_success")
    assert record is not None
    payload = json.loads(record.body or b"")
    assert payload["response_body_base64"] is True and payload["response_body_truncated"]
    assert base64.b64decode(payload["response_body"]) == b"\x00\xff" * 50


async def test_failure_calls_on_failure_after_the_last_attempt_only(
        wheel: Harness, router: respx.MockRouter) -> None:
    """Attempt 1 of 2 is retried: no result yet (complete is the only place one is made, and
    it recorded a retry). Attempt 2 fails the task: on_failure, never on_success."""
    router.post(URL).mock(side_effect=[httpx.Response(503, text="busy"),
                                       httpx.Response(500, text="broken")])
    await wheel.add("job-1", on_success=OK_URL, on_failure=FAIL_URL, max_attempts=2)
    await wheel.fire("job-1")
    assert (await wheel.view("job-1")).status == "retrying"
    assert await wheel.store.get("job-1.on_failure") is None
    wheel.clock.set((await wheel.store.get("job-1")).due_ms or 0)  # type: ignore[union-attr]
    await wheel.fire("job-1")
    assert (await wheel.view("job-1")).status == "failed"
    record = await wheel.store.get("job-1.on_failure")
    assert record is not None and await wheel.store.get("job-1.on_success") is None
    payload = json.loads(record.body or b"")
    assert (payload["outcome"], payload["attempt"], payload["status_code"],
            payload["response_body"]) == ("failed", 2, 500, "broken")


async def test_no_answer_reports_no_status(wheel: Harness, router: respx.MockRouter) -> None:
    router.post(URL).mock(side_effect=httpx.ConnectError("refused"))
    await wheel.add("job-1", on_failure=FAIL_URL, max_attempts=1)
    await wheel.fire("job-1")
    record = await wheel.store.get("job-1.on_failure")
    assert record is not None
    payload = json.loads(record.body or b"")
    assert (payload["status_code"], payload["response_headers"], payload["response_body"],
            payload["response_body_truncated"]) == (None, {}, "", False)


async def test_a_failing_result_task_calls_nothing_further(
        wheel: Harness, router: respx.MockRouter) -> None:
    router.post(URL).respond(404)
    router.post(FAIL_URL).respond(410)
    await wheel.add("job-1", on_success=OK_URL, on_failure=FAIL_URL)
    await wheel.fire("job-1")
    await wheel.fire("job-1.on_failure")
    assert (await wheel.view("job-1.on_failure")).status == "failed"
    for suffix in (".on_success", ".on_failure"):
        assert await wheel.store.get(f"job-1.on_failure{suffix}") is None


async def test_an_empty_answer_is_an_empty_body_in_the_history_as_in_the_result(
        wheel: Harness, router: respx.MockRouter) -> None:
    """An answer with no body is "" in the attempt history, as in the result callback; no
    answer at all (a refused connection), or no body kept, is null there, and not "cut"
    (TIMEWHEEL_ATTEMPT_BODY_BYTES=0 keeps none: it said truncated, an outside audit found)."""
    router.post(URL).respond(204)
    await wheel.add("job-1", on_success=OK_URL)
    await wheel.fire("job-1")
    record = await wheel.store.get("job-1.on_success")
    assert record is not None and json.loads(record.body or b"")["response_body"] == ""
    await wheel.add("job-2")
    await wheel.fire("job-2")
    router.post(URL).mock(side_effect=httpx.ConnectError("refused"))
    await wheel.add("job-3", max_attempts=1)
    await wheel.fire("job-3")
    router.post(URL).respond(200, text="kept nowhere")
    wheel.sender.keep_body = 0  # TIMEWHEEL_ATTEMPT_BODY_BYTES=0 keeps none
    await wheel.add("job-4")
    await wheel.fire("job-4")
    bodies = [[(a.response_body, a.response_body_truncated)
               for a in await wheel.store.attempts(key) or []]
              for key in ("job-1", "job-2", "job-3", "job-4")]
    assert bodies == [[("", False)], [("", False)], [(None, False)], [(None, False)]]


async def test_a_record_that_does_not_open_fails_at_its_time_unsent_with_its_on_failure(
        wheel: Harness, router: respx.MockRouter) -> None:
    """Headers that cannot be decoded (as a record sealed under a key id no longer listed):
    nothing is sent; the attempt fails at its time, not before, numbered as counted, with
    the reason in the history and as last_error, and the on_failure result is created (it
    was failed at start, before its time, as attempt 0, with no result: an outside audit)."""
    from timewheel.store import layout

    sent = router.post(URL).respond(200)
    await wheel.add("job-1", on_failure=FAIL_URL)
    stored = await wheel.store.record("job-1")
    assert stored is not None
    await wheel.store.redis.set(wheel.store.keys.task("job-1"),
                                layout.encode({**stored, "headers": b"no colon"}))
    [task] = await wheel.claim("job-1")
    wheel.dispatcher.submit([task], wheel.clock.now_ms())
    wheel.clock.set(task.due_ms - 1)  # past its start check, before its time

    async def decided() -> bool:  # started, or (too early) failed
        raw = await wheel.raw("job-1")
        return raw.get("started") == "1" or raw["status"] != "delivering"

    await wait_until(decided, "its start")
    await asyncio.sleep(0.05)  # room for a failure decided too early to be written
    assert (await wheel.view("job-1")).status == "delivering"
    wheel.clock.set(task.due_ms)
    await wheel.settle()
    assert sent.call_count == 0
    view = await wheel.view("job-1")
    assert (view.status, view.attempts) == ("failed", 1)
    assert (view.last_error or "").startswith("undecodable record: ")
    [entry] = await wheel.store.attempts("job-1") or []
    assert (entry.attempt, entry.outcome, entry.error) == (1, "failed", view.last_error)
    result = await wheel.store.get("job-1.on_failure")
    assert result is not None
    payload = json.loads(result.body or b"")
    assert (payload["outcome"], payload["attempt"], payload["status_code"]) == ("failed", 1,
                                                                                None)


class KeepsNothing:
    """A sender with TIMEWHEEL_ATTEMPT_BODY_BYTES=0 as the wire sender answers: no body kept,
    and ``body_truncated`` when the answer had one (httpx's sender, under respx, says not)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.keep_body, self.result_body = inner, 0, inner.result_body

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        answer = await self.inner.send(*args, **kwargs)
        return dataclasses.replace(answer, body=b"", body_truncated=bool(answer.body))

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_no_body_kept_is_none_cut(store: Store, fake_clock: FakeClock,
                                        router: respx.MockRouter) -> None:
    """TIMEWHEEL_ATTEMPT_BODY_BYTES=0 keeps no body: the history says null, not cut (the
    outside audit saw response_body_truncated true)."""
    router.post(URL).respond(200, text="kept nowhere")
    wheel = Harness(store, fake_clock, sender=KeepsNothing)
    try:
        await wheel.add("job-1")
        await wheel.fire("job-1")
        [entry] = await wheel.store.attempts("job-1") or []
        assert (entry.response_body, entry.response_body_truncated) == (None, False)
    finally:
        await wheel.dispatcher.stop(0.1)
        await wheel.sender.aclose()


async def test_an_outcome_that_cannot_be_written_does_not_keep_its_batch_mates_unwritten(
        wheel: Harness, router: respx.MockRouter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outcomes answered together are written in one complete call. One that cannot be
    written (a bug: session 29's audit found a result body that could not be encoded) failed
    that call for all of them, and their retries, made together, failed together until
    their leases ran out: every task of the batch was sent again. A retry after an error
    that is not Redis's goes alone, so the others are written."""
    from timewheel.store.results import ResultCallback

    payload = ResultCallback.payload

    def poisoned(self: ResultCallback, key: str, finished_ms: int) -> bytes:
        if key == "job-1":
            raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")
        return payload(self, key, finished_ms)

    monkeypatch.setattr(ResultCallback, "payload", poisoned)
    router.post(URL).respond(200)
    for key in ("job-1", "job-2", "job-3"):
        await wheel.add(key, on_success=OK_URL)
    tasks = await wheel.claim(None)
    assert sorted(t.key for t in tasks) == ["job-1", "job-2", "job-3"]
    wheel.dispatcher.submit(tasks, wheel.clock.now_ms())
    wheel.clock.set(max(t.due_ms for t in tasks))

    async def written() -> bool:
        return [(await wheel.view(k)).status for k in ("job-2", "job-3")] == [
            "succeeded", "succeeded"]

    await wait_until(written, "the batch mates' outcomes written")
    assert (await wheel.view("job-1")).status == "delivering"  # its lease will do
    assert await wheel.store.get("job-2.on_success") is not None

"""``/flows`` over HTTP (docs/api.md, Flow control): views, defaults, bad input changes
nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS

FLOW = "api.example.com:443"
# What a view adds to the limits when no pause or retry default is set.
UNSET = {"paused": False, "max_attempts": None, "retry_backoff": None, "max_backoff": None}


async def flow_keys(redis: Redis) -> list[str]:
    return sorted([k.decode() async for k in redis.scan_iter(match="*f:*")])


async def test_a_flow_never_set_shows_the_defaults(client: httpx.AsyncClient) -> None:
    response = await client.get(f"/flows/{FLOW}")
    assert response.status_code == 200
    assert response.json() == {"key": FLOW, "parallelism": 100, "rate": None, "in_flight": 0,
                               "waiting": 0, **UNSET}


async def test_put_get_delete(client: httpx.AsyncClient, redis: Redis) -> None:
    response = await client.put(f"/flows/{FLOW}", json={"parallelism": 3, "rate": 10})
    assert response.status_code == 200
    assert response.json() == {"key": FLOW, "parallelism": 3, "rate": 10.0, "in_flight": 0,
                               "waiting": 0, **UNSET}
    assert (await client.get(f"/flows/{FLOW}")).json()["parallelism"] == 3
    assert (await client.get("/flows")).json() == {"flows": [response.json()]}

    # null = no limit of that kind (the default parallelism still applies)
    response = await client.put(f"/flows/{FLOW}", json={"parallelism": None, "rate": 0.5})
    assert response.json()["parallelism"] == 100 and response.json()["rate"] == 0.5

    assert (await client.delete(f"/flows/{FLOW}")).status_code == 204
    assert (await client.get(f"/flows/{FLOW}")).json()["rate"] is None
    assert (await client.get("/flows")).json() == {"flows": []}
    assert await flow_keys(redis) == []


async def test_in_flight_and_waiting(client: httpx.AsyncClient, redis: Redis) -> None:
    """in_flight counts live permits over every process; waiting, tasks parked in Redis plus
    those that live processes reported waiting in their memory (an expired report is not
    counted)."""
    prefix = "{tw:f:" + FLOW + "}:"
    await redis.zadd(prefix + "held", {"p1": START_MS + 60_000, "p2": START_MS + 60_000,
                                       "gone": START_MS - 1})
    for bucket, parked in ((3, ["t1", "t2"]), (7, ["t3"])):  # as lua/park.lua parks them
        await redis.zadd(f"{{tw:{bucket}}}:pw:{FLOW}", dict.fromkeys(parked, START_MS))
        await redis.zadd(f"{{tw:{bucket}}}:pf", {FLOW: START_MS})
    body = (await client.get(f"/flows/{FLOW}")).json()
    assert (body["in_flight"], body["waiting"]) == (2, 3)

    await redis.zadd("{tw:wl}:live", {"a": START_MS + 3000, "b": START_MS + 3000,
                                      "dead": START_MS - 1})
    await redis.hset("{tw:wl}:p:a", mapping={FLOW: 4, "other:443": 100})
    await redis.hset("{tw:wl}:p:b", mapping={FLOW: 5})
    await redis.hset("{tw:wl}:p:dead", mapping={FLOW: 1000})
    body = (await client.get(f"/flows/{FLOW}")).json()
    assert body["waiting"] == 3 + 4 + 5


async def test_retry_defaults_and_pause(client: httpx.AsyncClient, redis: Redis) -> None:
    """PUT stores the whole configuration; pause and resume change only the pause."""
    body = {"parallelism": 2, "max_attempts": 20, "retry_backoff": 30, "max_backoff": 86_400}
    response = await client.put(f"/flows/{FLOW}", json=body)
    assert response.status_code == 200, response.text
    expected = {"key": FLOW, "parallelism": 2, "rate": None, "in_flight": 0, "waiting": 0,
                "paused": False, "max_attempts": 20, "retry_backoff": 30.0,
                "max_backoff": 86_400.0}
    assert response.json() == expected
    response = await client.post(f"/flows/{FLOW}/pause")
    assert response.status_code == 200
    assert response.json() == {**expected, "paused": True}
    assert (await client.get(f"/flows/{FLOW}")).json()["paused"] is True
    assert (await client.get("/flows")).json() == {"flows": [{**expected, "paused": True}]}
    response = await client.post(f"/flows/{FLOW}/resume")
    assert response.json() == expected
    # A PUT replaces the whole configuration: paused true, the rest cleared.
    response = await client.put(f"/flows/{FLOW}", json={"paused": True})
    assert response.json() == {"key": FLOW, "parallelism": 100, "rate": None, "in_flight": 0,
                               "waiting": 0, **UNSET, "paused": True}
    # A flow only paused is listed; resumed, it is back to the defaults and not listed.
    assert [f["key"] for f in (await client.get("/flows")).json()["flows"]] == [FLOW]
    await client.post(f"/flows/{FLOW}/resume")
    assert (await client.get("/flows")).json() == {"flows": []}
    assert await flow_keys(redis) == []


async def test_pause_a_flow_never_set(client: httpx.AsyncClient) -> None:
    response = await client.post("/flows/tenant-9/pause")
    assert response.status_code == 200
    assert response.json()["paused"] is True and response.json()["parallelism"] == 100
    assert (await client.post("/flows/a b/pause")).status_code == 422


@pytest.mark.parametrize("body", [
    {"parallelism": 0}, {"parallelism": 10_001}, {"parallelism": "3"}, {"parallelism": 2.5},
    {"rate": 0}, {"rate": -1}, {"rate": 100_001}, {"rate": "10"}, {"rate": True},
    {"parallelism": 3, "extra": 1}, [], "x",
    {"paused": "true"}, {"paused": 1}, {"paused": None},
    {"max_backoff": 86_401}, {"max_backoff": 0}, {"retry_backoff": 86_400.5},
    {"retry_backoff": -1}, {"max_attempts": 0}, {"max_attempts": 101}, {"max_attempts": "5"},
    {"max_attempts": 2.5}, {"max_backoff": "60"},
])
async def test_bad_limits_422_and_nothing_stored(client: httpx.AsyncClient, redis: Redis,
                                                 body: Any) -> None:
    response = await client.put(f"/flows/{FLOW}", json=body)
    assert response.status_code == 422, response.text
    assert await flow_keys(redis) == []


@pytest.mark.parametrize("key", ["a/b", "a b", "a%20b", "ä", "x" * 201, "a{b}"])
async def test_bad_flow_key_422(client: httpx.AsyncClient, redis: Redis, key: str) -> None:
    for method in ("PUT", "GET", "DELETE"):
        response = await client.request(method, f"/flows/{key}", json={"parallelism": 2})
        assert response.status_code == 422, (method, key, response.text)
        assert response.json()["detail"][0]["loc"] == ["path", "flow_key"]
    assert await flow_keys(redis) == []


async def test_task_flow_key_is_validated(client: httpx.AsyncClient, redis: Redis) -> None:
    url = "http://127.0.0.1:9/cb"
    for bad in ("a/b", "", "x" * 201, 5):
        response = await client.post("/tasks", json={"callback_url": url, "flow_key": bad})
        assert response.status_code == 422, bad
    assert [k async for k in redis.scan_iter(match="*t:*")] == []
    response = await client.post("/tasks", json={"callback_url": url, "flow_key": "tenant-7",
                                                 "key": "k1"})
    assert response.status_code == 201
    assert await _flow(redis, "k1") == b"tenant-7"


@pytest.mark.parametrize(("url", "flow"), [
    ("https://API.Example.com/x", "api.example.com:443"),
    ("http://api.example.com/x", "api.example.com:80"),
    ("http://api.example.com:8080/x", "api.example.com:8080"),
    ("http://[::1]:9/x", "--1:9"),
])
async def test_default_flow_is_the_destination(client: httpx.AsyncClient, redis: Redis,
                                               url: str, flow: str) -> None:
    response = await client.post("/tasks", json={"callback_url": url, "key": "k1"})
    assert response.status_code == 201, response.text
    assert await _flow(redis, "k1") == flow.encode()


async def test_metrics_only_for_configured_flows(client: httpx.AsyncClient) -> None:
    await client.put("/flows/tenant-1", json={"parallelism": 5})
    text = (await client.get("/metrics")).text
    assert 'timewheel_flow_in_flight{flow="tenant-1"} 0.0' in text
    assert 'timewheel_flow_waiting{flow="tenant-1"} 0.0' in text
    await client.get(f"/flows/{FLOW}")  # never set: no series
    await client.delete("/flows/tenant-1")
    text = (await client.get("/metrics")).text
    assert 'flow="' not in text


def _bucket(key: str) -> int:
    import zlib
    return zlib.crc32(key.encode()) % 16


async def _flow(redis: Redis, key: str) -> bytes:
    """The flow stored in a task's record (timewheel/store/layout.py)."""
    from timewheel.store import layout
    raw = await redis.get("{tw:" + str(_bucket(key)) + "}:t:" + key)
    return bytes(layout.decode(raw)["flow"])


async def test_pause_paths_take_only_post(client: httpx.AsyncClient, redis: Redis) -> None:
    """Another method on a shorthand's path is a 405 naming POST, not a 422 for a flow key
    "x/pause"; a flow may still be called "pause" itself."""
    for method in ("GET", "PUT", "DELETE"):
        response = await client.request(method, "/flows/x/pause", json={"parallelism": 2})
        assert (response.status_code, response.headers["allow"]) == (405, "POST"), method
    assert await flow_keys(redis) == []
    response = await client.put("/flows/pause", json={"parallelism": 2})
    assert response.status_code == 200 and response.json()["key"] == "pause"
    assert (await client.get("/flows/resume")).json()["key"] == "resume"


def test_a_flow_never_labelled_leaves_the_series_without_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: a flow listed by a scrape whose state read then failed was in the
    series set but never labelled; older prometheus-client releases raise KeyError removing
    it, and every later scrape of the outage failed the same way. Simulated here."""
    from types import SimpleNamespace

    from prometheus_client import Gauge

    from timewheel.api import flows
    from timewheel.metrics import Metrics

    def strict_remove(self: Gauge, *labels: str) -> None:
        if labels not in self._metrics:
            raise KeyError(labels)
        del self._metrics[labels]

    monkeypatch.setattr(Gauge, "remove", strict_remove)
    metrics = Metrics()
    metrics.flow_in_flight.labels("labelled").set(1)
    metrics.flow_waiting_total.labels("labelled").set(1)
    metrics.flow_series = {"labelled", "never-labelled"}
    flows.drop_gauges(SimpleNamespace(metrics=metrics))  # type: ignore[arg-type]
    assert metrics.flow_series == set()

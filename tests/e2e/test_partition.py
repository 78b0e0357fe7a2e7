"""A serve process cut off from Redis by a network partition, while another process still
reaches it (tests/support/partition_proxy.py between the first process and Redis).

What the cut process answered 503 for must not take effect once the partition heals: the
client has seen the 503 and acted on it through the other process. The cut process's Redis
client aborts a connection it gave up on (SO_LINGER 0 and the transport aborted,
timewheel/store/connection.py ``AbortiveClose``), so the request it could not deliver is
dropped; a normal close would leave the kernel retransmitting it, and Redis would run it
after the heal, over the client's later write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Service
from tests.support.partition_proxy import PartitionProxy, forwarding
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.e2e

# The cut process answers once its Redis client gives up: after one socket timeout (5 s; a
# timeout is not tried again on a single Redis: timewheel/store/connection.py).
ANSWER_WITHIN_S = 60


@pytest.fixture
def proxy(redis_server_e2e: RedisServer) -> Iterator[PartitionProxy]:
    with forwarding(redis_server_e2e.port) as forwarder:
        yield forwarder


def call(service: Service, method: str, path: str, body: Any = None) -> httpx.Response:
    with httpx.Client(base_url=service.base_url, timeout=ANSWER_WITHIN_S) as client:
        return client.request(method, path, json=body)


def test_a_put_answered_503_in_a_partition_does_not_land_after_it_heals(
        start_service: Callable[..., Service], proxy: PartitionProxy,
        receiver: ThreadedReceiver) -> None:
    """Through the cut process, a PUT of task `moved` answered 503; then, through the other,
    the client puts `moved` as it wants it instead. After the heal the task fires as the later
    PUT says, once, and the earlier one never lands (it would replace the later one: a DELETE
    answered 503 would cancel it in the same way)."""
    cut, other = start_service(redis_url=proxy.url), start_service()
    with ThreadPoolExecutor(8) as pool:  # idle connections to Redis in the cut one's pool
        gets = [pool.submit(call, cut, "GET", "/tasks/moved") for _ in range(8)]
        assert {get.result().status_code for get in gets} == {404}
    proxy.partition()
    put = call(cut, "PUT", "/tasks/moved", {"callback_url": receiver.url("/old"), "delay": 1})
    assert put.status_code == 503, put.text
    assert call(other, "PUT", "/tasks/moved", {"callback_url": receiver.url("/new"),
                                               "delay": 2}).status_code == 201
    proxy.heal()  # a request held in the partition would run now, before the task is due

    receiver.wait_for_sync(1, timeout=30)
    view = call(cut, "GET", "/tasks/moved").json()  # the cut process is back, too
    assert (view["status"], view["callback_url"]) == ("succeeded", receiver.url("/new"))
    assert [a.path for a in receiver.arrivals] == ["/new"]

"""Review of b5e77f6: a refused callback URL's hint now says "or list its network in
TIMEWHEEL_ALLOWED_NETWORKS". For the name localhost (the first hour's usual receiver) that
was untrue: the name was refused whatever the allowed networks, 127.0.0.0/8 listed or not."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from timewheel.delivery.netguard import BlockedAddress, NetworkPolicy
from timewheel.settings import Settings

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


@pytest.mark.parametrize("url", ["http://localhost:9000/hook", "http://api.localhost/x"])
def test_a_loopback_name_passes_once_loopback_is_an_allowed_network(url: str) -> None:
    NetworkPolicy(allowed_networks=LOOPBACK).check_url_host(url)
    NetworkPolicy(allowed_networks=LOOPBACK[:1]).check_url_host(url)
    with pytest.raises(BlockedAddress, match="a loopback name"):
        NetworkPolicy(allowed_networks=(ipaddress.ip_network("10.0.0.0/8"),)).check_url_host(url)
    with pytest.raises(BlockedAddress, match="a loopback name"):
        NetworkPolicy().check_url_host(url)


async def test_the_hint_is_followed_and_the_task_is_created(
        make_client, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    strict = settings.model_copy(update={"allow_private_networks": False})
    body = {"key": "local", "callback_url": "http://localhost:9000/hook", "delay": 60}
    async with make_client(strict) as client:
        r: httpx.Response = await client.post("/tasks", json=body)
        assert r.status_code == 422
        assert "TIMEWHEEL_ALLOWED_NETWORKS" in r.json()["detail"][0]["msg"]
    allowed = strict.model_copy(update={"allowed_networks": [LOOPBACK[0]]})
    async with make_client(allowed) as client:
        r = await client.post("/tasks", json=body)
        assert r.status_code == 201, r.text

"""Operations endpoints: health and metrics."""

from __future__ import annotations

import asyncio
import math

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from timewheel.api import flows
from timewheel.api.deps import WheelDep, get_wheel
from timewheel.errors import StoreUnavailable
from timewheel.service import Wheel

router = APIRouter(tags=["operations"])
metrics_router = APIRouter(tags=["operations"])
GAUGES_READ_S = 3.0  # how long a scrape waits for the per-flow gauges' Redis reads


@router.get("/healthz")
async def healthz(wheel: WheelDep) -> JSONResponse:
    """200 when Redis answers, 503 otherwise."""
    try:
        await wheel.store.ping()
    except StoreUnavailable:
        return JSONResponse({"status": "unavailable"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/livez")
async def livez() -> JSONResponse:
    """200 whenever this process's event loop answers, Redis or not: the liveness probe's
    endpoint. A restart cures no Redis outage (the service recovers by itself when Redis is
    back), and restarts during a long one put pods into crash-loop back-off, which delays
    them when Redis returns; a loop that answers nothing is what a restart does cure."""
    return JSONResponse({"status": "ok"})


@metrics_router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    """Prometheus text format. Served while Redis is away too: that is when an operator needs
    this process's own counters (failed ticks, callbacks in flight). So the wheel is taken
    without ``WheelDep``, which answers 503 until Redis has answered once since the start: a
    process started during an outage is scraped too (``timewheel_redis_up 0``)."""
    wheel: Wheel = request.state.wheel
    try:
        # Bounded: a cluster client retries a silent master for minutes, and a scrape that
        # outlasts Prometheus's timeout (10 s by default) shows nothing at all.
        await asyncio.wait_for(_refresh_gauges(request), GAUGES_READ_S)
    except (StoreUnavailable, TimeoutError):
        wheel.metrics.redis_up.set(0)
        flows.drop_gauges(wheel)  # unknown now: better absent than stale
        wheel.metrics.redis_memory.set(math.nan)  # no labels to drop it by: NaN, "unknown"
    else:
        wheel.metrics.redis_up.set(1)
    return Response(generate_latest(wheel.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _refresh_gauges(request: Request) -> None:
    """The gauges read from Redis at a scrape: the per-flow ones and Redis's memory (after
    the wheel's first read of Redis, when Redis was away at the start)."""
    wheel = await get_wheel(request)
    await flows.refresh_gauges(wheel)
    wheel.metrics.redis_memory.set(await wheel.store.memory_used())

"""Operations endpoints: health and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from timewheel.api import flows
from timewheel.api.deps import WheelDep
from timewheel.errors import StoreUnavailable

router = APIRouter(tags=["operations"])
metrics_router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz(wheel: WheelDep) -> JSONResponse:
    """200 when Redis answers, 503 otherwise."""
    try:
        await wheel.store.ping()
    except StoreUnavailable:
        return JSONResponse({"status": "unavailable"}, status_code=503)
    return JSONResponse({"status": "ok"})


@metrics_router.get("/metrics", response_class=PlainTextResponse)
async def metrics(wheel: WheelDep) -> Response:
    """Prometheus text format."""
    await flows.refresh_gauges(wheel)
    return Response(generate_latest(wheel.metrics.registry), media_type=CONTENT_TYPE_LATEST)

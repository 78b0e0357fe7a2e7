"""``/flows``: a flow's limits, in force over every process at once (docs/api.md, Flow control)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from fastapi.exceptions import RequestValidationError

from timewheel.api.deps import Needs, WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.models import KEY_PATTERN
from timewheel.models.flows import FlowLimits, FlowList, FlowView
from timewheel.service import Wheel
from timewheel.store.flow_store import StoredLimits

router = APIRouter(prefix="/flows", tags=["flows"], route_class=TaskRoute)

_KEY = re.compile(KEY_PATTERN)
_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such path (a flow key with a line break)"},
    503: {"description": "Redis unavailable"}}
# ``:path`` so that a key with a slash reaches the check below (422) instead of matching no
# route at all (404): the key is wrong, not the address.
FlowKey = Annotated[str, Path(pattern=KEY_PATTERN,
                                description="the flow key: 1-200 chars of [A-Za-z0-9._:-]")]


def _checked(flow_key: str) -> str:
    if not _KEY.fullmatch(flow_key):
        raise RequestValidationError([{
            "type": "string_pattern_mismatch", "loc": ("path", "flow_key"),
            "msg": f"String should match pattern '{KEY_PATTERN}'", "input": flow_key}])
    return flow_key


async def _view(wheel: Wheel, flow_key: str) -> FlowView:
    limits = await wheel.flows.limits(flow_key)
    return FlowView(
        key=flow_key,
        parallelism=limits.parallelism or wheel.settings.flow_parallelism,
        rate=limits.rate,
        in_flight=await wheel.flows.in_flight(flow_key, now_ms=wheel.clock.now_ms()),
        waiting=await wheel.store.parked_count(flow_key),
    )


@router.get("", dependencies=[Needs.READ], response_model=FlowList, responses=_RESPONSES)
async def list_flows(wheel: WheelDep) -> FlowList:
    """Flows whose limits were set with PUT (every other flow runs on the defaults)."""
    return FlowList(flows=[await _view(wheel, key) for key in await wheel.flows.configured()])


@router.put("/{flow_key:path}", dependencies=[Needs.ADMIN],
            response_model=FlowView, responses=_RESPONSES)
async def set_flow(flow_key: FlowKey, body: FlowLimits, wheel: WheelDep) -> FlowView:
    """Set a flow's limits; every process obeys them from its next permit on."""
    await wheel.flows.set_limits(_checked(flow_key),
                                 StoredLimits(body.parallelism, body.rate))
    return await _view(wheel, flow_key)


@router.get("/{flow_key:path}", dependencies=[Needs.READ],
            response_model=FlowView, responses=_RESPONSES)
async def get_flow(flow_key: FlowKey, wheel: WheelDep) -> FlowView:
    """A flow's limits in force (the defaults for a flow never set) and its load now."""
    return await _view(wheel, _checked(flow_key))


@router.delete("/{flow_key:path}", dependencies=[Needs.ADMIN],
               status_code=204, response_class=Response,
               responses=_RESPONSES)
async def delete_flow(flow_key: FlowKey, wheel: WheelDep) -> Response:
    """Back to the defaults."""
    await wheel.flows.delete_limits(_checked(flow_key))
    return Response(status_code=204)


async def refresh_gauges(wheel: Wheel) -> None:
    """Per-flow gauges for the flows with limits set (a series per default flow would be one
    per destination: unbounded)."""
    metrics = wheel.metrics
    shown = set(await wheel.flows.configured())
    for gone in metrics.flow_series - shown:
        metrics.flow_in_flight.remove(gone)
        metrics.flow_waiting_total.remove(gone)
    metrics.flow_series = shown
    for key in shown:
        view = await _view(wheel, key)
        metrics.flow_in_flight.labels(key).set(view.in_flight)
        metrics.flow_waiting_total.labels(key).set(view.waiting)

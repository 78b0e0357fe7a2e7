"""``/flows``: a flow's limits, pause and retry defaults, in force over every process at once
(docs/api.md, "Flow control" and v3 "Flows: pause, retry defaults, and what waiting counts")."""

from __future__ import annotations

import contextlib
from collections.abc import Set as AbstractSet
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from starlette.convertors import PathConvertor, register_url_convertor

from timewheel.api.deps import Needs, WheelDep
from timewheel.api.routing import TaskRoute
from timewheel.models import KEY_PATTERN
from timewheel.models.flows import FlowLimits, FlowList, FlowView
from timewheel.operations.flows import FlowState
from timewheel.service import Wheel


class FlowKeyConvertor(PathConvertor):
    """A flow key as a path segment: anything, so that a key with a slash reaches ``FlowKey``'s
    pattern (422, the key is wrong) instead of matching no route (404), except ``<x>/pause`` and
    ``<x>/resume``: those are the POST shorthands' paths, and another method there is a 405
    (with ``Allow: POST``), not a 422 for a flow key "<x>/pause"."""

    regex = r"(?!.+/(?:pause|resume)$).*"


register_url_convertor("flow_key", FlowKeyConvertor())

router = APIRouter(prefix="/flows", tags=["flows"], route_class=TaskRoute)

_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such path (a flow key with a line break)"},
    503: {"description": "Redis unavailable"}}
# Matched with the path-like convertor above, then checked by the pattern (422 for a bad key).
FlowKey = Annotated[str, Path(pattern=KEY_PATTERN,
                                description="the flow key: 1-200 chars of [A-Za-z0-9._:-]")]


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _view(state: FlowState) -> FlowView:
    limits = state.limits
    return FlowView(
        key=state.key, parallelism=state.parallelism, rate=limits.rate,
        in_flight=state.in_flight, waiting=state.waiting, paused=limits.paused,
        max_attempts=limits.max_attempts, retry_backoff=_seconds(limits.backoff_ms),
        max_backoff=_seconds(limits.max_backoff_ms))


@router.get("", dependencies=[Needs.READ], response_model=FlowList, responses=_RESPONSES)
async def list_flows(wheel: WheelDep) -> FlowList:
    """Flows whose limits were set with PUT (every other flow runs on the defaults)."""
    flows = wheel.flows
    return FlowList(flows=[_view(state) for state in await flows.states(await flows.configured())])


@router.put("/{flow_key:flow_key}", dependencies=[Needs.ADMIN],
            response_model=FlowView, responses=_RESPONSES)
async def set_flow(flow_key: FlowKey, body: FlowLimits, wheel: WheelDep) -> FlowView:
    """Set a flow's limits, pause and retry defaults (the whole configuration: what is absent
    is cleared); every process obeys them from its next permit on (within one tick)."""
    return _view(await wheel.flows.set(flow_key, body))


@router.post("/{flow_key:path}/pause", dependencies=[Needs.ADMIN],
             response_model=FlowView, responses=_RESPONSES)
async def pause_flow(flow_key: FlowKey, wheel: WheelDep) -> FlowView:
    """Start no attempt of the flow on any process (within one tick; one in flight
    finishes). Its due tasks wait: not failed, not counted as attempts."""
    return _view(await wheel.flows.set_paused(flow_key, True))


@router.post("/{flow_key:path}/resume", dependencies=[Needs.ADMIN],
             response_model=FlowView, responses=_RESPONSES)
async def resume_flow(flow_key: FlowKey, wheel: WheelDep) -> FlowView:
    """Start the flow's waiting tasks again, in due order, within its limits."""
    return _view(await wheel.flows.set_paused(flow_key, False))


@router.get("/{flow_key:flow_key}", dependencies=[Needs.READ],
            response_model=FlowView, responses=_RESPONSES)
async def get_flow(flow_key: FlowKey, wheel: WheelDep) -> FlowView:
    """A flow's limits in force (the defaults for a flow never set) and its load now."""
    return _view(await wheel.flows.state(flow_key))


@router.delete("/{flow_key:flow_key}", dependencies=[Needs.ADMIN],
               status_code=204, response_class=Response,
               responses=_RESPONSES)
async def delete_flow(flow_key: FlowKey, wheel: WheelDep) -> Response:
    """Back to the defaults."""
    await wheel.flows.delete(flow_key)
    return Response(status_code=204)


def drop_gauges(wheel: Wheel, keep: AbstractSet[str] = frozenset()) -> None:
    """Remove the per-flow series of every flow not in ``keep``."""
    metrics = wheel.metrics
    for gone in metrics.flow_series - keep:
        for gauge in (metrics.flow_in_flight, metrics.flow_waiting_total):
            # A flow listed but never labelled (its state read failed): older releases of
            # prometheus-client raise KeyError for it, and every later scrape failed so.
            with contextlib.suppress(KeyError):
                gauge.remove(gone)
    metrics.flow_series &= set(keep)


async def refresh_gauges(wheel: Wheel) -> None:
    """Per-flow gauges for the flows with limits set (a series per default flow would be one
    per destination: unbounded)."""
    metrics = wheel.metrics
    shown = set(await wheel.flows.configured())
    drop_gauges(wheel, keep=shown)
    metrics.flow_series = shown
    keys = sorted(shown)
    for key, state in zip(keys, await wheel.flows.states(keys), strict=True):
        metrics.flow_in_flight.labels(key).set(state.in_flight)
        metrics.flow_waiting_total.labels(key).set(state.waiting)

"""create_app: the FastAPI application, its lifespan and its error mapping (api/errors.py)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.staticfiles import StaticFiles

from timewheel import __version__
from timewheel.api import (
    attempts,
    auth,
    batch,
    errors,
    flows,
    jobs,
    ops,
    schedules,
    stats,
    tasks,
    topics,
    ui,
)
from timewheel.api.create_route import CreateTaskRoute
from timewheel.api.deadline import RequestDeadline
from timewheel.api.deps import Needs
from timewheel.api.limits import BodySizeLimit
from timewheel.api.request_id import RequestId
from timewheel.clock import Clock
from timewheel.delivery.senders import Sender
from timewheel.metrics import Metrics
from timewheel.models import MAX_BODY_BYTES
from timewheel.service import Wheel
from timewheel.settings import Settings
from timewheel.tracing import Tracing

DOCS_ASSETS = "/docs/assets"  # Swagger UI's files (fastapi-offline ships them)
# The whole request may carry the 1 MiB body plus the other fields (URL, headers, ...).
MAX_REQUEST_BYTES = MAX_BODY_BYTES + 128 * 1024


# FastAPI's own OpenTelemetry (the `telemetry` argument, in recent FastAPI) is off: timewheel's
# TraceRequests makes the one SERVER span a request gets (timewheel/tracing.py), and /metrics has
# the metrics. Left on, a process-wide tracer provider (`opentelemetry-instrument timewheel
# serve`) gave every request two SERVER spans. An older FastAPI has neither the argument nor
# the telemetry.
_NO_FASTAPI_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def create_app(settings: Settings | None = None, *, clock: Clock | None = None,
               sender: Sender | None = None, metrics: Metrics | None = None,
               run_ticker: bool = True) -> FastAPI:
    """Build an app. ``clock``, ``sender`` and ``run_ticker=False`` are for tests."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        wheel = await Wheel.open(settings, clock=clock, sender=sender, metrics=metrics)
        if run_ticker:
            wheel.start_ticker()
        app.state.wheel = wheel  # for the server's shutdown (timewheel.cli, ``_Server``)
        try:
            yield {"wheel": wheel}
        finally:
            await wheel.close()

    public_docs = settings.docs_public
    app = FastAPI(
        title="timewheel", version=__version__, lifespan=lifespan,
        description="Calls HTTP URLs at their scheduled millisecond. See docs/api.md.",
        docs_url=None,  # _docs serves Swagger UI from the package, not a CDN
        openapi_url="/openapi.json" if public_docs else None,
        redoc_url=None,
        **_NO_FASTAPI_TELEMETRY,
    )
    app.add_middleware(RequestDeadline, seconds=settings.request_deadline_seconds)
    app.add_middleware(BodySizeLimit, max_bytes=MAX_REQUEST_BYTES)
    Tracing.from_env().instrument(app)  # request spans, only when OTEL_* asks for them
    app.add_middleware(RequestId)  # outermost: 413s and traced requests get an id too
    app.include_router(ops.router)
    app.include_router(ops.metrics_router,
                       dependencies=[] if settings.metrics_public else [Needs.READ])
    app.include_router(batch.router)  # before tasks: /tasks/batch is not /tasks/{key}
    app.include_router(jobs.router)  # likewise /tasks/cancel and /tasks/replay
    app.include_router(tasks.router)
    app.include_router(attempts.router)
    app.include_router(flows.router)
    app.include_router(schedules.router)
    app.include_router(topics.router)
    app.include_router(stats.router)
    app.include_router(auth.router)
    app.include_router(ui.router)  # the dashboard: no token for the page, its calls use one
    app.router.routes.insert(0, CreateTaskRoute())  # POST /tasks, well formed: api/create_route.py
    if not public_docs:
        _private_openapi(app)
    _docs(app, public=public_docs)
    _error_handlers(app)
    return app


def _private_openapi(app: FastAPI) -> None:
    @app.get("/openapi.json", include_in_schema=False, dependencies=[Needs.READ])
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())


def _docs(app: FastAPI, *, public: bool) -> None:
    """``/docs``: Swagger UI with its script, style and icon served from the fastapi-offline
    package (FastAPI's own page loads them from a CDN: a blank page offline, or behind a
    firewall). The assets are public either way; the page follows TIMEWHEEL_DOCS_PUBLIC."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")),
              name="docs-assets")

    @app.get("/docs", include_in_schema=False,
             dependencies=[] if public else [Needs.READ])
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="timewheel",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png")


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            # Starlette's Allow lists only the first route matching the path; /tasks has two.
            routes = [*ops.router.routes, *ops.metrics_router.routes, *batch.router.routes,
                      *tasks.router.routes, *flows.router.routes, *schedules.router.routes,
                      *stats.router.routes, *ui.router.routes, *attempts.router.routes,
                      *auth.router.routes, *jobs.router.routes, *topics.router.routes]
            methods = sorted({method for route in routes if isinstance(route, Route)
                              and route.methods and route.matches(request.scope)[0] != Match.NONE
                              for method in route.methods})
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(methods)}
        return await http_exception_handler(request, exc)

    errors.install(app)

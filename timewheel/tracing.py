"""OpenTelemetry spans around API requests and callbacks, only when the operator asks for them.

Tracing is on when either
- a tracer provider is already installed process-wide (``opentelemetry-instrument timewheel
  serve``, or an application embedding ``create_app`` that set one up), or
- the standard variables ask for an exporter: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``,
  or any installed exporter's entry-point name) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (which imply ``otlp``). timewheel then builds an SDK
  tracer provider with a batch span processor per exporter; the SDK itself reads the rest
  (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, the exporter's
  endpoint, headers, protocol and timeouts).

``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it off. ``otlp`` follows
``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``; unset, it means ``http/protobuf`` (the
specification's default, and the exporter that the ``otel`` extra installs: ``pip install
'timewheel[otel]'``). Spans only, no OTel metrics: ``/metrics`` has those.

Off costs nothing on the hot paths: no middleware is added, and :meth:`Tracing.callback_span`
returns one shared do-nothing context manager. OpenTelemetry is not even imported unless it is
installed, and its SDK only when tracing is on.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from timewheel import __version__
from timewheel.logs import REQUEST_ID

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer
    from starlette.applications import Starlette

log = logging.getLogger(__name__)

EXPORTER_GROUP = "opentelemetry_traces_exporter"
_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_OFF: AbstractContextManager[None] = contextlib.nullcontext()


class Tracing:
    """The tracer of this process, or None when tracing is off. Build it with
    :meth:`from_env`; ``Tracing(tracer)`` is for tests and embedding applications."""

    def __init__(self, tracer: Tracer | None) -> None:
        self.tracer = tracer

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    @classmethod
    def from_env(cls) -> Tracing:
        """On or off as the ``OTEL_*`` environment says (see the module docstring)."""
        env = os.environ
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return cls(None)
        wanted = requested_exporters(env)
        try:
            from opentelemetry import trace
        except ImportError:
            if wanted:
                log.warning("OTEL_* variables ask for traces, but OpenTelemetry is not "
                            "installed (pip install 'timewheel[otel]'); tracing is off")
            return cls(None)
        current = trace.get_tracer_provider()
        if not isinstance(current, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return cls(current.get_tracer("timewheel", __version__))
        if not wanted:
            return cls(None)
        return cls(_sdk_tracer(tuple(wanted)))

    def instrument(self, app: Starlette) -> None:
        """Add the request-span middleware to ``app`` when tracing is on; nothing otherwise."""
        if self.tracer is not None:
            app.add_middleware(TraceRequests, tracer=self.tracer)

    def callback_span(self, task_key: str, attempt: int, method: str, url: str
                      ) -> AbstractContextManager[Span | None]:
        """A CLIENT span around one callback attempt, current while it runs; yields None
        when tracing is off. Pair with :func:`record_callback` once the outcome is known.

        The URL's query and user info are left out: they often carry credentials."""
        if self.tracer is None:
            return _OFF
        parts = urlsplit(url)
        attributes: dict[str, Any] = {
            "http.request.method": method, "url.scheme": parts.scheme,
            "server.address": parts.hostname or "",
            "server.port": parts.port or (443 if parts.scheme == "https" else 80),
            "timewheel.task.key": task_key, "timewheel.task.attempt": attempt,
        }
        from opentelemetry.trace import SpanKind

        return self.tracer.start_as_current_span(method, kind=SpanKind.CLIENT,
                                                 attributes=attributes)


def record_callback(span: Span | None, *, status_code: int | None, outcome: str,
                    error: str | None = None) -> None:
    """Put a callback's outcome (``ok``, ``retry``, ``fail``) on its span; anything but ``ok``
    marks the span as an error. Does nothing when ``span`` is None (tracing off)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    if status_code is not None:
        span.set_attribute("http.response.status_code", status_code)
    span.set_attribute("timewheel.outcome", outcome)
    if outcome != "ok":
        if error:
            span.set_attribute("error.type", error.partition(":")[0])
        span.set_status(Status(StatusCode.ERROR, error or f"HTTP {status_code}"))


def requested_exporters(env: Mapping[str, str]) -> list[str]:
    """The exporters' entry-point names the environment asks for ([] for none)."""
    names = [name.strip() for name in env.get("OTEL_TRACES_EXPORTER", "").split(",")
             if name.strip()]
    if not names and (env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                      or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        names = ["otlp"]
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    resolved = []
    for name in names:
        if name == "none":
            return []
        resolved.append(_OTLP_BY_PROTOCOL.get(protocol, "otlp_proto_http")
                        if name == "otlp" else name)
    return resolved


@functools.cache
def _sdk_tracer(exporters: tuple[str, ...]) -> Tracer | None:
    """One SDK tracer provider per process (cached: every app and the dispatcher share it).
    The SDK shuts it down, flushing what is batched, when the process exits."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes: dict[str, str] = {"service.version": __version__}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes["service.name"] = "timewheel"
    provider = TracerProvider(resource=Resource.create(attributes))
    added = 0
    for name in exporters:
        found = list(entry_points(group=EXPORTER_GROUP, name=name))
        if not found:
            log.warning("trace exporter %r is not installed (pip install 'timewheel[otel]' for "
                        "OTLP over HTTP); it is skipped", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(found[0].load()()))
        added += 1
    if not added:
        log.warning("no trace exporter could be loaded; tracing is off")
        provider.shutdown()
        return None
    log.info("tracing on: exporting spans through %s", ", ".join(exporters))
    return provider.get_tracer("timewheel", __version__)


class TraceRequests:
    """Pure ASGI middleware: one SERVER span per HTTP request, a child of the caller's trace
    when the request carries W3C ``traceparent`` (or whatever ``OTEL_PROPAGATORS`` names)."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.app = app
        self.tracer = tracer
        self._extract = propagate.extract
        self._server = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope["headers"]}
        method = scope["method"]
        status = 0

        async def send_traced(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        attributes = {"http.request.method": method, "url.path": scope["path"],
                      "url.scheme": scope["scheme"]}
        with self.tracer.start_as_current_span(method, context=self._extract(carrier),
                                               kind=self._server, attributes=attributes) as span:
            try:
                await self.app(scope, receive, send_traced)
            finally:
                # The router put the matched route in the scope: name the span by its template
                # (POST /tasks/{key}), never by the concrete path, which has unbounded values.
                route = getattr(scope.get("route"), "path_format", None)
                if route:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                if status:
                    span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(self._error)
                request_id = REQUEST_ID.get()
                if request_id is not None:
                    span.set_attribute("timewheel.request_id", request_id)

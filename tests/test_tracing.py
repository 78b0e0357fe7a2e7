"""OpenTelemetry: off (and free) unless the OTEL_* variables ask; spans for API requests and
callbacks when on; exported over OTLP/HTTP as the standard variables say."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.conftest import running_app
from tests.support.receiver import Receiver
from timewheel.api.app import create_app
from timewheel.clock import FakeClock
from timewheel.settings import Settings
from timewheel.tracing import Tracing, record_callback, requested_exporters

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture(autouse=True)
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


class Memory(InMemorySpanExporter):
    """Finished spans kept in memory, and a tracer of an SDK provider that feeds them in."""

    def __init__(self, provider: TracerProvider) -> None:
        super().__init__()
        provider.add_span_processor(SimpleSpanProcessor(self))
        self.tracer = provider.get_tracer("test")


@pytest.fixture
def exporter() -> Iterator[Memory]:
    provider = TracerProvider(shutdown_on_exit=False)
    yield Memory(provider)
    provider.shutdown()


def test_off_without_otel_variables() -> None:
    off = Tracing.from_env()
    assert not off.enabled
    app = FastAPI()
    off.instrument(app)
    assert app.user_middleware == []  # no middleware at all on the request path
    span_context = off.callback_span("k", 1, "POST", "https://example.com/hook")
    assert span_context is off.callback_span("other", 2, "GET", "https://example.org/")
    with span_context as span:
        assert span is None
    record_callback(span, status_code=200, outcome="ok")  # a no-op on None


def test_sdk_disabled_or_exporter_none_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not Tracing.from_env().enabled
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert not Tracing.from_env().enabled


def test_requested_exporters_follow_the_standard_variables() -> None:
    assert requested_exporters({}) == []
    assert requested_exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == [
        "otlp_proto_http"]
    assert requested_exporters({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317",
                                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == ["otlp_proto_grpc"]
    assert requested_exporters({"OTEL_TRACES_EXPORTER": "otlp, console",
                                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == [
        "otlp_proto_http", "console"]
    assert requested_exporters({"OTEL_TRACES_EXPORTER": "none"}) == []


def test_an_exporter_that_is_not_installed_leaves_tracing_off(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "no_such_exporter")
    assert not Tracing.from_env().enabled
    assert "not installed" in caplog.text


def test_a_provider_set_up_by_someone_else_is_used(monkeypatch: pytest.MonkeyPatch,
                                                   exporter: Memory) -> None:
    """`opentelemetry-instrument timewheel serve` installs a global provider: use it."""
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr("opentelemetry.trace.get_tracer_provider", lambda: provider)
    on = Tracing.from_env()
    assert on.enabled
    with on.callback_span("k", 1, "GET", "http://example.com/"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["GET"]
    provider.shutdown()


def only_span(exporter: Memory) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


def test_callback_span_carries_the_task_and_not_the_credentials(
        exporter: Memory) -> None:
    on = Tracing(exporter.tracer)
    url = "https://user:pw-secret@api.example.com/hooks/x?token=q-secret"
    with on.callback_span("invoice-42", 3, "POST", url) as span:
        record_callback(span, status_code=503, outcome="retry")
    finished = only_span(exporter)
    assert finished.kind == SpanKind.CLIENT
    assert dict(finished.attributes or {}) == {
        "http.request.method": "POST", "url.scheme": "https", "server.address": "api.example.com",
        "server.port": 443, "timewheel.task.key": "invoice-42", "timewheel.task.attempt": 3,
        "http.response.status_code": 503, "timewheel.outcome": "retry"}
    assert finished.status.status_code == StatusCode.ERROR
    assert "secret" not in repr(finished.to_json())

    exporter.clear()
    with on.callback_span("k", 1, "GET", "http://h:8080/") as span:
        record_callback(span, status_code=None, outcome="retry", error="timeout: read")
    failed = only_span(exporter)
    assert failed.attributes and failed.attributes["error.type"] == "timeout"
    assert failed.attributes["server.port"] == 8080
    exporter.clear()
    with on.callback_span("k", 1, "GET", "http://h/") as span:
        record_callback(span, status_code=204, outcome="ok")
    assert only_span(exporter).status.status_code == StatusCode.UNSET


async def test_api_requests_get_server_spans_in_the_callers_trace(
        monkeypatch: pytest.MonkeyPatch, exporter: Memory, settings: Settings,
        fake_clock: FakeClock) -> None:
    # create_app asks Tracing.from_env(); answer as if OTEL_* had configured an SDK.
    monkeypatch.setattr(Tracing, "from_env", classmethod(lambda cls: cls(exporter.tracer)))
    app = create_app(settings, clock=fake_clock, run_ticker=False)

    @app.get("/test-unavailable")
    async def unavailable() -> JSONResponse:
        return JSONResponse({"detail": "down"}, status_code=503)

    async with running_app(app) as client:
        response = await client.get("/tasks/invoice-42", headers={
            "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-Request-ID": "req-7"})
        assert response.status_code == 404
        span = only_span(exporter)
        assert span.name == "GET /tasks/{key}"  # the route's template, not the key
        assert span.kind == SpanKind.SERVER
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID
        assert dict(span.attributes or {}) == {
            "http.request.method": "GET", "url.path": "/tasks/invoice-42", "url.scheme": "http",
            "http.route": "/tasks/{key}", "http.response.status_code": 404,
            "timewheel.request_id": "req-7"}
        assert span.status.status_code == StatusCode.UNSET

        # POST /tasks, served by api/create_route.py or (malformed) passed on: one span each,
        # named by the route's template.
        for body, status in [({"callback_url": "http://127.0.0.1:9/h"}, 201), ({}, 422)]:
            exporter.clear()
            assert (await client.post("/tasks", json=body)).status_code == status
            span = only_span(exporter)
            assert (span.name, (span.attributes or {})["http.route"]) == ("POST /tasks", "/tasks")

        exporter.clear()
        assert (await client.get("/test-unavailable")).status_code == 503
        span = only_span(exporter)
        assert span.status.status_code == StatusCode.ERROR
        assert span.parent is None  # no traceparent: a new trace


async def test_a_process_wide_provider_gets_one_span_a_request(
        monkeypatch: pytest.MonkeyPatch, settings: Settings, fake_clock: FakeClock) -> None:
    """`opentelemetry-instrument timewheel serve` installs a global provider, which FastAPI's
    own telemetry (0.165 on) would also use: each request then had two SERVER spans, and
    FastAPI's dependency and endpoint spans besides. timewheel's is the only one."""
    provider = TracerProvider(shutdown_on_exit=False)
    memory = Memory(provider)
    monkeypatch.setattr("opentelemetry.trace.get_tracer_provider", lambda: provider)
    app = create_app(settings, clock=fake_clock, run_ticker=False)
    async with running_app(app) as client:
        assert (await client.get("/tasks/invoice-42")).status_code == 404
        assert (await client.post("/tasks", json={"callback_url": "http://127.0.0.1:9/h"})
                ).status_code == 201
    spans = [(span.kind, span.name, span.instrumentation_scope.name)
             for span in memory.get_finished_spans()]
    provider.shutdown()
    assert spans == [(SpanKind.SERVER, "GET /tasks/{key}", "timewheel"),
                     (SpanKind.SERVER, "POST /tasks", "timewheel")]


async def test_spans_reach_an_otlp_endpoint_named_by_the_environment(
        tmp_path: Any) -> None:
    """A separate process, configured only by OTEL_* variables, exports a callback span over
    OTLP/HTTP to a local collector stand-in when it exits."""
    script = ("from timewheel.tracing import Tracing, record_callback\n"
              "on = Tracing.from_env()\n"
              "assert on.enabled\n"
              "with on.callback_span('invoice-42', 1, 'POST', 'https://example.com/h') as s:\n"
              "    record_callback(s, status_code=200, outcome='ok')\n")
    async with Receiver() as collector:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url("").rstrip("/"),
                    "OTEL_SERVICE_NAME": "timewheel-test"})
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, env=env, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, output.decode()
        await collector.wait_for(1, timeout=10, path="/v1/traces")
        (arrival,) = collector.arrivals_for("/v1/traces")
    assert arrival.headers["content-type"] == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(arrival.body)
    (resource_spans,) = request.resource_spans
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert resource["service.name"] == "timewheel-test"
    (span,) = [s for scope in resource_spans.scope_spans for s in scope.spans]
    attributes = {a.key: a.value for a in span.attributes}
    assert span.name == "POST"
    assert attributes["timewheel.task.key"].string_value == "invoice-42"
    assert attributes["http.response.status_code"].int_value == 200


def test_the_module_imports_no_sdk_while_off() -> None:
    """Importing timewheel.tracing (as create_app does) pulls in no OpenTelemetry module."""
    code = ("import sys, timewheel.tracing as t\n"
            "assert not t.Tracing.from_env().enabled\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"

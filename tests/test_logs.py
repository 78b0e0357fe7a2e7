"""Log output: TIMEWHEEL_LOG_FORMAT=json writes one parseable object per line with the structured
fields; text keeps its format; secrets stay out of both."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from timewheel.logs import REQUEST_ID, SECRET_WORDS, LogOnce, configure_logging
from timewheel.settings import Settings

TOKEN = "tok-3f9a7c1e-very-secret"
SIGNING = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LW9mLTMyLWJ5dGVzISE="
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def output() -> Iterator[Callable[[str, str], io.StringIO]]:
    """``output(level, fmt)`` configures logging into a fresh buffer; the root logger's handlers
    and level are restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def configure(level_name: str, fmt: str) -> io.StringIO:
        buffer = io.StringIO()
        configure_logging(level_name, fmt, stream=buffer)
        return buffer

    yield configure
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    text = buffer.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_json_is_one_object_per_line_with_the_structured_fields(output: Any) -> None:
    buffer = output("info", "json")
    log = logging.getLogger("timewheel.engine.dispatcher")
    log.info("callback %s attempt=%d %s %.3fs -> %s", "invoice-42", 2, 503, 0.0412, "retry",
             extra={"task_key": "invoice-42", "attempt": 2, "status_code": 503,
                    "duration_ms": 41.2, "outcome": "retry"})
    log.warning("multi\nline message")
    records = lines(buffer)
    assert len(records) == 2
    first = records[0]
    assert list(first)[:4] == ["time", "level", "logger", "message"]
    assert TIME.match(first["time"])
    assert first["level"] == "INFO"
    assert first["logger"] == "timewheel.engine.dispatcher"
    assert first["message"] == "callback invoice-42 attempt=2 503 0.041s -> retry"
    assert {k: first[k] for k in ("task_key", "attempt", "status_code", "duration_ms",
                                  "outcome")} == {
        "task_key": "invoice-42", "attempt": 2, "status_code": 503, "duration_ms": 41.2,
        "outcome": "retry"}
    assert records[1]["message"] == "multi\nline message"
    # Nothing of the LogRecord's own attributes leaks in (pathname, process, args, ...).
    assert set(records[1]) == {"time", "level", "logger", "message"}


def test_json_keeps_a_traceback_inside_its_line(output: Any) -> None:
    buffer = output("info", "json")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("timewheel.engine.ticker").exception("ticker pass failed")
    (record,) = lines(buffer)
    assert record["level"] == "ERROR"
    assert "RuntimeError: boom" in record["exc_info"]


def test_json_drops_uvicorns_coloured_copy(output: Any) -> None:
    buffer = output("info", "json")
    logging.getLogger("uvicorn.error").info("Uvicorn running on %s", "http://127.0.0.1:8080",
                                            extra={"color_message": "\x1b[1mUvicorn\x1b[0m"})
    (record,) = lines(buffer)
    assert record == {"time": record["time"], "level": "INFO", "logger": "uvicorn.error",
                      "message": "Uvicorn running on http://127.0.0.1:8080"}


def test_text_format_is_unchanged(output: Any) -> None:
    buffer = output("info", "text")
    logging.getLogger("timewheel.store.embedded").info(
        "embedded redis-server pid=%d", 42, extra={"task_key": "k", "request_id": "r"})
    text = buffer.getvalue()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO timewheel\.store\.embedded: "
                        r"embedded redis-server pid=42\n", text), text


def test_level_filters_and_reconfiguring_replaces_the_handler(output: Any) -> None:
    output("info", "text")
    buffer = output("warning", "json")  # a second call: one handler, not two
    log = logging.getLogger("timewheel.test")
    log.info("not shown")
    log.warning("shown")
    assert [r["message"] for r in lines(buffer)] == ["shown"]
    assert sum(h.get_name() == "timewheel" for h in logging.getLogger().handlers) == 1


def test_request_id_is_added_while_bound(output: Any) -> None:
    buffer = output("info", "json")
    log = logging.getLogger("timewheel.api")
    token = REQUEST_ID.set("req-1")
    try:
        log.info("inside")
    finally:
        REQUEST_ID.reset(token)
    log.info("outside")
    inside, outside = lines(buffer)
    assert inside["request_id"] == "req-1"
    assert "request_id" not in outside


def test_log_format_setting_accepts_text_and_json_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().log_format == "text"
    monkeypatch.setenv("TIMEWHEEL_LOG_FORMAT", "json")
    assert Settings().log_format == "json"
    monkeypatch.setenv("TIMEWHEEL_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError):
        Settings()
    with pytest.raises(ValueError, match="log format"):
        configure_logging("info", "xml")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_secrets_never_appear(output: Any, fmt: str) -> None:
    settings = Settings(api_tokens=TOKEN, signing_secret=SIGNING)
    buffer = output("debug", fmt)
    log = logging.getLogger("timewheel.test")
    # Settings logged whole, as a structured field, and fields named like secrets.
    log.info("settings %s %r", settings, settings,
             extra={"settings": settings, "api_tokens": settings.api_tokens,
                    "authorization": f"Bearer {TOKEN}", "signing_secret": SIGNING})
    text = buffer.getvalue()
    assert "settings" in text
    assert TOKEN not in text
    assert SIGNING not in text
    assert SIGNING.removeprefix("whsec_") not in text
    if fmt == "json":
        (record,) = lines(buffer)
        assert record["authorization"] == "[redacted]"
        assert record["signing_secret"] == "[redacted]"


def test_the_redacted_field_names_are_those_deploy_md_lists(output: Any) -> None:
    """docs/deploy.md ("Logs", Secrets) names the words a field name is redacted for; it left
    out `passwd`, which the formatter redacts too. Each listed word redacts a field."""
    deploy = (Path(__file__).resolve().parent.parent / "docs" / "deploy.md").read_text()
    bullet = deploy.split("any structured field whose name contains", 1)[1].split(" with ", 1)[0]
    words = re.findall(r"`([a-z_]+)`", bullet)
    assert sorted(words) == sorted(SECRET_WORDS)
    buffer = output("info", "json")
    logging.getLogger("timewheel.test").info("x", extra={f"my_{w}": "value" for w in words})
    (record,) = lines(buffer)
    assert {record[f"my_{w}"] for w in words} == {"[redacted]"}


async def test_serving_requests_logs_no_token(output: Any, make_client: Any,
                                              settings: Settings) -> None:
    """Through the app at DEBUG, with a refused and an accepted token: neither is logged."""
    buffer = output("debug", "json")
    secured = settings.model_copy(update={"api_tokens": Settings(api_tokens=TOKEN).api_tokens})
    async with make_client(secured) as client:
        refused = await client.get("/tasks/x", headers={"Authorization": "Bearer wrong-" + TOKEN})
        accepted = await client.get("/tasks/x", headers={"Authorization": f"Bearer {TOKEN}"})
    assert (refused.status_code, accepted.status_code) == (401, 404)
    records = lines(buffer)
    assert records  # the app and its clients did log at DEBUG
    assert TOKEN not in buffer.getvalue()


def test_log_once_says_first_once_per_condition_and_forgets_past_its_limit() -> None:
    once = LogOnce(limit=2)
    assert [once.first("a"), once.first("a"), once.first("b"), once.first("a")] == [
        True, False, True, False]
    assert once.first("c")  # a third condition: the two before are forgotten
    assert [once.first("c"), once.first("a")] == [False, True]

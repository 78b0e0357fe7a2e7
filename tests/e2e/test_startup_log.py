"""What a real ``timewheel serve`` logs: the settings it starts with (secrets redacted), with
TIMEWHEEL_LOG_DELIVERIES one INFO line per callback attempt, and with TIMEWHEEL_LOG_FORMAT=json
the structured fields docs/deploy.md ("Logs") lists."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Service
from tests.e2e.test_cli import TOKEN, wait_status
from tests.support.ports import refused_port
from tests.support.receiver import ThreadedReceiver

pytestmark = pytest.mark.e2e



DEPLOY_MD = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def _add(service: Service, key: str, url: str, **fields: object) -> None:
    with service.client() as client:
        r = client.post("/tasks", json={"key": key, "callback_url": url, **fields},
                        headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201, r.text


def test_delivery_lines_are_logged_only_with_log_deliveries(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    receiver.respond("/bad", [400])
    quiet = start_service(api_tokens=TOKEN)
    _add(quiet, "quiet-ok", receiver.url("/ok"))
    _add(quiet, "quiet-bad", receiver.url("/bad"))
    wait_status(quiet, "quiet-ok", "succeeded")
    wait_status(quiet, "quiet-bad", "failed")
    # The control: a failure is logged (at INFO) by the time it is recorded; a success is not.
    assert re.search(r"callback quiet-bad attempt=1 400 [\d.]+s -> fail", quiet.log())
    assert "callback quiet-ok" not in quiet.log()
    line = next(x for x in quiet.log().splitlines() if "starting with settings:" in x)
    assert "api_tokens=<redacted:1>" in line and TOKEN not in line
    assert "log_deliveries=False" in line and f"port={quiet.port}" in line

    # A wheel of its own (another key prefix): the quiet process must not deliver its task.
    loud = start_service(api_tokens=TOKEN, log_deliveries="true", key_prefix="loud")
    _add(loud, "loud-ok", receiver.url("/ok"))
    wait_status(loud, "loud-ok", "succeeded")
    assert re.search(r"INFO .*callback loud-ok attempt=1 200 [\d.]+s -> ok", loud.log()), \
        loud.log()


def test_a_refused_start_is_one_critical_line_and_exit_3(
        start_service: Callable[..., Service], tmp_path: Path) -> None:
    """A second process on the first's data directory (embedded Redis) refuses to start: the
    reason in one CRITICAL line, exit status 3, and no traceback under it (~80 lines of
    Starlette's lifespan, which buried the line: the first-hour audit)."""
    first = start_service(redis_url=None)
    second = Service(tmp_path / "second", None)
    second.env["TIMEWHEEL_DATA_DIR"] = first.env["TIMEWHEEL_DATA_DIR"]
    second.directory.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "timewheel.cli", "serve",
                           "--host", "127.0.0.1", "--port", str(second.port)],
                          env=second.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    critical = [line for line in done.stderr.splitlines() if " CRITICAL " in line]
    assert len(critical) == 1 and "is in use by another timewheel process" in critical[0]
    assert "Traceback" not in done.stderr, done.stderr
    assert first.process is not None and first.process.poll() is None  # the first serves on


def documented_log_fields() -> set[str]:
    """The structured fields of docs/deploy.md's "Logs" bullet (before "(the convention")."""
    bullet = DEPLOY_MD.read_text().split("\n- Structured fields", 1)[1].split("\n- ", 1)[0]
    return set(re.findall(r"`([a-z_]+)`", bullet.split("(the convention", 1)[0]))


def test_json_callback_lines_carry_the_fields_deploy_md_lists(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """docs/deploy.md listed `lateness_ms`, which no line ever carried, and timewheel/logs.py
    said `status_code` is absent and `error` set only when no answer came: a real process
    writes `status_code: null` then, and `error: "HTTP 500"` for a 500. Read from the lines of
    a real process: a success, a failing answer, and no answer at all."""
    receiver.respond("/bad", [500])
    with refused_port() as port:
        service = start_service(api_tokens=TOKEN, log_format="json", log_deliveries="true")
        _add(service, "json-ok", receiver.url("/ok"))
        _add(service, "json-bad", receiver.url("/bad"), max_attempts=1)
        _add(service, "json-none", f"http://127.0.0.1:{port}/none", max_attempts=1)
        wait_status(service, "json-ok", "succeeded")
        wait_status(service, "json-bad", "failed")
        wait_status(service, "json-none", "failed")
    records = [json.loads(line) for line in service.log_path.read_text().splitlines()]
    lines = {record["task_key"]: record for record in records
             if record["logger"] == "timewheel.engine.executor" and "task_key" in record}
    assert set(lines) == {"json-ok", "json-bad", "json-none"}, records
    structured = {name for record in lines.values() for name in record} - {
        "time", "level", "logger", "message"}
    # request_id is on the lines logged while a request is served (tests/test_request_id.py).
    assert structured | {"request_id"} == documented_log_fields()
    readme = (DEPLOY_MD.parent.parent / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| `TIMEWHEEL_LOG_FORMAT`")]
    assert set(re.findall(r"`([a-z_]+_[a-z_]+|attempt|outcome|error)`", row)) == (
        documented_log_fields())
    seen = {key: (r["outcome"], r["status_code"], r["error"]) for key, r in lines.items()}
    assert seen["json-ok"] == ("ok", 200, None)
    assert seen["json-bad"] == ("fail", 500, "HTTP 500")
    assert seen["json-none"][:2] == ("fail", None)
    assert seen["json-none"][2].startswith("connect: ")

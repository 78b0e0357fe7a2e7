"""The command line: settings errors are reported without echoing the values."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from timewheel import cli
from timewheel.cli import main
from timewheel.settings import Settings, secret_settings
from timewheel.store.embedded import DataDirInUse


def test_invalid_settings_exit_without_echoing_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEWHEEL_SIGNING_SECRET", "whsec_not-base64-TOPSECRET")
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--api-tokens", "tok-TOPSECRET", "--tick-seconds", "0"])
    message = str(exited.value.code)
    assert "signing_secret" in message and "tick_seconds" in message
    assert "TOPSECRET" not in message


def _served(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[Settings, str, int]:
    """The settings, host and port ``main`` would serve with (nothing is started)."""
    seen: list[tuple[Settings, str, int]] = []
    monkeypatch.setattr(cli, "serve", lambda *args: seen.append(args))
    main(argv)
    return seen[0]


@pytest.mark.parametrize(("argv", "allowed"), [
    (["serve"], False),
    (["serve", "--allow-private-networks"], True),
    (["serve", "--allow-private-networks", "true"], True),
    (["serve", "--allow-private-networks", "false"], False),
    (["serve", "--allow-private-networks", "--port", "8081"], True),
])
def test_allow_private_networks_is_a_switch(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                            allowed: bool) -> None:
    monkeypatch.delenv("TIMEWHEEL_ALLOW_PRIVATE_NETWORKS", raising=False)
    settings, _, _ = _served(monkeypatch, argv)
    assert settings.allow_private_networks is allowed


@pytest.mark.parametrize(("env", "argv", "where"), [
    ({}, [], ("127.0.0.1", 8080)),
    ({"TIMEWHEEL_HOST": "0.0.0.0", "TIMEWHEEL_PORT": "8081"}, [], ("0.0.0.0", 8081)),
    ({"TIMEWHEEL_PORT": "8081"}, ["--port", "8082", "--host", "::1"], ("::1", 8082)),
])
def test_host_and_port_come_from_flags_then_environment(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str],
        where: tuple[str, int]) -> None:
    for name in ("TIMEWHEEL_HOST", "TIMEWHEEL_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings, host, port = _served(monkeypatch, ["serve", *argv])
    assert (host, port) == (settings.host, settings.port) == where


def test_a_port_out_of_range_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEWHEEL_PORT", "70000")
    with pytest.raises(SystemExit) as exited:
        main(["serve"])
    assert "port" in str(exited.value.code)


def test_a_kubernetes_service_link_in_timewheel_port_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods of a namespace with a Service named timewheel get TIMEWHEEL_PORT=tcp://ip:port;
    a flag wins over it, and without one the error says where it comes from."""
    monkeypatch.setenv("TIMEWHEEL_PORT", "tcp://10.0.0.7:8080")
    assert _served(monkeypatch, ["serve", "--port", "8080"])[2] == 8080
    with pytest.raises(SystemExit) as exited:
        main(["serve"])
    assert "Kubernetes service link" in str(exited.value.code)


@pytest.mark.parametrize(("argv", "named"), [
    (["--api-tokens", "tok-TOPSECRET"], "--api-tokens"),
    (["--signing-secret", "whsec_TOPSECRETTOPSECRETTOPSECRETTOPSECRETTOPS="], "--signing-secret"),
    (["--encryption-keys", f"k1:{base64.b64encode(b'TOPSECRET'.ljust(32, b'!')).decode()}"],
     "--encryption-keys"),
    (["--redis-url", "redis://:TOPSECRET@127.0.0.1:1/0"], "--redis-url"),
    (["--redis-url", "redis://127.0.0.1:1/0?password=TOPSECRET"], "--redis-url"),
])
def test_a_secret_given_as_a_flag_is_warned_of_without_its_value(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str],
        named: str) -> None:
    """A flag's value is in the process's command line, readable by every user (ps): the
    service still starts, and says where the secret belongs instead, without echoing it."""
    _served(monkeypatch, ["serve", *argv])
    warning = capsys.readouterr().err
    assert named in warning and "TIMEWHEEL_" in warning and "ps" in warning
    assert "TOPSECRET" not in warning


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis://app@127.0.0.1:1/0"])
def test_no_warning_without_secret_flags(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str], url: str) -> None:
    """A secret in the environment, and a Redis URL without a password (a user name alone is
    none), are nothing to warn of."""
    monkeypatch.setenv("TIMEWHEEL_API_TOKENS", "tok-from-the-environment")
    _served(monkeypatch, ["serve", "--redis-url", url, "--port", "8081"])
    assert capsys.readouterr().err == ""


def test_every_secret_setting_is_one_the_warning_knows() -> None:
    """The list is read from the settings' types: a new secret setting is covered as it is
    added (and each of today's three is found)."""
    secret = {name for name, info in Settings.model_fields.items()
              if "SecretStr" in repr(info.annotation) or "ApiToken" in repr(info.annotation)}
    assert set(secret_settings()) == secret == {
        "api_tokens", "signing_secret", "encryption_keys"}


@pytest.mark.parametrize(("host", "tokens", "warned"), [
    ("0.0.0.0", None, True), ("::", None, True), ("192.168.1.5", None, True),
    ("0.0.0.0", "tok-from-the-environment", False),
    ("127.0.0.1", None, False), ("::1", None, False), ("localhost", None, False),
])
def test_an_api_open_to_the_network_without_tokens_is_warned_of(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], host: str,
        tokens: str | None, warned: bool) -> None:
    """Listening beyond loopback with no TIMEWHEEL_API_TOKENS lets anyone who reaches the
    port create, read and cancel tasks (and send its callbacks with the wheel's signature):
    the service starts, and says so. Loopback alone, or tokens set, is nothing to warn of."""
    monkeypatch.delenv("TIMEWHEEL_API_TOKENS", raising=False)
    if tokens:
        monkeypatch.setenv("TIMEWHEEL_API_TOKENS", tokens)
    _served(monkeypatch, ["serve", "--host", host])
    warning = capsys.readouterr().err
    assert ("TIMEWHEEL_API_TOKENS" in warning and host in warning) is warned, warning


def test_a_misspelt_setting_in_the_environment_is_warned_of(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """TIMEWHEEL_API_TOKEN (singular) was ignored without a word, and the API ran with no
    tokens: an unknown TIMEWHEEL_* name is named (never its value), with the setting it most
    looks like. The client's own names (TIMEWHEEL_URL, TIMEWHEEL_TOKEN) are no setting of the
    service and nothing to warn of."""
    for name in list(os.environ):
        if name.upper().startswith("TIMEWHEEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TIMEWHEEL_API_TOKEN", "SECRET-VALUE")
    monkeypatch.setenv("timewheel_redis_clusters", "true")
    monkeypatch.setenv("TIMEWHEEL_URL", "http://127.0.0.1:8080")
    monkeypatch.setenv("TIMEWHEEL_TOKEN", "client-token")
    _served(monkeypatch, ["serve"])
    warning = capsys.readouterr().err
    assert "TIMEWHEEL_API_TOKEN " in warning and "TIMEWHEEL_API_TOKENS" in warning
    assert "timewheel_redis_clusters" in warning and "TIMEWHEEL_REDIS_CLUSTER" in warning
    assert "SECRET-VALUE" not in warning
    assert "TIMEWHEEL_URL" not in warning and "TIMEWHEEL_TOKEN " not in warning


def test_known_settings_in_the_environment_are_no_warning(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in list(os.environ):
        if name.upper().startswith("TIMEWHEEL_"):
            monkeypatch.delenv(name)
    for name, info in Settings.model_fields.items():
        if info.default is not None and not isinstance(info.default, list):
            monkeypatch.setenv(f"TIMEWHEEL_{name.upper()}", str(info.default).lower())
    _served(monkeypatch, ["serve"])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("argv", "named"), [
    (["--log-level", "warn"], "log_level"), (["--log-level", "verbose"], "log_level"),
    (["--max-horizon-seconds", "1e13"], "max_horizon_seconds"),
])
def test_settings_that_failed_later_are_refused_at_start(
        monkeypatch: pytest.MonkeyPatch, argv: list[str], named: str) -> None:
    """A log level uvicorn does not know ended the start in a KeyError traceback, and a
    horizon past what a record holds made a far create a 500: both are settings errors now."""
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *argv])
    assert "invalid settings" in str(exit_.value) and named in str(exit_.value)


def test_the_log_level_is_taken_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    settings, _, _ = _served(monkeypatch, ["serve", "--log-level", "WARNING"])
    assert settings.log_level == "warning"


@pytest.mark.parametrize("raised", [ValueError("a bug"), DataDirInUse("in use")])
async def test_quiet_refusal_drops_the_traceback_of_a_refused_start_only(
        raised: Exception) -> None:
    """Starlette reports a failed start with its traceback, which uvicorn logs: kept for any
    error (a bug's traceback is what an operator needs), dropped for a StartRefused, whose
    reason is already logged as one CRITICAL line."""
    from timewheel.cli import QuietRefusal

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "lifespan.startup.failed", "message": "Traceback ..."})
        raise raised

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    with pytest.raises(type(raised)):
        await QuietRefusal(app)({"type": "lifespan"}, None, send)
    refused = isinstance(raised, DataDirInUse)
    assert sent == [{"type": "lifespan.startup.failed",
                     "message": "" if refused else "Traceback ..."}]


def test_start_up_warnings_are_lines_of_the_log_format(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Warned of before logging is set up, a warning still has the log's format: with
    TIMEWHEEL_LOG_FORMAT=json a JSON object, as deploy.md promises of every line."""
    monkeypatch.delenv("TIMEWHEEL_API_TOKENS", raising=False)
    monkeypatch.delenv("TIMEWHEEL_LOG_FORMAT", raising=False)
    monkeypatch.setenv("timewheel_log_format", "json")  # any case, as the settings read it
    monkeypatch.setenv("TIMEWHEEL_API_TOKEN", "SECRET-VALUE")  # misspelt: warned of
    _served(monkeypatch, ["serve", "--host", "0.0.0.0"])
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["level"], line["logger"]) for line in lines] == [
        ("WARNING", "timewheel.cli")] * 2
    assert "TIMEWHEEL_API_TOKEN " in lines[0]["message"]
    assert "listening on 0.0.0.0" in lines[1]["message"]

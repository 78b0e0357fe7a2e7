"""The command line: settings errors are reported without echoing the values."""

from __future__ import annotations

import pytest

from timewheel import cli
from timewheel.cli import main
from timewheel.settings import Settings


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

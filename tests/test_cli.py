"""The command line: settings errors are reported without echoing the values."""

from __future__ import annotations

import pytest

from timewheel.cli import main


def test_invalid_settings_exit_without_echoing_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEWHEEL_SIGNING_SECRET", "whsec_not-base64-TOPSECRET")
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--api-tokens", "tok-TOPSECRET", "--tick-seconds", "0"])
    message = str(exited.value.code)
    assert "signing_secret" in message and "tick_seconds" in message
    assert "TOPSECRET" not in message

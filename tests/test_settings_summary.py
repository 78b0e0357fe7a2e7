"""The start-up log line's settings (Settings.summary): every setting, no secret."""

from __future__ import annotations

import pytest

from timewheel.settings import Settings, redact_url

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_every_setting_is_listed_and_no_secret_shows() -> None:
    settings = Settings(redis_url="rediss://app:hunter2@redis.internal:6380/2",
                        api_tokens="tok-one,tok-two", signing_secret=SECRET, port=8081,
                        log_deliveries=True)
    summary = settings.summary()
    for secret in ("hunter2", "tok-one", "tok-two", SECRET, SECRET.removeprefix("whsec_")):
        assert secret not in summary
    fields = dict(part.split("=", 1) for part in summary.split(" "))
    assert list(fields) == list(Settings.model_fields)
    assert fields["redis_url"] == "rediss://app:***@redis.internal:6380/2"
    assert fields["api_tokens"] == "<redacted:2>"
    assert fields["signing_secret"] == "<redacted:1>"
    assert (fields["port"], fields["log_deliveries"]) == ("8081", "True")


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://localhost:6379/0", "redis://localhost:6379/0"),
    ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
    ("redis://user@h:1", "redis://user@h:1"),
    ("redis://h:1/0?password=pw&db=3", "redis://h:1/0?password=***&db=3"),
    ("unix:///run/redis.sock?Password=pw", "unix:///run/redis.sock?Password=***"),
    # redis-py decodes the names: both are its password; ssl_password opens the TLS key.
    ("redis://h:1/0?p%61ssword=pw", "redis://h:1/0?p%61ssword=***"),
    ("rediss://h:1/0?ssl_keyfile=/k.pem&ssl_password=pw",
     "rediss://h:1/0?ssl_keyfile=/k.pem&ssl_password=***"),
])
def test_redis_url_passwords_are_redacted(url: str, shown: str) -> None:
    assert redact_url(url) == shown

"""Settings from flags or ``TIMEWHEEL_*`` environment variables (names fixed by docs/api.md)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, get_args, get_origin
from urllib.parse import unquote_plus, urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from timewheel.scopes import ApiToken, check_tokens

if TYPE_CHECKING:
    from timewheel.store.encryption import Cipher

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# Query parameters redis-py takes a secret from (its parse_url reads names percent-decoded).
SECRET_QUERY_NAMES = frozenset({"password", "ssl_password"})


def redact_url(url: str) -> str:
    """``url`` with the password of its user part and of a ``password=`` or ``ssl_password=``
    query parameter (however its name is spelled: ``p%61ssword``) replaced by ``***`` (redis-py
    reads them all)."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        user, _, host = parts.netloc.rpartition("@")
        name, colon, _ = user.partition(":")
        url = url.replace(parts.netloc, f"{name}{':***' if colon else ''}@{host}", 1)
    if parts.query:
        query = "&".join(f"{pair.partition('=')[0]}=***"
                         if unquote_plus(pair.partition("=")[0]).lower() in SECRET_QUERY_NAMES
                         else pair for pair in parts.query.split("&"))
        url = url.replace(f"?{parts.query}", f"?{query}", 1)
    return url


class Settings(BaseSettings):
    """Everything an operator can set. Built once in the CLI or ``create_app`` and passed down."""

    model_config = SettingsConfigDict(env_prefix="TIMEWHEEL_", extra="ignore")

    # Where ``timewheel serve`` listens (also --host / --port).
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    redis_url: str | None = None
    redis_cluster: bool = False
    data_dir: Path = Path(".timewheel")
    key_prefix: str = Field(default="tw", pattern=r"^[A-Za-z0-9._:-]{1,50}$")
    # ``[read:|write:|admin:]<token>``, comma-separated; a bare token is admin (timewheel/scopes.py)
    api_tokens: Annotated[list[ApiToken], NoDecode] = []
    signing_secret: Annotated[list[SecretStr], NoDecode] = []
    allow_private_networks: bool = False
    allowed_networks: Annotated[list[IPNetwork], NoDecode] = []
    tick_seconds: float = Field(default=1.0, gt=0, le=60)
    batch_deadline_seconds: float = Field(default=30.0, gt=0, le=3600)
    # At most 100 years: a time further out than the record's 6-byte milliseconds and RFC 3339
    # years can hold made a create a 500 (OverflowError), not a 422.
    max_horizon_seconds: float = Field(default=31_536_000, gt=0, le=3_153_600_000)
    flow_parallelism: int = Field(default=100, ge=1, le=10_000)
    # The attempt history (docs/api.md v3): entries kept per task, response body bytes each.
    attempts_kept: int = Field(default=20, ge=0, le=1000)
    attempt_body_bytes: int = Field(default=1024, ge=0, le=65_536)
    # Result callbacks (docs/api.md v3): the answer's body bytes a result reports.
    result_body_bytes: int = Field(default=65_536, ge=0, le=1_048_576)
    # ``<id>:<base64 32-byte key>``, comma-separated; the first seals headers and bodies, every
    # one opens what it sealed (timewheel/store/encryption.py). Unset: stored as sent.
    encryption_keys: Annotated[list[SecretStr], NoDecode] = []

    # Beyond docs/api.md: operational knobs with safe defaults.
    retention_seconds: float = Field(default=7 * 86400, gt=0)
    lease_margin_seconds: float = Field(default=5.0, gt=0)
    claim_batch: int = Field(default=100, ge=1, le=10_000)
    # Fixed per wheel once written to Redis; unset adopts the wheel's (16 for a new wheel).
    buckets: int | None = Field(default=None, ge=1, le=16_384)
    max_concurrency: int = Field(default=512, ge=1, le=100_000)
    flow_local_waiting: int = Field(default=10_000, ge=0, le=100_000)
    # Bulk jobs (timewheel/jobs/runner.py): index entries one step looks at, the least pause
    # between two steps, the most of the time steps may take (the pause after a step is in
    # proportion), and how long a dead process's job waits before another process takes it over.
    job_step_tasks: int = Field(default=50, ge=1, le=1000)
    job_step_pause_seconds: float = Field(default=0.002, ge=0, le=10)
    job_busy_share: float = Field(default=0.25, gt=0, le=1)
    job_lease_seconds: float = Field(default=10.0, ge=1, le=3600)
    http_client: Literal["wire", "aiohttp", "httpx"] = "wire"
    metrics_public: bool = True
    docs_public: bool = True
    embedded_appendfsync: Literal["always", "everysec"] = "always"
    # Durability on replicated Redis (docs/design.md, "Durability"): every change a client is
    # told about WAITs for this many replicas to confirm it; 0 answers once the master has it.
    redis_wait_replicas: int = Field(default=0, ge=0, le=16)
    # How long that WAIT may take before the answer is 503. Below the client's 5 s socket
    # timeout (timewheel/store/connection.py), which a blocked WAIT must not run into.
    redis_wait_timeout_ms: int = Field(default=1000, ge=1, le=4000)
    # How long an API request may wait before it is answered 503 (api/deadline.py): a cluster
    # client retries a silent master for minutes. Below the Python client's 10 s timeout, above
    # that WAIT and the 5 s socket timeout of a single Redis.
    request_deadline_seconds: float = Field(default=8.0, ge=1, le=300)
    # The levels both uvicorn and Python's logging know; given in any case.
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    log_format: Literal["text", "json"] = "text"  # json: one object per line (timewheel.logs)
    # One INFO line per callback attempt (key, attempt, status or error, duration); without
    # it successes are logged at DEBUG (failures and retries are always INFO).
    log_deliveries: bool = False

    def summary(self) -> str:
        """Every setting as ``name=value`` (no spaces in a value), for the start-up log line:
        secrets say only how many are set, and a Redis URL's password is replaced by ``***``."""
        parts = []
        secret = set(secret_settings())
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name in secret:
                shown = (f"<redacted:{len(value)}>"  # how many are set
                         if isinstance(value, list) else "<redacted>")
            elif name == "redis_url" and value is not None:
                shown = redact_url(value)
            elif isinstance(value, list):
                shown = ",".join(map(str, value)) or "[]"
            else:
                shown = str(value)
            parts.append(f"{name}={shown}")
        return " ".join(parts)

    @field_validator("api_tokens", "signing_secret", "allowed_networks", mode="before")
    @classmethod
    def _csv(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("encryption_keys", mode="before")
    @classmethod
    def _key_list(cls, value: object) -> object:
        # A value of separators only ("," from "${NEW},${OLD}" with both unset) is a list
        # gone wrong, not "encryption off": off would store new payloads in plaintext and
        # fail every sealed record this process claims. Stop the start instead.
        parts = _split_csv(value)
        if isinstance(value, str) and value.strip() and not parts:
            raise ValueError("lists no key, only separators (unset it to store payloads "
                             "unencrypted; timewheel keys generate prints an entry)")
        return parts

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("port", mode="before")
    @classmethod
    def _not_a_service_link(cls, value: object) -> object:
        # Kubernetes sets TIMEWHEEL_PORT=tcp://<ip>:<port> in pods of a namespace with a
        # Service named "timewheel" (service links); say so rather than "not an integer".
        if isinstance(value, str) and value.startswith("tcp://"):
            raise ValueError(f"{value!r} looks like a Kubernetes service link for a Service "
                             "named timewheel: pass --port, or set enableServiceLinks: false")
        return value

    @field_validator("api_tokens")
    @classmethod
    def _scoped(cls, value: list[ApiToken]) -> list[ApiToken]:
        return check_tokens(value)

    @field_validator("signing_secret")
    @classmethod
    def _whsec(cls, value: list[SecretStr]) -> list[SecretStr]:
        # Decoded here so a bad secret stops the start, not the first callback.
        from timewheel.delivery.signing import decode_secret

        for secret in value:
            decode_secret(secret.get_secret_value())
        return value

    @field_validator("encryption_keys")
    @classmethod
    def _aes_keys(cls, value: list[SecretStr]) -> list[SecretStr]:
        # Parsed here so a bad key stops the start, not the first create; the message names
        # the entry's id, never its key.
        from timewheel.store.encryption import parse_keys

        parse_keys(",".join(s.get_secret_value() for s in value))
        return value

    def cipher(self) -> Cipher | None:
        """The payload cipher of TIMEWHEEL_ENCRYPTION_KEYS; None when unset."""
        from timewheel.store.encryption import Cipher, parse_keys

        keys = parse_keys(",".join(s.get_secret_value() for s in self.encryption_keys))
        return Cipher(keys) if keys else None

    @model_validator(mode="after")
    def _cluster_needs_url(self) -> Settings:
        if self.redis_cluster and not self.redis_url:
            raise ValueError("TIMEWHEEL_REDIS_CLUSTER needs TIMEWHEEL_REDIS_URL (a cluster node)")
        return self


def secret_settings() -> list[str]:
    """The settings whose values are secrets (``SecretStr``, alone or in a list): the start-up
    line shows only how many are set, and ``timewheel serve`` warns when one is given as a flag.
    A Redis URL is one only when it carries a password (``redact_url``)."""
    return [name for name, info in Settings.model_fields.items()
            if _holds_secret(info.annotation)]


def shown_default(name: str) -> str:
    """A setting's default as README.md's table gives it: ``unset`` for none, ``true`` or
    ``false``, a number or a word (not a Python repr: ``PosixPath('.timewheel')``, ``[]``)."""
    default = Settings.model_fields[name].default
    if default is None or default == []:
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    return _number(default) if isinstance(default, float) else str(default)


def allowed(name: str) -> str | None:
    """The values a setting takes beyond its type, as README.md's table gives them in brackets
    (with a hyphen for its en dash): ``1-65535``, ``above 0, at most 60``, ``above 0``,
    ``wire, aiohttp or httpx``; None when any value of its type does."""
    info = Settings.model_fields[name]
    choices = get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
    if choices:
        return f"{', '.join(map(str, choices[:-1]))} or {choices[-1]}"
    bounds = {kind: getattr(item, kind) for item in info.metadata
              for kind in ("ge", "gt", "le", "pattern") if getattr(item, kind, None) is not None}
    if "pattern" in bounds:
        return f"matching {bounds['pattern']}"
    low = (_number(bounds["ge"]) if "ge" in bounds else None,
           _number(bounds["gt"]) if "gt" in bounds else None)
    high = _number(bounds["le"]) if "le" in bounds else None
    if low[0] is not None and high is not None:
        return f"{low[0]}-{high}"
    parts = ([f"at least {low[0]}"] if low[0] is not None else []) + (
        [f"above {low[1]}"] if low[1] is not None else []) + (
        [f"at most {high}"] if high is not None else [])
    return ", ".join(parts) or None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _holds_secret(annotation: object) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, SecretStr):
        return True
    return any(_holds_secret(arg) for arg in get_args(annotation))

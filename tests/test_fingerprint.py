"""``prepare.fingerprint`` and the other per-task work of ``prepare.prepare`` against frozen copies
of the code they replaced (issue #9): tasks stored by earlier builds are compared with the
fingerprint, so it must hash exactly the same text for every input, and the body bytes and the
default flow must not change either.

The ``_old_*`` functions are the implementations as they were before the fast paths, copied
verbatim; do not "fix" them.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import string
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import Field, ValidationError

from timewheel.domain import callback_url
from timewheel.errors import BodyTooLarge
from timewheel.models import MAX_BODY_BYTES, TaskCreate, TaskFields, parse_execute_at
from timewheel.models.schedules import ScheduleTask
from timewheel.operations import prepare
from timewheel.store import record

# ------------------------------------------------------------------ frozen copies (do not edit)


def _old_fingerprint(fields: TaskFields) -> str:
    content: dict[str, Any] = fields.model_dump(mode="json", exclude={"key"})
    if fields.execute_at is not None:
        content["execute_at"] = parse_execute_at(fields.execute_at)
    content["body_set"] = "body" in fields.model_fields_set
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _old_encode_body(fields: TaskFields) -> tuple[bytes | None, str | None]:
    if "body" not in fields.model_fields_set:
        return None, None
    own_type = any(name.lower() == "content-type" for name in fields.headers)
    if isinstance(fields.body, str) and own_type:
        data = fields.body.encode()
        content_type = None
    else:
        data = json.dumps(fields.body, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()
        content_type = "application/json"
    if len(data) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body is {len(data)} bytes encoded; at most {MAX_BODY_BYTES}")
    return data, content_type


def _old_absolute_http_url(value: str) -> str:
    """TaskFields._absolute_http_url's body before the parse was shared (callback_url)."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {exc}") from exc
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an absolute http:// or https:// URL")
    if any(ch.isspace() or ord(ch) < 0x20 for ch in value):
        raise ValueError("must not contain whitespace or control characters")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry user:password (put credentials in headers)")
    return value


def _old_default_flow(url: str) -> str:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().replace(":", "-")
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    return f"{host}:{port}"


# ------------------------------------------------------------------ helpers


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """A call's result, or its exception's type and message: both sides must agree on either."""
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # compared, not handled
        return "raised", (type(exc), str(exc))


class _V2Fields(TaskFields):
    """v3's result callbacks taken out of the dump: the models as the frozen code knew them."""

    on_success: None = Field(default=None, exclude=True)
    on_failure: None = Field(default=None, exclude=True)


class _V2Create(TaskCreate):
    on_success: None = Field(default=None, exclude=True)
    on_failure: None = Field(default=None, exclude=True)


class _V2Schedule(ScheduleTask):
    on_success: None = Field(default=None, exclude=True)
    on_failure: None = Field(default=None, exclude=True)


_V2 = {TaskFields: _V2Fields, TaskCreate: _V2Create, ScheduleTask: _V2Schedule}


def _as_v2(fields: TaskFields) -> TaskFields:
    """The request as a v2 model held it (no on_success / on_failure), values untouched: a
    task without result callbacks must keep its v2 fingerprint."""
    assert fields.on_success is None and fields.on_failure is None
    return _V2[type(fields)].model_construct(_fields_set=fields.model_fields_set, **dict(fields))


def _same(fields: TaskFields) -> None:
    assert _outcome(prepare.fingerprint, fields) == _outcome(_old_fingerprint, _as_v2(fields))
    assert _outcome(prepare.encode_body, fields) == _outcome(_old_encode_body, fields)


URLS = ["http://127.0.0.1:9/hook", "https://hooks.example.com/a/b?x=1&y=%20#frag",
        "HTTPS://Example.COM:8443/Ünïcödé/пример?q=日本語", "http://[::1]:8080/", "http://[2001:db8::1]/x",
        "http://example.com:80", "https://例え.jp/パス", "http://a.b.c.d.e/\"quoted\"\\back",
        "http://h/\u200b\u00ad-not-space-in-path"]
EXECUTE_AT = ["2026-11-22T10:00:00Z", "2026-11-22t10:00:00z", "2026-11-22 10:00:00+00:00",
              "2026-11-22T12:00:00+02:00", "2026-11-22T10:00:00.5Z", "2026-11-22T10:00:00.500Z",
              "2026-11-22T10:00:00.123456789Z", "2026-11-22T09:59:59.9999999-00:00",
              1795341600, 1795341600.0, 1795341600.123, 1795341600.0001, 0, 0.0]
BODIES: list[Any] = [None, "", "text", "ünï\u2028cödé 😀", 0, -1, 2**70, 1.0, -0.0, 1e300, 5e-324,
                     0.1, True, False, [], {}, [1, "a", None, [True, {"z": 1, "a": 2}]],
                     {"b": 1, "a": {"y": [1.5, 2], "x": None}, "é": "ü", "": ""},
                     {"\ud83d\ude00": "😀", "quote\"": "back\\slash", "ctl\n": "\t\x00"}]
HEADERS = [{}, {"X-A": "1"}, {"x-b": "2", "X-A": "1", "Content-Type": "text/plain"},
           {"Content-Type": "application/xml; charset=utf-8", "X-U": "nö"},
           {"Accept": "ünïcödé", "X-Empty": ""}]


class _Str(str):
    __slots__ = ()


class _Int(int):
    pass


class _Float(float):
    pass


def _nested(depth: int) -> Any:
    body: Any = "deep"
    for _ in range(depth):
        body = [body]
    return body


def _table() -> list[dict[str, Any]]:
    """Every optional field alone, and in combinations, with a base task."""
    base = {"callback_url": URLS[0]}
    cases: list[dict[str, Any]] = [base, {**base, "key": "k-1"}]
    cases += [{**base, "callback_url": url} for url in URLS]
    cases += [{**base, "execute_at": at} for at in EXECUTE_AT]
    cases += [{**base, "body": body} for body in BODIES]
    cases += [{**base, "headers": h, "body": b} for h in HEADERS for b in ("x", {"a": 1}, None)]
    cases += [{**base, "delay": d} for d in (0, 1, 3600, 0.5, 1e-9, 10**12, 86400.25)]
    cases += [{**base, "timeout": t} for t in (1, 0.001, 30, 2.5)]
    cases += [{**base, "max_attempts": m} for m in (1, 5, 100)]
    cases += [{**base, "retry_backoff": r} for r in (1, 1.0, 0.25, 3600, 3600.0)]
    cases += [{**base, "flow_key": f} for f in (None, "f", "a.b:c-d_e")]
    cases += [{**base, "method": m} for m in ("GET", "post", "Put", "PATCH", "delete")]
    cases += [{**base, "execute_at": None}, {**base, "delay": None}, {**base, "timeout": None}]
    cases.append({"key": "all", "callback_url": URLS[2], "method": "put", "headers": HEADERS[3],
                  "body": BODIES[17], "execute_at": EXECUTE_AT[3], "timeout": 2.5,
                  "max_attempts": 7, "retry_backoff": 0.5, "flow_key": "flow.1"})
    cases.append({"callback_url": URLS[1], "delay": 30, "body": "<x/>", "timeout": 3,
                  "headers": {"Content-Type": "application/xml"}, "flow_key": "x"})
    return cases


@pytest.mark.parametrize("data", _table(), ids=lambda d: json.dumps(d, ensure_ascii=True)[:60])
@pytest.mark.parametrize("model", [TaskCreate, TaskFields])
def test_table_matches_the_frozen_code(model: type[TaskFields], data: dict[str, Any]) -> None:
    if model is TaskFields:
        data = {k: v for k, v in data.items() if k != "key"}
    fields = model.model_validate(data)
    assert type(fields) in prepare._BY_ATTRIBUTES  # the fast path is what is compared here
    _same(fields)
    # and through JSON, as a request arrives
    _same(model.model_validate_json(json.dumps(data)))


def test_known_fingerprints_stay() -> None:
    """Values computed by the code before issue #9: a change here breaks stored tasks."""
    plain = TaskCreate.model_validate({"key": "k", "callback_url": "http://127.0.0.1:9/hook",
                                       "delay": 3600, "body": {"order": 1, "note": "n"},
                                       "headers": {"X-Bench": "r"}})
    assert prepare.fingerprint(plain) == _old_fingerprint(_as_v2(plain))
    assert prepare.fingerprint(plain) == (
        "5d4267feaad49843323befb5873bab55548677edbea887a2ae22abc162ce0b61")


def test_models_other_than_the_two_are_dumped() -> None:
    """ScheduleTask leaves execute_at and delay out of its dump: not the fast path, same text."""
    task = ScheduleTask.model_validate({"callback_url": URLS[0], "body": {"a": 1}})
    assert type(task) not in prepare._BY_ATTRIBUTES
    _same(task)


@pytest.mark.parametrize("body", [
    float("inf"), float("-inf"), float("nan"), [1, float("inf")], {"a": {"b": float("nan")}},
    (1, 2), {"t": (1, "x")}, b"bytes", {"b": b"\xff"}, dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
    decimal.Decimal("1.5"), {1: "int key"}, {"a": {2: 3}}, {"set": {1}}, object(),
    {1.5: "float key"}, {None: 1}, {True: 1}, {"b": 1, 2: "mixed keys"}, _Str("sub"),
    {"k": _Str("sub")}, [_Int(3)], {"f": _Float(0.5)}, _nested(150),
    "\ud800 lone surrogate", {"\udfff": 1}, True, 2**64, -(2**63),
], ids=lambda body: type(body).__name__)
def test_bodies_a_request_cannot_carry_take_the_old_path(body: Any) -> None:
    """Bodies only Python code can build (and non-finite floats): same result or same error."""
    fields = TaskCreate.model_validate({"callback_url": URLS[0], "body": body})
    _same(fields)


def test_a_circular_body_fails_alike() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    fields = TaskCreate.model_validate({"callback_url": URLS[0], "body": {"x": loop}})
    assert not prepare._plain_json(fields.body)
    _same(fields)


def test_deep_body_at_the_depth_limit() -> None:
    for depth in (prepare._MAX_PLAIN_DEPTH - 1, prepare._MAX_PLAIN_DEPTH,
                  prepare._MAX_PLAIN_DEPTH + 1):
        body: Any = "leaf"
        for i in range(depth):
            body = [body] if i % 2 else {"k": body}
        _same(TaskCreate.model_validate({"callback_url": URLS[0], "body": body}))


# ------------------------------------------------------------------ generated inputs

_HEADER_NAME = st.text("!#$%&'*+-.^_`|~0123456789" + string.ascii_letters, min_size=1,
                       max_size=12)
_HEADER_VALUE = st.text(st.characters(blacklist_characters="\r\n\x00", codec=None), max_size=20)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=5),
    max_leaves=25)
_NUMBER = st.integers(min_value=0, max_value=10**9) | st.floats(
    min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
_RFC3339 = st.builds(
    lambda d, sep, frac, off: d.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + frac + off,
    st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2200, 1, 1)),  # noqa: DTZ001
    st.sampled_from(["T", "t", " "]),
    st.sampled_from(["", ".0", ".5", ".123", ".999999", ".123456789", ".000000001"]),
    st.sampled_from(["Z", "z", "+00:00", "-00:00", "+05:30", "-11:00", "+14:00"]))
_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "key": st.from_regex(r"\A[A-Za-z0-9._:-]{1,20}\Z"),
    "method": st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "get", "Post", "pAtCh"]),
    "headers": st.dictionaries(_HEADER_NAME, _HEADER_VALUE, max_size=4),
    "body": _JSON,
    "execute_at": st.none() | _RFC3339 | _NUMBER,
    "delay": st.none() | _NUMBER,
    "timeout": st.none() | st.integers(min_value=1, max_value=600) | st.floats(
        min_value=0.001, max_value=600),
    "max_attempts": st.integers(min_value=1, max_value=100),
    "retry_backoff": st.integers(min_value=1, max_value=3600) | st.floats(
        min_value=0.001, max_value=3600),
    "flow_key": st.none() | st.from_regex(r"\A[A-Za-z0-9._:-]{1,20}\Z"),
}


@st.composite
def _task_input(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {"callback_url": draw(
        st.sampled_from(URLS) | st.builds(lambda p: "https://example.com/" + p,
                                          st.text(max_size=20)))}
    for name in draw(st.sets(st.sampled_from(sorted(_OPTIONAL)))):
        data[name] = draw(_OPTIONAL[name])
    return data


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_task_input(), st.booleans())
def test_generated_inputs_match_the_frozen_code(data: dict[str, Any], via_json: bool) -> None:
    try:
        if via_json:
            fields: TaskFields = TaskCreate.model_validate_json(json.dumps(data))
        else:
            fields = TaskCreate.model_validate(data)
    except ValidationError:
        assume(False)
        raise
    _same(fields)
    bare = {k: v for k, v in data.items() if k != "key"}
    _same(TaskFields.model_validate(bare))


def test_prepare_uses_the_same_fingerprint_and_body() -> None:
    for data in _table():
        fields = TaskCreate.model_validate(data)
        old_body = _outcome(_old_encode_body, fields)
        if old_body[0] == "raised":  # the body cannot be encoded (a lone surrogate)
            assert _outcome(prepare.prepare, fields, "k", 0, default_timeout=10.0) == old_body
            continue
        task = prepare.prepare(fields, "k", 1_800_000_000_000, default_timeout=10.0)
        assert task.fingerprint == _old_fingerprint(_as_v2(fields))
        body, content_type = _old_encode_body(fields)
        assert task.body == body
        assert ("Content-Type", content_type) in task.headers if content_type else True
        if fields.flow_key is None:
            assert task.flow == _old_default_flow(fields.callback_url)


@pytest.mark.parametrize("url", [
    *URLS, "http://EXAMPLE.com", "https://example.com:443/", "http://example.com:0/",
    "http://[fe80::1%25eth0]:81/", "https://xn--r8jz45g.jp/", "http://h:65535"])
def test_default_flow_matches_the_frozen_code(url: str) -> None:
    assert _outcome(record.default_flow, url) == _outcome(_old_default_flow, url)


@pytest.mark.parametrize("url", ["http://h:99999/", "http://h:x/", "http://[::1/", "", "x",
                                 "http:///nohost", "mailto:a@b"])
def test_default_flow_of_odd_urls_matches(url: str) -> None:
    """migrate.py calls it on stored URLs: same answer or same error for anything."""
    assert _outcome(record.default_flow, url) == _outcome(_old_default_flow, url)


# ------------------------------------------------------------------ the callback URL, parsed once

ODD_URLS = [
    "http://h:99999/", "http://h:x/", "http://[::1/", "", "x", "http:///nohost", "mailto:a@b",
    "ftp://example.com/", "HTTP://EXAMPLE.COM", "hTTpS://h", "http://user@h/", "http://:pw@h/",
    "http://u:p@h/", "http://@h/", "http://h/a@b", "http://h/?q=a@b", "http://h#@x",
    "http://h/ space", "http://h/\tx", "http://h/\x7f", "http://h/\x1f", "http://h/\u3000",
    "http://h/\u2028", "http://h/\x85", " http://h/", "http://h:/", "http://h:0/",
    "http://[::1]:65535/", "http://[fe80::1%25eth0]:81/", "http://[v1.x]/", "https://h:443",
    "http://h\\@127.0.0.1/", "//h/x", "http:h", "https://ÜNÏ.example/", "http://h:1_0/",
    "http://h:+1/", "http://h: 1/", "http://[::1]x/", "http://a]/", "http://[/",
]


def _verdict(url: str) -> tuple[str, str | None]:
    problem = callback_url(url).problem
    return ("raised", problem) if problem is not None else ("ok", url)


def _old_verdict(url: str) -> tuple[str, str | None]:
    try:
        return "ok", _old_absolute_http_url(url)
    except ValueError as exc:
        return "raised", str(exc)


@pytest.mark.parametrize("url", URLS + ODD_URLS)
def test_url_verdict_and_flow_match_the_frozen_code(url: str) -> None:
    for _ in range(2):  # parsed, then remembered
        assert _verdict(url) == _old_verdict(url)
        assert _outcome(record.default_flow, url) == _outcome(_old_default_flow, url)


@pytest.mark.parametrize("url", ODD_URLS[:8])
def test_url_errors_reach_the_request_as_before(url: str) -> None:
    old = _old_verdict(url)
    try:
        TaskCreate.model_validate({"callback_url": url})
    except ValidationError as exc:
        [error] = exc.errors(include_url=False)
        assert error["loc"] == ("callback_url",)
        assert error["msg"] == f"Value error, {old[1]}"
    else:
        assert old[0] == "ok"


_URL_CHARS = st.sampled_from(list("aZ09.-_~:/?#[]@!$&'()*+,;=% \t\n\x00\x7f\u00e9\u3000\uff0e"))


@settings(max_examples=800, deadline=None)
@given(st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "", "//", "http:"]),
       st.text(_URL_CHARS, max_size=25), st.sampled_from(["", ":80", ":x", ":99999", ":0"]),
       st.text(_URL_CHARS, max_size=15))
def test_generated_urls_match_the_frozen_code(scheme: str, host: str, port: str,
                                              rest: str) -> None:
    url = scheme + host + port + "/" + rest
    assert _verdict(url) == _old_verdict(url)
    assert _outcome(record.default_flow, url) == _outcome(_old_default_flow, url)


def test_result_callbacks_change_the_fingerprint() -> None:
    """on_success / on_failure are part of the content (a repeat with others is a conflict),
    folded in only when set, so a task without them keeps its v2 fingerprint."""
    base = {"key": "k", "callback_url": URLS[0], "body": {"a": 1}}
    plain = prepare.fingerprint(TaskCreate.model_validate(base))
    variants = [prepare.fingerprint(TaskCreate.model_validate({**base, **extra})) for extra in (
        {"on_success": "http://127.0.0.1:9/ok"}, {"on_failure": "http://127.0.0.1:9/ok"},
        {"on_success": "http://127.0.0.1:9/ok", "on_failure": "http://127.0.0.1:9/no"})]
    assert len({plain, *variants}) == 4
    again = TaskCreate.model_validate({**base, "on_success": "http://127.0.0.1:9/ok"})
    assert prepare.fingerprint(again) == variants[0]

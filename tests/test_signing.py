"""Standard Webhooks signatures, checked by the independent ``standardwebhooks`` package.

Its ``verify`` refuses timestamps more than 5 minutes from the host's clock, so every
timestamp here is the real current time (and the dispatcher test runs a FakeClock set to it).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest
import respx
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.test_dispatcher import URL, Harness
from timewheel.clock import FakeClock
from timewheel.delivery.signing import Signer, decode_secret
from timewheel.store import Store

# The Standard Webhooks / Svix reference vector.
REF_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
REF_ID, REF_TS, REF_BODY = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
REF_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

SECRET_A = "whsec_" + base64.b64encode(bytes(range(32))).decode()
SECRET_B = "whsec_" + base64.b64encode(bytes(range(100, 124))).decode()
SECRET_C = "whsec_" + base64.b64encode(b"another secret, not configured!!").decode()


def now_s() -> int:
    return int(time.time())


def headers(msg_id: str, timestamp: int, signature: str) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature}


def verifies(secret: str, body: bytes, hdrs: dict[str, str]) -> bool:
    try:
        Webhook(secret).verify(body, hdrs, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


# -- Signer, on its own ----------------------------------------------------------------------------


def test_reference_vector() -> None:
    """The spec's published example signs to the published signature, and to what the
    reference library computes."""
    assert Signer([REF_SECRET]).sign(REF_ID, REF_TS, REF_BODY) == REF_SIGNATURE
    moment = datetime.fromtimestamp(REF_TS, tz=UTC)
    assert Webhook(REF_SECRET).sign(REF_ID, moment, REF_BODY.decode()) == REF_SIGNATURE


def test_json_body_verifies() -> None:
    """A JSON body signed by us verifies and parses with the reference library."""
    body = json.dumps({"order": 42, "note": "héllo ✓"}, separators=(",", ":"),
                      ensure_ascii=False).encode()
    ts = now_s()
    signature = Signer([SECRET_A]).sign("order-42", ts, body)
    assert signature.startswith("v1,")
    assert " " not in signature
    assert Webhook(SECRET_A).verify(body, headers("order-42", ts, signature)) == {
        "order": 42, "note": "héllo ✓"}


def test_plain_text_body_verifies_byte_for_byte() -> None:
    """A non-JSON body (text/plain) verifies as the exact bytes; any change breaks it."""
    body = "plain wörds, not JSON: {oops\n  trailing spaces  ".encode()
    ts = now_s()
    signature = Signer([SECRET_A]).sign("note-1", ts, body)
    assert verifies(SECRET_A, body, headers("note-1", ts, signature))
    assert not verifies(SECRET_A, body.rstrip(), headers("note-1", ts, signature))
    assert not verifies(SECRET_A, body + b"!", headers("note-1", ts, signature))


def test_empty_body_verifies() -> None:
    """A task without a body signs the empty string."""
    ts = now_s()
    signature = Signer([SECRET_A]).sign("ping", ts, b"")
    assert verifies(SECRET_A, b"", headers("ping", ts, signature))


def test_retry_has_a_new_timestamp_and_the_same_id() -> None:
    """Each attempt is signed over its own timestamp: both verify with their own headers, a
    signature does not carry over to the other timestamp, and the id is part of the MAC."""
    body, signer = b'{"x":1}', Signer([SECRET_A])
    first_ts, retry_ts = now_s() - 60, now_s()
    first = signer.sign("job-1", first_ts, body)
    retry = signer.sign("job-1", retry_ts, body)
    assert first != retry
    assert verifies(SECRET_A, body, headers("job-1", first_ts, first))
    assert verifies(SECRET_A, body, headers("job-1", retry_ts, retry))
    assert not verifies(SECRET_A, body, headers("job-1", retry_ts, first))
    assert not verifies(SECRET_A, body, headers("job-2", retry_ts, retry))


def test_two_secrets_rotation() -> None:
    """With two secrets the header holds two space-separated v1 signatures, the current one
    first; a receiver holding either secret verifies, a third secret does not."""
    body, ts = b'{"rotating":true}', now_s()
    signature = Signer([SECRET_A, SECRET_B]).sign("rot-1", ts, body)
    parts = signature.split(" ")
    assert len(parts) == 2
    assert all(part.startswith("v1,") for part in parts)
    assert parts == [Signer([SECRET_A]).sign("rot-1", ts, body),
                     Signer([SECRET_B]).sign("rot-1", ts, body)]
    assert verifies(SECRET_A, body, headers("rot-1", ts, signature))
    assert verifies(SECRET_B, body, headers("rot-1", ts, signature))
    assert not verifies(SECRET_C, body, headers("rot-1", ts, signature))


def test_wrong_secret_fails() -> None:
    """A signature made with one secret does not verify under another."""
    body, ts = b'{"x":1}', now_s()
    signature = Signer([SECRET_A]).sign("job-1", ts, body)
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(SECRET_B).verify(body, headers("job-1", ts, signature))


def test_decode_secret_accepts_whsec_base64() -> None:
    """``whsec_<base64>`` decodes to its key bytes."""
    assert decode_secret(SECRET_A) == bytes(range(32))
    assert decode_secret(REF_SECRET) == base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")


@pytest.mark.parametrize("secret", [
    "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # no prefix
    "WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # wrong case
    "whsk_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "whsec_",  # no key at all
    "whsec_not base64 at all!!",
    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",  # truncated: bad padding
    "whsec_MfKQ9r8G$YqrTwjUPD8ILPZIo2LaLaSw",
    "whsec_" + base64.b64encode(b"short").decode(),  # under 16 bytes
    "",
])
def test_decode_secret_refuses(secret: str) -> None:
    """Anything but ``whsec_`` + valid base64 of at least 16 bytes is a ValueError, for the
    Signer too, and the message never echoes the secret."""
    with pytest.raises(ValueError) as info:
        decode_secret(secret)
    key_part = secret.removeprefix("whsec_")
    if len(key_part) > 4:
        assert key_part not in str(info.value)
    with pytest.raises(ValueError):
        Signer([SECRET_A, secret])


# -- through the dispatcher ----------------------------------------------------------------------


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as mock:
        yield mock


@pytest.fixture
def real_now_clock() -> FakeClock:
    """A hand-moved clock that starts at the real time (for the verifier's 5 minute window)."""
    return FakeClock(int(time.time() * 1000))


@pytest.fixture
async def signed(store: Store, real_now_clock: FakeClock, router: respx.MockRouter
                 ) -> AsyncIterator[Harness]:
    harness = Harness(store, real_now_clock, Signer([SECRET_A, SECRET_B]))
    yield harness
    await harness.dispatcher.stop(0.1)
    await harness.sender.aclose()


def sent_headers(request: httpx.Request) -> dict[str, str]:
    return {name: request.headers[name]
            for name in ("webhook-id", "webhook-timestamp", "webhook-signature")}


async def test_dispatcher_signs_the_exact_body_sent(signed: Harness, router: respx.MockRouter
                                                    ) -> None:
    """The signature on a real attempt verifies against the bytes on the wire, with either
    secret, and is over the stored compact JSON (a re-encoding of the same value fails)."""
    route = router.post(URL).respond(200)
    value = {"order": 42, "note": "héllo ✓", "items": [1, 2]}
    task = await signed.add("signed-1", body=value)
    await signed.fire("signed-1")

    request = route.calls.last.request
    assert request.content == task.body
    hdrs = sent_headers(request)
    assert hdrs["webhook-id"] == "signed-1"
    assert hdrs["webhook-timestamp"] == str(task.due_ms // 1000)
    assert len(hdrs["webhook-signature"].split(" ")) == 2
    assert Webhook(SECRET_A).verify(request.content, hdrs) == value
    assert Webhook(SECRET_B).verify(request.content, hdrs) == value
    assert not verifies(SECRET_C, request.content, hdrs)
    assert not verifies(SECRET_A, json.dumps(value).encode(), hdrs)
    assert request.headers.get_list("webhook-signature") == [hdrs["webhook-signature"]]


async def test_dispatcher_signs_a_plain_text_body(signed: Harness, router: respx.MockRouter
                                                  ) -> None:
    """A string body with its own Content-Type is sent and signed as is."""
    route = router.put(URL).respond(204)
    await signed.add("text-1", method="PUT", body="just text, {not json",
                     headers={"Content-Type": "text/plain; charset=utf-8"})
    await signed.fire("text-1")
    request = route.calls.last.request
    assert request.content == b"just text, {not json"
    assert request.headers["content-type"] == "text/plain; charset=utf-8"
    assert verifies(SECRET_A, request.content, sent_headers(request))


async def test_dispatcher_signs_each_retry_afresh(signed: Harness, router: respx.MockRouter
                                                  ) -> None:
    """The retry carries the same webhook-id, its own timestamp and a signature over it."""
    route = router.post(URL)
    route.mock(side_effect=[httpx.Response(503), httpx.Response(200)])
    await signed.add("retry-1", body={"n": 1}, retry_backoff=2.0)
    await signed.fire("retry-1")
    signed.clock.advance(2500)  # past the first retry's backoff (2 s x jitter <= 2.4 s)
    await signed.fire("retry-1")

    assert route.call_count == 2
    first, second = (sent_headers(call.request) for call in route.calls)
    assert first["webhook-id"] == second["webhook-id"] == "retry-1"
    assert int(second["webhook-timestamp"]) >= int(first["webhook-timestamp"]) + 2
    assert first["webhook-signature"] != second["webhook-signature"]
    for call in route.calls:
        assert verifies(SECRET_A, call.request.content, sent_headers(call.request))
    assert (await signed.view("retry-1")).status == "succeeded"

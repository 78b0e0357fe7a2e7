"""Standard Webhooks signatures (https://www.standardwebhooks.com/).

``webhook-signature: v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>``; with several
secrets (rotation) one ``v1,`` signature per secret, separated by spaces. Hand-written rather
than taken from the ``standardwebhooks`` package: it is 10 lines, and the package's signer
insists on a ``str`` payload, while the body we sign must be byte-for-byte the body sent.
The tests verify our signatures with that package.
"""

from __future__ import annotations

import base64
import hashlib
import hmac


def decode_secret(secret: str) -> bytes:
    """The key bytes of a ``whsec_<base64>`` secret; ValueError when it is not one."""
    if not secret.startswith("whsec_"):
        raise ValueError("a signing secret starts with 'whsec_'")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except ValueError as exc:
        raise ValueError("a signing secret is 'whsec_' followed by base64") from exc
    if len(key) < 16:
        raise ValueError("a signing secret should hold at least 16 bytes")
    return key


class Signer:
    """Signs callbacks with one or more keys (the first is current; the others are rotating)."""

    def __init__(self, secrets: list[str]) -> None:
        self._keys = [decode_secret(secret) for secret in secrets]

    def sign(self, msg_id: str, timestamp: int, body: bytes) -> str:
        message = b"%s.%d.%s" % (msg_id.encode(), timestamp, body)
        return " ".join(
            "v1," + base64.b64encode(hmac.digest(key, message, hashlib.sha256)).decode()
            for key in self._keys
        )


def verify(secret: str, msg_id: str, timestamp: str, body: bytes, signatures: str) -> bool:
    """Whether one of the space-separated ``v1,<base64>`` signatures of a ``webhook-signature``
    header is this secret's for the id, timestamp and body (``timewheel listen``). Compared in
    constant time; the timestamp's age is the caller's to judge."""
    if not timestamp.isdigit():
        return False
    expected = Signer([secret]).sign(msg_id, int(timestamp), body).encode()
    return any(hmac.compare_digest(expected, given.encode())
               for given in signatures.split() if given.isascii())

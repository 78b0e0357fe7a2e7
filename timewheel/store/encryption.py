"""Payload encryption at rest (docs/api.md v3, docs/security.md): a task's headers and body, and
an attempt's response body, stored as AES-256-GCM ciphertext (``cryptography``'s AESGCM).

Keys come from ``TIMEWHEEL_ENCRYPTION_KEYS``, ``<id>:<base64 32 bytes>,...``: the first seals,
every listed one opens what it sealed. Each listed key K gives two keys by HKDF-SHA256 (so the
AES key never serves as a MAC key too): one for AES-GCM, one for the keyed request fingerprint.

A sealed task stores one blob in place of its headers (its body part left empty; the Lua scripts
carry both as opaque bytes, timewheel/store/layout.py):

    0x00 | id length B | id | nonce (12 bytes, fresh per seal) | AES-GCM(plain) with its tag
    plain = h12 (12 bytes) | headers length I4 | headers (layout.encode_headers) | body

A plaintext headers block never starts with 0x00 (header names are RFC 9110 tokens), so the
first byte tells the two apart, and a wheel can hold both (written before and after encryption
was turned on). The associated data is the task key: a blob copied to another task's record
does not open. ``h12`` is the unkeyed request fingerprint (layout.fp_bytes); the record's head
keeps only its HMAC under the sealing key (``fingerprint``), because the unkeyed SHA-256 of a
guessable body would let anyone holding a dump confirm a guess. Rotation re-keys it from h12.

An attempt's response body (lua/lib/attempts.lua entries) is sealed the same way, its associated
data the task key and attempt number, and stored base64 in the entry's ``bx`` field. A
schedule's spec (its task template holds headers and body; no script reads it) is sealed whole
in the schedule's ``spec`` field, its associated data the schedule id; a topic's spec (its
endpoints' headers) likewise, its associated data the topic's name.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MARK = 0x00  # first byte of a sealed blob; never the first byte of a stored headers block
NONCE_BYTES = 12  # 96 bits, AES-GCM's standard nonce: random per seal (NIST SP 800-38D 8.2.2)
KEY_BYTES = 32  # AES-256
H12_BYTES = 12
KEY_ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
_LEN = struct.Struct(">I")
_TASK_AD = b"timewheel task\x00"
_ATTEMPT_AD = b"timewheel attempt\x00"
_SCHEDULE_AD = b"timewheel schedule\x00"
_TOPIC_AD = b"timewheel topic\x00"


class UnknownKey(Exception):
    """A blob sealed under a key id that TIMEWHEEL_ENCRYPTION_KEYS does not list."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(f"encrypted with key id {key_id!r}, which TIMEWHEEL_ENCRYPTION_KEYS "
                         "does not list")


class BadCiphertext(Exception):
    """A blob that does not open under its listed key (changed, truncated, another task's)."""


@dataclass(frozen=True, slots=True)
class OpenedTask:
    h12: bytes  # the unkeyed request fingerprint (layout.fp_bytes)
    headers: bytes  # the headers block (layout.decode_headers)
    body: bytes
    key_id: str  # the key it was sealed under


class _Key:
    __slots__ = ("aead", "fp_key", "id", "id_bytes")

    def __init__(self, key_id: str, secret: bytes) -> None:
        self.id = key_id
        self.id_bytes = key_id.encode()
        self.aead = AESGCM(_derive(secret, b"timewheel payload v1"))
        self.fp_key = _derive(secret, b"timewheel fingerprint v1")


def _derive(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def parse_keys(text: str) -> list[tuple[str, bytes]]:
    """``<id>:<base64 32 bytes>,...`` as (id, key) pairs. Raises ValueError naming the entry
    by its position and id, never by its key."""
    out: list[tuple[str, bytes]] = []
    for n, entry in enumerate((e.strip() for e in text.split(",")), start=1):
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        if not sep or not KEY_ID_PATTERN.match(key_id):
            raise ValueError(f"entry {n} is not <id>:<base64 key> with an id of 1-32 of "
                             "A-Z a-z 0-9 . _ - (timewheel keys generate prints one)")
        try:
            secret = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"key {key_id!r} is not valid base64") from None
        if len(secret) != KEY_BYTES:
            raise ValueError(f"key {key_id!r} is {len(secret)} bytes; AES-256 needs "
                             f"{KEY_BYTES} (timewheel keys generate prints one)")
        if any(known == key_id for known, _ in out):
            raise ValueError(f"key id {key_id!r} is listed twice")
        out.append((key_id, secret))
    return out


def generate_line(key_id: str) -> str:
    """A fresh ``<id>:<base64 key>`` entry (``timewheel keys generate``)."""
    if not KEY_ID_PATTERN.match(key_id):
        raise ValueError("a key id is 1-32 of A-Z a-z 0-9 . _ -")
    return f"{key_id}:{base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()}"


def is_sealed(headers_part: bytes) -> bool:
    return bool(headers_part) and headers_part[0] == MARK


def sealed_key_id(blob: bytes) -> str:
    """The key id a sealed blob names (no key needed)."""
    return blob[2:2 + blob[1]].decode(errors="replace")


def spec_text(cipher: Cipher | None, raw: bytes, open_: Callable[[Cipher, bytes], str]) -> str:
    """A stored spec's JSON (a schedule's or a topic's): as stored when it was written before
    encryption was on, else opened by ``open_`` (``Cipher.open_schedule``, ``open_topic``).
    Raises UnknownKey (no keys listed, or not its key) or BadCiphertext."""
    if not is_sealed(raw):
        return raw.decode()
    if cipher is None:
        raise UnknownKey(sealed_key_id(raw))
    return open_(cipher, raw)


class Cipher:
    """The listed keys, ready to seal and open. Built once per process (``from_settings``)."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise ValueError("a Cipher needs at least one key")
        self._keys = {key_id: _Key(key_id, secret) for key_id, secret in keys}
        self.current = self._keys[keys[0][0]]

    @property
    def key_id(self) -> str:
        """The id of the key that seals."""
        return self.current.id

    def _key(self, blob: bytes) -> _Key:
        if len(blob) < 2 or blob[0] != MARK or len(blob) < 2 + blob[1] + NONCE_BYTES + 16:
            raise BadCiphertext("not a sealed blob (too short)")
        key = self._keys.get(sealed_key_id(blob))
        if key is None:
            raise UnknownKey(sealed_key_id(blob))
        return key

    def _seal(self, plain: bytes, ad: bytes) -> bytes:
        key = self.current
        nonce = os.urandom(NONCE_BYTES)
        return b"".join((bytes((MARK, len(key.id_bytes))), key.id_bytes, nonce,
                         key.aead.encrypt(nonce, plain, ad)))

    def _open(self, blob: bytes, ad: bytes) -> tuple[_Key, bytes]:
        key = self._key(blob)
        at = 2 + len(key.id_bytes)
        try:
            return key, key.aead.decrypt(blob[at:at + NONCE_BYTES], blob[at + NONCE_BYTES:], ad)
        except InvalidTag:
            raise BadCiphertext(f"ciphertext under key id {key.id!r} does not verify "
                                "(changed, or another task's)") from None

    # -- tasks --------------------------------------------------------------------------------

    def seal_task(self, task_key: str, h12: bytes, headers: bytes, body: bytes) -> bytes:
        return self._seal(b"".join((h12, _LEN.pack(len(headers)), headers, body)),
                          _TASK_AD + task_key.encode())

    def open_task(self, task_key: str, blob: bytes) -> OpenedTask:
        """Raises UnknownKey or BadCiphertext."""
        key, plain = self._open(blob, _TASK_AD + task_key.encode())
        if len(plain) < H12_BYTES + _LEN.size:
            raise BadCiphertext("sealed task shorter than its fixed part")
        (length,) = _LEN.unpack_from(plain, H12_BYTES)
        at = H12_BYTES + _LEN.size
        return OpenedTask(plain[:H12_BYTES], plain[at:at + length], plain[at + length:], key.id)

    def fingerprint(self, h12: bytes, key_id: str | None = None) -> bytes:
        """The 12 fingerprint bytes a sealed record's head keeps: HMAC-SHA256 of h12 under the
        fingerprint key of ``key_id`` (default: the sealing key)."""
        key = self.current if key_id is None else self._keys[key_id]
        # hmac.digest: OpenSSL's one-shot HMAC, ~2x faster than hmac.new(...).digest().
        return hmac.digest(key.fp_key, h12, "sha256")[:H12_BYTES]

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every listed key id, the one that seals first."""
        return tuple(self._keys)

    def knows(self, key_id: str) -> bool:
        return key_id in self._keys

    # -- schedule specs -----------------------------------------------------------------------

    def seal_schedule(self, schedule_id: str, spec: str) -> bytes:
        return self._seal(spec.encode(), _SCHEDULE_AD + schedule_id.encode())

    def open_schedule(self, schedule_id: str, blob: bytes) -> str:
        """Raises UnknownKey or BadCiphertext."""
        return self._open(blob, _SCHEDULE_AD + schedule_id.encode())[1].decode()

    # -- topic specs (their endpoints' headers carry receivers' credentials) --------------------

    def seal_topic(self, name: str, spec: str) -> bytes:
        return self._seal(spec.encode(), _TOPIC_AD + name.encode())

    def open_topic(self, name: str, blob: bytes) -> str:
        """Raises UnknownKey or BadCiphertext."""
        return self._open(blob, _TOPIC_AD + name.encode())[1].decode()

    # -- attempt response bodies --------------------------------------------------------------

    def seal_text(self, task_key: str, attempt: int, text: str) -> str:
        ad = b"%s%s\x00%d" % (_ATTEMPT_AD, task_key.encode(), attempt)
        return base64.b64encode(self._seal(text.encode(), ad)).decode()

    def open_text(self, task_key: str, attempt: int, sealed: str) -> str:
        """Raises UnknownKey or BadCiphertext."""
        ad = b"%s%s\x00%d" % (_ATTEMPT_AD, task_key.encode(), attempt)
        try:
            blob = base64.b64decode(sealed, validate=True)
        except (binascii.Error, ValueError):
            raise BadCiphertext("sealed response body is not base64") from None
        return self._open(blob, ad)[1].decode(errors="replace")

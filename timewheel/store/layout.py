"""The bytes of a task record (layout 2): one Redis string per task.

    head (85 bytes, fixed) | flow | url | headers | body | last_err

The head holds every number and state of the task at fixed offsets, so a script reads it with
``GETRANGE 0 92`` and rewrites it in place with ``SETRANGE 0`` without copying the request:
claiming, starting, parking or releasing a task with a 1 MiB body moves 85 bytes. The lengths
in the head say where each variable part starts: a claim reads head, flow and url (what the
ticker needs), ``start`` reads headers and body (what the attempt sends), a view reads head,
url and last_err. ``lua/lib/record.lua`` is the Lua side of this module; the two must agree.

Why a string and not a hash: a hash stays compact (listpack) only while every value is at
most 64 bytes (``hash-max-listpack-value``); one longer URL or body converts the whole hash to
a hashtable of ~70 bytes per field. A string costs the same whatever the sizes, and field
names cost nothing. Fields (``FIELDS`` below, big-endian, integers unsigned):

    ver B        layout version (2)
    st c1        status: s scheduled, r retrying, d delivering, w waiting (parked for its
                 flow), o succeeded, f failed, c cancelled
    att H        attempts started
    max B        max attempts (1..100; 0: not set, the flow's default applies)
    meth c1      method: G GET, P POST, U PUT, A PATCH, D DELETE
    started B    1 once the current claim's attempt has started (lua/start.lua)
    due I6       ms of the next attempt (of the last one once finished); a pending task's
                 entry is in the slice of max(due's minute, the bucket's cursor): a due time
                 before the cursor was put into the cursor's slice, and the cursor never
                 passes a slice that still has entries, so no minute needs storing
    exec I6      execute_at ms
    created I6   ms
    backoff I4   ms (0: not set, the flow's default applies);  timeout I4 ms
    last_at I6   ms (0: none);  last_code H (0: none);  finished I6 ms (0: not finished)
    claim c6     SHA-1 prefix of the token that holds the claim (zeros: none)
    op c6        SHA-1 prefix of the id of the last API request that wrote the task
    opr B        that request's reply (schedule: 0 created, 1 replaced)
    fp c12       request fingerprint (96-bit SHA-256 prefix; a tombstone's is "tombstone"
                 zero-padded)
    fl B, ul H, hl I4, bl I4, el H   lengths of flow, url, headers, body, last_err

Headers are stored as ``name:value`` lines joined by ``\\n`` (names are RFC 9110 tokens and
values hold no CR, LF or NUL: api validation), UTF-8.
"""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from timewheel.store.encryption import Cipher

VERSION = 2
HEAD = struct.Struct(">BcHBcB6s6s6sII6sH6s6s6sB12sBHIIH")
HEAD_SIZE = HEAD.size  # 85; lua/lib/record.lua computes the same with struct.size
FIELDS = ("ver", "st", "att", "max", "meth", "started", "due", "exec", "created",
          "backoff", "timeout", "last_at", "last_code", "finished", "claim", "op", "opr", "fp",
          "fl", "ul", "hl", "bl", "el")
_MS = frozenset({"due", "exec", "created", "last_at", "finished"})  # 6-byte integers
NONE = bytes(6)  # an empty claim or op
_ZERO6 = bytes(6)  # a 6-byte time that is not set

STATUS_NAMES = {"s": "scheduled", "r": "retrying", "d": "delivering", "w": "waiting",
                "o": "succeeded", "f": "failed", "c": "cancelled"}
STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}
METHOD_NAMES = {"G": "GET", "P": "POST", "U": "PUT", "A": "PATCH", "D": "DELETE"}
METHOD_CODES = {name: code for code, name in METHOD_NAMES.items()}


class BadRecord(ValueError):
    """The bytes are not a record of this layout (truncated, another version, bad text)."""


def digest(text: str | bytes) -> bytes:
    """The 6-byte digest kept for a claim token or request id (lua/lib/record.lua: digest)."""
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha1(data, usedforsecurity=False).digest()[:6]


def fp_bytes(fingerprint: str) -> bytes:
    """The 12 bytes stored for a request fingerprint."""
    return hashlib.sha256(fingerprint.encode()).digest()[:12]


def encode_headers(headers: list[tuple[str, str]]) -> bytes:
    return "\n".join(f"{name}:{value}" for name, value in headers).encode()


def decode_headers(data: bytes) -> list[tuple[str, str]]:
    if not data:
        return []
    out = []
    for line in data.decode().split("\n"):
        name, sep, value = line.partition(":")
        if not sep or not name:
            raise BadRecord(f"header line {line[:40]!r} has no name")
        out.append((name, value))
    return out


def pack_head(head: dict[str, Any]) -> bytes:
    values = []
    for name in FIELDS:
        value = head[name]
        if name in _MS:
            value = int(value).to_bytes(6, "big")
        elif isinstance(value, str):
            value = value.encode()
        values.append(value)
    return HEAD.pack(*values)


def unpack_head(raw: bytes) -> dict[str, Any]:
    """The head as a dict (status and method as their one-letter codes)."""
    head = dict(zip(FIELDS, head_values(raw), strict=True))
    for name in _MS:
        head[name] = int.from_bytes(head[name], "big")
    head["st"] = head["st"].decode("latin-1")
    head["meth"] = head["meth"].decode("latin-1")
    return head


def head_values(raw: bytes) -> tuple[Any, ...]:
    """The head's values as HEAD unpacks them, in FIELDS order (times as 6 bytes each), checked
    for length and version: what a decoder that needs a few fields reads them from."""
    if len(raw) < HEAD_SIZE:
        raise BadRecord(f"record of {len(raw)} bytes is shorter than its head")
    values = HEAD.unpack_from(raw)
    if values[0] != VERSION:
        raise BadRecord(f"record layout {values[0]}, not {VERSION}")
    return values


# Positions in head_values' tuple, for decoders on the delivery path: record.claimed_task runs
# once per claimed task, and the dict unpack_head builds took 8 of its 13 us a call.
AT = {name: i for i, name in enumerate(FIELDS)}


def template(*, url: str, method: str, headers: list[tuple[str, str]], body: bytes | None,
             due_ms: int, timeout_ms: int, max_attempts: int, backoff_ms: int,
             fingerprint: str, flow: str, key: str = "", cipher: Cipher | None = None) -> bytes:
    """A new task's record as lua/schedule.lua takes it: status scheduled, no attempt yet; the
    script fills in the minute, created time and request id. With a ``cipher``, headers and body
    are one sealed blob in the headers part (timewheel/store/encryption.py), bound to ``key``,
    and the fingerprint is keyed."""
    fp = fp_bytes(fingerprint)
    if cipher is None:
        parts = (flow.encode(), url.encode(), encode_headers(headers), body or b"")
    else:
        parts = (flow.encode(), url.encode(),
                 cipher.seal_task(key, fp, encode_headers(headers), body or b""), b"")
        fp = cipher.fingerprint(fp)
    # HEAD.pack directly (FIELDS order): this runs once per created task, batches included.
    due = due_ms.to_bytes(6, "big")
    head = HEAD.pack(VERSION, b"s", 0, max_attempts, METHOD_CODES[method].encode(), 0, due, due,
                     _ZERO6, backoff_ms, timeout_ms, _ZERO6, 0, _ZERO6, NONE, NONE, 0,
                     fp, len(parts[0]), len(parts[1]), len(parts[2]),
                     len(parts[3]), 0)
    return b"".join((head, *parts))


def split(raw: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    """(head, flow, url) of a record, or of its prefix as claim and view replies carry it."""
    head = unpack_head(raw)
    return head, *flow_and_url(raw, head["fl"], head["ul"])


def flow_and_url(raw: bytes, fl: int, ul: int) -> tuple[bytes, bytes]:
    """The flow and url parts of a record (or its prefix) whose head gives these lengths."""
    url_at = HEAD_SIZE + fl
    if len(raw) < url_at + ul:
        raise BadRecord("record shorter than its head says")
    return raw[HEAD_SIZE:url_at], raw[url_at:url_at + ul]


def decode(raw: bytes) -> dict[str, Any]:
    """A whole record as a dict: the head plus flow, url, headers (the stored text), body and
    last_err. For tests and inspection (``Store.record``)."""
    head, flow, url = split(raw)
    at = HEAD_SIZE + head["fl"] + head["ul"]
    parts = {}
    for name, length in (("headers", head["hl"]), ("body", head["bl"]), ("last_err", head["el"])):
        parts[name] = raw[at:at + length]
        at += length
    if len(raw) != at:
        raise BadRecord(f"record of {len(raw)} bytes, its head says {at}")
    return {**head, "flow": flow, "url": url, **parts}


def encode(record: dict[str, Any]) -> bytes:
    """The inverse of ``decode`` (lengths are taken from the parts)."""
    parts = [record["flow"], record["url"], record["headers"], record["body"],
             record["last_err"]]
    parts = [p.encode() if isinstance(p, str) else p for p in parts]
    head = {**record, "fl": len(parts[0]), "ul": len(parts[1]), "hl": len(parts[2]),
            "bl": len(parts[3]), "el": len(parts[4])}
    return pack_head(head) + b"".join(parts)

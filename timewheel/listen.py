"""``timewheel listen``: a local receiver for development (docs/api.md, "CLI additions").

It prints each request it gets (method, path, headers, body) on stdout, flushed at once, checks
its Standard Webhooks signature when given the secret, and answers with one status (200 unless
``--status`` says otherwise). aiohttp's server (already the service's HTTP client) parses the
requests; this module only prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from aiohttp import web

from timewheel.clock import SystemClock
from timewheel.delivery.signing import decode_secret, verify
from timewheel.models import format_ms

DEFAULT_PORT = 9000
TOLERANCE_S = 5 * 60  # Standard Webhooks: a timestamp further off than this is refused
SECRET_ENV = "TIMEWHEEL_SIGNING_SECRET"


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    listen = commands.add_parser(
        "listen", help="print the callbacks it receives (a local receiver for development)",
        description="A local receiver for development: prints each request (method, path, "
        "headers, body), checks its signature when a secret is given, and answers --status.")
    listen.add_argument("--host", default="127.0.0.1", help="address to listen on "
                        "(default 127.0.0.1)")
    listen.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port to listen on (default {DEFAULT_PORT})")
    listen.add_argument("--secret", metavar="whsec_...", type=_secret,
                        help=f"verify each request's webhook-signature with this secret "
                        f"(default: {SECRET_ENV}'s first one, if set)")
    listen.add_argument("--status", type=_status, default=200,
                        help="the status to answer every request with (default 200)")


def _secret(text: str) -> str:
    try:
        decode_secret(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _status(text: str) -> int:
    if not text.isdigit() or not 200 <= int(text) <= 599:
        raise argparse.ArgumentTypeError(f"a status from 200 to 599, not {text!r}")
    return int(text)


def secret_from_environment(environ: Mapping[str, str]) -> str | None:
    """The first secret of ``TIMEWHEEL_SIGNING_SECRET``, read as the service reads it
    (comma-separated, blank entries dropped); None when it holds none. ValueError when that
    secret is malformed (its message never quotes it)."""
    entries = [part.strip() for part in environ.get(SECRET_ENV, "").split(",") if part.strip()]
    if not entries:
        return None
    decode_secret(entries[0])
    return entries[0]


def run(args: argparse.Namespace) -> int:
    secret = args.secret
    if secret is None:
        try:
            secret = secret_from_environment(os.environ)
        except ValueError as exc:  # as argparse does for a bad --secret: one line, exit 2
            sys.stderr.write(f"timewheel listen: {SECRET_ENV}: {exc}\n")
            return 2
    app = make_app(secret=secret, status=args.status)
    checked = "checking signatures" if secret else "not checking signatures (no --secret)"
    banner = (f"timewheel listen: on {listen_url(args.host, args.port)} (any path), "
              f"answering {args.status}, {checked}; Ctrl-C stops")
    try:
        # run_app calls print (in place of its own "Running on" lines) once the port is
        # bound: the banner never claims a port that is taken, nor comes before requests can.
        web.run_app(app, host=args.host, port=args.port, access_log=None,
                    print=lambda _running: _print(sys.stdout, banner))
    except OSError as exc:  # the port is taken, or the address is not this host's
        sys.stderr.write(f"timewheel listen: cannot listen on {args.host}:{args.port}: "
                         f"{exc.strerror or exc}\n")
        return 1
    return 0


def listen_url(host: str, port: int) -> str:
    """The URL of ``host:port``, an IPv6 address in brackets (its zone's ``%`` encoded), so
    that the banner's URL can be pasted as it is."""
    if ":" in host:
        host = "[" + host.replace("%", "%25") + "]"
    return f"http://{host}:{port}/"


def make_app(*, secret: str | None, status: int, out: TextIO | None = None) -> web.Application:
    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        _print(out or sys.stdout, describe(request.method, request.path_qs,
                                           list(request.headers.items()), body, secret))
        return web.Response(status=status)

    app = web.Application(client_max_size=2 * 1024 * 1024)  # a 1 MiB body plus headroom
    app.router.add_route("*", "/{path:.*}", receive)
    return app


def describe(method: str, path: str, headers: list[tuple[str, str]], body: bytes,
             secret: str | None) -> str:
    """What ``listen`` prints for one request: a header line, the headers, the body (JSON
    indented), and the signature's verdict when a secret is known."""
    lines = [f"--- {format_ms(SystemClock().now_ms())}  {method} {path}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append("")
    lines.append(_body_text(body))
    if secret is not None:
        lines.append(signature_verdict(secret, {k.lower(): v for k, v in headers}, body))
    return "\n".join(lines) + "\n"


def _body_text(body: bytes) -> str:
    if not body:
        return "(no body)"
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return f"({len(body)} bytes, not UTF-8 text)"
    try:
        value: Any = json.loads(text)
    except ValueError:
        return text
    return json.dumps(value, indent=2, ensure_ascii=False)


def signature_verdict(secret: str, headers: dict[str, str], body: bytes) -> str:
    """``signature ok``, or ``signature INVALID (why)`` (headers: lower-case names)."""
    missing = [name for name in ("webhook-id", "webhook-timestamp", "webhook-signature")
               if name not in headers]
    if missing:
        return f"signature INVALID (no {', '.join(missing)} header)"
    timestamp = headers["webhook-timestamp"]
    if not verify(secret, headers["webhook-id"], timestamp, body, headers["webhook-signature"]):
        return "signature INVALID (does not match this secret, id, timestamp and body)"
    age = SystemClock().now_ms() / 1000 - int(timestamp)
    if abs(age) > TOLERANCE_S:
        return (f"signature INVALID (timestamp {age:+.0f} s from this host's clock, "
                f"more than {TOLERANCE_S} s)")
    return "signature ok"


def _print(out: TextIO, text: str) -> None:
    line = text if text.endswith("\n") else text + "\n"
    try:
        out.write(line)
    except UnicodeEncodeError:  # a stdout that cannot encode it (PYTHONIOENCODING=ascii, ...)
        encoding = out.encoding or "ascii"
        out.write(line.encode(encoding, "backslashreplace").decode(encoding))
    out.flush()  # a pipe or a file sees each callback at once

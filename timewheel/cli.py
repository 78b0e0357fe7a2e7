"""``timewheel serve``: the API, the ticker and the dispatcher in one process (uvicorn)."""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from pydantic import ValidationError

from timewheel import __version__, keys_cli, listen
from timewheel.client import cli as client_cli
from timewheel.errors import StartRefused
from timewheel.settings import Settings, allowed, redact_url, secret_settings, shown_default

GC_THRESHOLD = 50_000  # allocations between young collections; CPython's default is 700


DESCRIPTION = ("Calls HTTP URLs at scheduled times, on Redis. `timewheel serve` runs the service; "
               "the other commands are its client (TIMEWHEEL_URL, TIMEWHEEL_TOKEN), a local "
               "receiver and the payload encryption keys' tools.")


def _parser() -> argparse.ArgumentParser:
    # Not the module docstring: that one is about `serve`, and this is every command's help.
    parser = argparse.ArgumentParser(prog="timewheel", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"timewheel {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the service",
                                description="Every setting below can also be given as an "
                                "environment variable TIMEWHEEL_<NAME>; flags win.")
    # --host and --port come from the settings like every other (TIMEWHEEL_HOST, _PORT).
    for name, info in Settings.model_fields.items():
        # A switch given alone turns it on (--allow-private-networks); a value still works.
        switch: dict[str, Any] = {"nargs": "?", "const": "true"} if info.annotation is bool else {}
        serve.add_argument(f"--{name.replace('_', '-')}", dest=f"setting_{name}", default=None,
                           metavar=name.upper() if name in ("host", "port") else "VALUE",
                           **switch,
                           help=_setting_help(name))
    # The client commands (tasks, flows, schedules) live in timewheel/client/cli.py.
    client_cli.add_commands(commands)
    listen.add_command(commands)
    keys_cli.add_command(commands)
    return parser


def _setting_help(name: str) -> str:
    """``TIMEWHEEL_<NAME> (default: ...; its range)``, as README.md's table gives them."""
    # %% for argparse, which %-formats help text (a pattern may hold one).
    bounds = (allowed(name) or "").replace("%", "%%")
    return (f"TIMEWHEEL_{name.upper()} (default: {shown_default(name)}"
            f"{'; ' + bounds if bounds else ''})")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "listen":
        sys.exit(listen.run(args))
    if args.command == "keys":
        sys.exit(keys_cli.run(args))
    if args.command != "serve":
        sys.exit(client_cli.run(args))
    overrides: dict[str, Any] = {
        key.removeprefix("setting_"): value for key, value in vars(args).items()
        if key.startswith("setting_") and value is not None}
    fmt = overrides.get("log_format") or next(  # names are any case, as for the settings
        (v for k, v in os.environ.items() if k.upper() == "TIMEWHEEL_LOG_FORMAT"), "text")
    warn = partial(_warn, fmt if fmt in ("text", "json") else "text")
    _warn_of_secret_flags(overrides, warn)
    _warn_of_unknown_names(os.environ, warn)
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        # Without the input values: a mistyped signing secret or token must not be echoed.
        problems = [f"  {'.'.join(map(str, e['loc']))}: {e['msg']}"
                    for e in exc.errors(include_input=False, include_url=False)]
        sys.exit("timewheel: invalid settings:\n" + "\n".join(problems))
    _warn_of_an_open_api(settings, warn)
    serve(settings, settings.host, settings.port)


# TIMEWHEEL_* names that are not the service's settings: the client's (timewheel tasks ...),
# and the test suite's choice of redis-server (tests/support/redis_server.py).
_NOT_SETTINGS = frozenset({"TIMEWHEEL_URL", "TIMEWHEEL_TOKEN", "TIMEWHEEL_TEST_REDIS_SERVER"})


def _warn(fmt: str, message: str) -> None:
    """A warning line before logging is set up (before the settings are read), in the format
    the service's log lines will have: a JSON log store must not meet one plain line."""
    from timewheel.logs import make_formatter  # here: the client's commands never need it

    record = logging.LogRecord("timewheel.cli", logging.WARNING, __file__, 0, message, None,
                               None)
    sys.stderr.write(make_formatter(fmt).format(record) + "\n")


def _warn_of_unknown_names(environ: Mapping[str, str], warn: Callable[[str], None]) -> None:
    """Name each TIMEWHEEL_* variable that is no setting, with the setting it most looks like:
    pydantic-settings ignores them, and TIMEWHEEL_API_TOKEN (singular) ran the API with no
    tokens, without a word. Never the value."""
    known = {f"TIMEWHEEL_{name.upper()}" for name in Settings.model_fields} | _NOT_SETTINGS
    for name in sorted(environ):
        upper = name.upper()
        if upper.startswith("TIMEWHEEL_") and upper not in known:
            near = difflib.get_close_matches(upper, sorted(known), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            warn(f"{name} is not a setting and is ignored{hint}; the settings are listed by "
                 "timewheel serve --help")


def _warn_of_an_open_api(settings: Settings, warn: Callable[[str], None]) -> None:
    """Beyond loopback with no API tokens, anyone who reaches the port can create, read and
    cancel tasks, and have the wheel call (and sign) any URL: say so (the service starts)."""
    if settings.api_tokens or _loopback(settings.host):
        return
    warn(f"listening on {settings.host} with no TIMEWHEEL_API_TOKENS: anyone who can reach "
         "this port can create, read and cancel tasks and have them call any URL, signed; set "
         "tokens (README.md, Security) or listen on 127.0.0.1 behind a proxy that checks "
         "callers")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: where it points is not known here
        return False


def _warn_of_secret_flags(overrides: dict[str, Any], warn: Callable[[str], None]) -> None:
    """Say which secrets were given as flags, where any user of the machine can read them
    (ps, /proc/<pid>/cmdline), and where they belong instead; never their values."""
    names = [name for name in secret_settings() if name in overrides]
    url = overrides.get("redis_url")
    if isinstance(url, str) and redact_url(url) != url:
        names.append("redis_url")
    if names:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in names)
        env = ", ".join(f"TIMEWHEEL_{name.upper()}" for name in names)
        warn(f"{flags} on the command line can be read by any user of this machine (ps, "
             f"/proc/<pid>/cmdline); set {env} in the service's environment instead (an "
             "environment file only root can read: README.md, Configuration)")


def serve(settings: Settings, host: str, port: int) -> None:
    import uvicorn

    from timewheel.api.app import create_app

    # uvicorn restores the previous SIGTERM handler after its graceful shutdown and raises the
    # signal again, so with the default handler the process would die by it (status 143).
    # docs/api.md promises exit 0 after a SIGTERM shutdown: make the re-raised signal a no-op.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    level = settings.log_level.upper()
    from timewheel.logs import configure_logging

    configure_logging(level, settings.log_format)
    app = create_app(settings)
    _tune_gc()
    # log_config=None: uvicorn's own lines go through the handler configure_logging set up
    # (JSON lines when TIMEWHEEL_LOG_FORMAT=json) instead of its own plain-text handlers.
    config = uvicorn.Config(QuietRefusal(app), host=host, port=port, loop="uvloop",
                            http="httptools", log_config=None,
                            log_level=settings.log_level.lower(), access_log=False,
                            timeout_graceful_shutdown=int(settings.batch_deadline_seconds) + 5)
    server = _stopping_server(config, app)
    server.run()
    if not server.started:  # what uvicorn.run does after a start the app refused
        sys.exit(STARTUP_FAILURE)


STARTUP_FAILURE = 3  # uvicorn's exit status for a start that failed


def _stopping_server(config: Any, app: Any) -> Any:
    """uvicorn's server, but its shutdown stops the wheel's work at once (``Wheel.begin_stop``)
    before it waits, up to the batch deadline + 5 s, for the API requests under way; the
    lifespan's ``close`` after that waits for the same stop and closes the clients. Without it
    the wheel went on claiming and sending while uvicorn waited, though docs/deploy.md
    ("Stopping: the grace period") says "On SIGTERM a `timewheel serve` process stops
    claiming", and the attempts it started late could outlast the grace period."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            wheel = getattr(app.state, "wheel", None)
            if wheel is not None:
                wheel.begin_stop()
            await super().shutdown(sockets)

    return Server(config)


class QuietRefusal:
    """The app, but a start it refuses (``StartRefused``: its reason is logged as one CRITICAL
    line) is reported to uvicorn without the traceback Starlette attaches, ~80 lines under
    that line (uvicorn logs it, then exits 3 all the same)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        failed: list[Any] = []

        async def held_if_failed(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed":
                failed.append(message)  # sent below, once the exception says which
                return
            await send(message)

        try:
            await self.app(scope, receive, held_if_failed)
        except StartRefused:
            await send({"type": "lifespan.startup.failed", "message": ""})
            raise
        except BaseException:
            for message in failed:
                await send(message)
            raise
        for message in failed:
            await send(message)


def _tune_gc() -> None:
    """Keep the cyclic garbage collector from stalling the event loop.

    Measured with bench/run.py: with CPython's defaults, full collections that walk every
    object of FastAPI, pydantic and the app made callbacks 90-150 ms late under API load and
    halved the POST rate. Freezing what exists at start-up takes those objects out of every
    later collection, and a larger first threshold makes collections rarer (the service
    allocates mostly short-lived, acyclic objects that reference counting frees at once).
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)


if __name__ == "__main__":
    main()

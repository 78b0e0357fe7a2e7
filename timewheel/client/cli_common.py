"""What the client CLI's command modules share (timewheel/client/cli.py, cli_topics.py): the
argument types, the task options of ``tasks add``, ``schedules set`` and ``topics publish``, and
``command``, which adds one subcommand with its handler. Its own module so that the command
modules import it, not each other."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from timewheel.client.sync import Client
from timewheel.models import Method, parse_execute_at

Handler = Callable[[Client, argparse.Namespace], Any]


# -- argument types -----------------------------------------------------------------------

def number(text: str) -> int | float:
    """An int when the text is one (``5`` is sent as ``5``, not ``5.0``), else a float."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):  # JSON has no NaN or Infinity
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def execute_at(text: str) -> str | int | float:
    """``--at``: Unix seconds, or an RFC 3339 date-time with offset (checked here)."""
    try:
        value: str | int | float = number(text)
    except argparse.ArgumentTypeError:
        value = text
    try:
        parse_execute_at(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_value(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constants)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}); quote a string as "
                                         "'\"text\"'") from None


class HeaderAction(argparse.Action):
    """``--header 'Name: value'``, repeatable, gathered into a dict. A missing colon, an empty
    name or a name given twice (in any case) is a usage error."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        text = str(values)
        name, colon, value = text.partition(":")
        name = name.strip()
        if not colon or not name or any(ch.isspace() for ch in name):
            parser.error(f"argument {option_string}: expected 'Name: value', got {text!r}")
        headers: dict[str, str] = dict(getattr(namespace, self.dest, None) or {})
        if name.lower() in (existing.lower() for existing in headers):
            parser.error(f"argument {option_string}: header {name!r} given twice")
        headers[name] = value.strip()
        setattr(namespace, self.dest, headers)


def task_options(parser: argparse.ArgumentParser) -> None:
    """The task fields shared by ``tasks add``, ``schedules set`` and ``topics publish``. The
    defaults named are the service's: a flow's retry defaults apply to a task that sets none."""
    parser.add_argument("--method", type=str.upper, choices=[m.value for m in Method],
                        help="HTTP method of the callback (default POST)")
    parser.add_argument("--body", type=json_value, metavar="JSON",
                        help="the callback's body, as JSON ('{\"a\": 1}', '\"text\"')")
    parser.add_argument("--header", dest="headers", action=HeaderAction, metavar="'NAME: VALUE'",
                        help="a header of the callback; repeat for more")
    parser.add_argument("--flow-key", metavar="F", help="the flow whose limits apply "
                        "(default: each callback URL's host:port)")
    parser.add_argument("--timeout", type=number, metavar="S",
                        help="per-attempt callback timeout in seconds")
    parser.add_argument("--max-attempts", type=int, metavar="N",
                        help="attempts (default: the flow's, else 5)")
    parser.add_argument("--retry-backoff", type=number, metavar="S",
                        help="seconds before the first retry (default: the flow's, else 1), "
                        "doubling")
    parser.add_argument("--on-success", metavar="URL", help="where the outcome is POSTed "
                        "when the callback is delivered (the task KEY.on_success)")
    parser.add_argument("--on-failure", metavar="URL", help="where the outcome is POSTed "
                        "when the task fails for good (the task KEY.on_failure)")


def task_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The task options the user gave; the service applies its defaults to the rest."""
    fields: dict[str, Any] = {"callback_url": args.url_arg}
    for option in ("method", "body", "headers", "flow_key", "timeout", "max_attempts",
                   "retry_backoff", "on_success", "on_failure"):
        value = getattr(args, option)
        if value is not None:
            fields[option] = value
    return fields


def command(group: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
             common: argparse.ArgumentParser, handler: Handler,
             summary: str) -> argparse.ArgumentParser:
    parser = group.add_parser(name, parents=[common], help=summary, description=summary)
    parser.set_defaults(handler=handler)
    return parser

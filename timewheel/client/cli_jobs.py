"""``timewheel jobs cancel|replay --filter ... | get ID`` (docs/api.md v3, "CLI additions"):
bulk jobs from the command line. Part of the client half of the CLI (timewheel/client/cli.py
adds these commands and runs them).

``--filter`` takes the API's filter either as one JSON object
(``--filter '{"key_prefix": "order."}'``) or as ``NAME=VALUE`` pairs, repeated
(``--filter key_prefix=order. --filter status=scheduled``); both may be mixed. Values are
sent as text, except ``due_before`` / ``created_before`` given as Unix seconds; the service
validates the filter (422 -> exit 1).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from timewheel.client.sync import Client

FIELDS = ("status", "key_prefix", "flow_key", "due_before", "created_before")
_TIMES = ("due_before", "created_before")


class _FilterAction(argparse.Action):
    """``--filter JSON`` or ``--filter NAME=VALUE``, repeatable, gathered into one dict."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        text = str(values).strip()
        found: dict[str, Any] = dict(getattr(namespace, self.dest, None) or {})
        if text.startswith("{"):
            try:
                given = json.loads(text)
            except ValueError as exc:
                parser.error(f"argument {option_string}: not valid JSON ({exc})")
            found.update(given)
        else:
            name, eq, value = text.partition("=")
            if not eq or name not in FIELDS:
                parser.error(f"argument {option_string}: expected NAME=VALUE with NAME one of "
                             f"{', '.join(FIELDS)}, or a JSON object; got {text!r}")
            found[name] = _seconds(value) if name in _TIMES else value
        setattr(namespace, self.dest, found)


def _seconds(text: str) -> str | int | float:
    """Unix seconds as a number (the API reads a string as RFC 3339); other text as is."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def add_jobs(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    jobs = commands.add_parser("jobs", help="cancel or replay many tasks by filter, in the "
                               "background")
    group = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")
    for kind, summary in (
            ("cancel", "cancel every matching task that has not finished and was created "
                       "before the job (POST /tasks/cancel); prints the job's id"),
            ("replay", "replay every matching failed or cancelled task (POST "
                       "/tasks/replay); prints the job's id")):
        parser = group.add_parser(kind, parents=[common], help=summary, description=summary)
        parser.add_argument("--filter", dest="job_filter", action=_FilterAction, required=True,
                            metavar="FILTER", help="NAME=VALUE (repeat) or a JSON object; "
                            f"names: {', '.join(FIELDS)}")
        parser.set_defaults(handler=_start, kind=kind)
    get = group.add_parser("get", parents=[common], help="show a job's progress",
                           description="show a job's progress (GET /jobs/{id})")
    get.add_argument("job_id", metavar="ID")
    get.set_defaults(handler=_get)


def _start(client: Client, args: argparse.Namespace) -> Any:
    if args.kind == "cancel":
        return client.cancel_tasks(args.job_filter)
    return client.replay_tasks(args.job_filter)


def _get(client: Client, args: argparse.Namespace) -> Any:
    return client.get_job(args.job_id)

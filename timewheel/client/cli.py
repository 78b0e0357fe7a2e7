"""The client half of the command line: ``timewheel tasks|flows|schedules|jobs ...`` (docs/api.md,
"Operations"). ``timewheel/cli.py`` owns the parser and ``serve``; it hands every other command
to ``run`` here.

Each command is one ``Client`` call. The answer is printed as JSON on stdout; an error is
printed on stderr with its status and detail, and the exit status says what kind it was:

    0  success
    1  the service answered with an error (4xx, 5xx)
    2  usage: bad arguments (argparse's own status), an empty KEY, ID or NAME, or a malformed
       TIMEWHEEL_URL or TIMEWHEEL_TOKEN
    3  the service could not be reached (connection refused, timeout)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx
from pydantic import BaseModel

from timewheel.client import cli_topics
from timewheel.client.cli_common import (
    Handler,
    command,
    execute_at,
    number,
    task_fields,
    task_options,
)
from timewheel.client.cli_jobs import add_jobs
from timewheel.client.errors import ClientError, UnreachableError
from timewheel.client.sync import Client
from timewheel.models import TaskStatus

EXIT_OK = 0
EXIT_API = 1
EXIT_USAGE = 2  # argparse's own status for usage errors
EXIT_UNREACHABLE = 3


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``tasks``, ``schedules``, ``flows`` and ``jobs`` to the ``timewheel`` parser. Input is
    checked by the service (docs/api.md's rules, 422 -> exit 1), except what argparse can tell on
    its own (a header without a colon, --delay with --at, a number that is not one)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--base-url", metavar="BASE_URL", help="the service's URL (default: "
                        "TIMEWHEEL_URL, else http://127.0.0.1:8080); the token is read from "
                        "TIMEWHEEL_TOKEN")
    _tasks(commands, common)
    _schedules(commands, common)
    _flows(commands, common)
    cli_topics.add_commands(commands, common)
    add_jobs(commands, common)


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run a parsed client command; returns the exit status."""
    handler: Handler = args.handler
    try:
        client = Client(args.base_url, transport=transport)
    except ValueError as exc:  # a malformed URL or token (the message omits their values)
        return _fail(str(exc), EXIT_USAGE)
    try:
        with client:
            output = handler(client, args)
    except ValueError as exc:  # refused before sending: an empty KEY, ID or NAME
        return _fail(str(exc), EXIT_USAGE)
    except UnreachableError as exc:
        return _fail(f"cannot reach the service: {exc}", EXIT_UNREACHABLE)
    except ClientError as exc:
        return _fail(str(exc), EXIT_API)
    if isinstance(output, BaseModel):
        output = output.model_dump(mode="json")
    try:
        sys.stdout.write(json.dumps(output, indent=2, ensure_ascii=False) + "\n")
    except UnicodeEncodeError:  # a stdout that cannot encode it: JSON's escapes, still JSON
        sys.stdout.write(json.dumps(output, indent=2) + "\n")
    return EXIT_OK


def _fail(message: str, status: int) -> int:
    sys.stderr.write(f"timewheel: {message}\n")
    return status


# -- tasks --------------------------------------------------------------------------------

def _tasks(commands: argparse._SubParsersAction[argparse.ArgumentParser],
           common: argparse.ArgumentParser) -> None:
    tasks = commands.add_parser("tasks", help="schedule, inspect, cancel and list tasks")
    group = tasks.add_subparsers(dest="action", required=True, metavar="ACTION")

    add = command(group, "add", common, _add_task, "schedule a callback (POST /tasks)")
    add.add_argument("url_arg", metavar="URL", help="the callback URL")
    add.add_argument("--key", metavar="K", help="the task's key (generated when absent); "
                     "repeating an add with the same key and content is safe")
    when = add.add_mutually_exclusive_group()
    when.add_argument("--delay", type=number, metavar="S", help="seconds from now")
    when.add_argument("--at", type=execute_at, metavar="TIME",
                      help="RFC 3339 date-time with offset, or Unix seconds")
    task_options(add)

    for name, handler, summary in (
            ("get", _get_task, "show a task"),
            ("cancel", _cancel_task, "cancel a task that has not finished"),
            ("replay", _replay_task, "schedule a failed or cancelled task again, now")):
        command(group, name, common, handler, summary).add_argument("key", metavar="KEY")

    move = command(group, "reschedule", common, _reschedule_task,
                    "move a task that has not finished to a new time, keeping its request "
                    "(PATCH /tasks/{key})")
    move.add_argument("key", metavar="KEY")
    when = move.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay", type=number, metavar="S", help="seconds from now")
    when.add_argument("--at", type=execute_at, metavar="TIME",
                      help="RFC 3339 date-time with offset, or Unix seconds")
    move.add_argument("--max-attempts", type=int, metavar="N", help="a new max_attempts")

    listing = command(group, "list", common, _list_tasks,
                       "one page of tasks with a status (failed: the dead letters)")
    listing.add_argument("--status", required=True, choices=[s.value for s in TaskStatus],
                         help="the tasks with this status (failed: the dead letters, newest "
                         "first; scheduled and retrying: soonest due first)")
    listing.add_argument("--prefix", metavar="P", help="only keys that start with P")
    listing.add_argument("--limit", type=int, metavar="N", help="page size, 1-1000 (default 100)")
    listing.add_argument("--cursor", metavar="C", help="next_cursor of the previous page")
    command(group, "attempts", common, _task_attempts,
             "a task's attempts, oldest first: outcome, status, error, response excerpt"
             ).add_argument("key", metavar="KEY")


def _add_task(client: Client, args: argparse.Namespace) -> Any:
    fields = task_fields(args)
    for option, field in (("key", "key"), ("delay", "delay"), ("at", "execute_at")):
        if getattr(args, option) is not None:
            fields[field] = getattr(args, option)
    return client.create_task(fields)


def _get_task(client: Client, args: argparse.Namespace) -> Any:
    return client.get_task(args.key)


def _reschedule_task(client: Client, args: argparse.Namespace) -> Any:
    return client.reschedule(args.key, delay=args.delay, execute_at=args.at,
                             max_attempts=args.max_attempts)


def _cancel_task(client: Client, args: argparse.Namespace) -> Any:
    client.cancel_task(args.key)
    return {"key": args.key, "cancelled": True}


def _replay_task(client: Client, args: argparse.Namespace) -> Any:
    return client.replay_task(args.key)


def _task_attempts(client: Client, args: argparse.Namespace) -> Any:
    """Printed as the API answers it: ``{"attempts": [...]}``."""
    return {"attempts": [a.model_dump(mode="json") for a in client.attempts(args.key)]}


def _list_tasks(client: Client, args: argparse.Namespace) -> Any:
    return client.list_tasks(args.status, key_prefix=args.prefix, limit=args.limit,
                             cursor=args.cursor)


# -- schedules ----------------------------------------------------------------------------

def _schedules(commands: argparse._SubParsersAction[argparse.ArgumentParser],
               common: argparse.ArgumentParser) -> None:
    schedules = commands.add_parser("schedules", help="recurring schedules")
    group = schedules.add_subparsers(dest="action", required=True, metavar="ACTION")

    set_ = command(group, "set", common, _set_schedule,
                    "create or replace a schedule: each occurrence becomes a task")
    set_.add_argument("schedule_id", metavar="ID")
    when = set_.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="5 fields (minute hour day-of-month "
                      "month day-of-week), or 6 with a leading seconds field")
    when.add_argument("--every", type=int, metavar="S", help="period in seconds, counted from "
                      "the Unix epoch")
    set_.add_argument("url_arg", metavar="URL", help="the callback URL")
    set_.add_argument("--timezone", metavar="TZ", help="IANA zone the cron expression is read "
                      "in (default UTC)")
    set_.add_argument("--paused", action="store_true", help="create it paused")
    task_options(set_)

    for name, handler, summary in (
            ("get", _get_schedule, "show a schedule"),
            ("delete", _delete_schedule, "delete a schedule: no occurrence starts after this"),
            ("pause", _pause_schedule, "pause: no occurrence starts until resume"),
            ("resume", _resume_schedule, "resume a paused schedule")):
        command(group, name, common, handler, summary).add_argument("schedule_id",
                                                                     metavar="ID")
    listing = command(group, "list", common, _list_schedules, "one page of schedules")
    listing.add_argument("--limit", type=int, metavar="N", help="page size")
    listing.add_argument("--cursor", metavar="C", help="next_cursor of the previous page")


def _set_schedule(client: Client, args: argparse.Namespace) -> Any:
    schedule: dict[str, Any] = {"task": task_fields(args)}
    for option in ("cron", "every", "timezone"):
        if getattr(args, option) is not None:
            schedule[option] = getattr(args, option)
    if args.paused:
        schedule["paused"] = True
    return client.set_schedule(args.schedule_id, schedule)


def _get_schedule(client: Client, args: argparse.Namespace) -> Any:
    return client.get_schedule(args.schedule_id)


def _delete_schedule(client: Client, args: argparse.Namespace) -> Any:
    client.delete_schedule(args.schedule_id)
    return {"id": args.schedule_id, "deleted": True}


def _pause_schedule(client: Client, args: argparse.Namespace) -> Any:
    return client.pause_schedule(args.schedule_id)


def _resume_schedule(client: Client, args: argparse.Namespace) -> Any:
    return client.resume_schedule(args.schedule_id)


def _list_schedules(client: Client, args: argparse.Namespace) -> Any:
    return client.list_schedules(limit=args.limit, cursor=args.cursor)


# -- flows --------------------------------------------------------------------------------

def _flows(commands: argparse._SubParsersAction[argparse.ArgumentParser],
           common: argparse.ArgumentParser) -> None:
    flows = commands.add_parser("flows", help="limits, pause and retry defaults of a flow")
    group = flows.add_subparsers(dest="action", required=True, metavar="ACTION")
    set_ = command(group, "set", common, _set_flow,
                    "set a flow's whole configuration; what is not given is cleared")
    set_.add_argument("key", metavar="KEY")
    set_.add_argument("--parallelism", type=int, metavar="N", help="attempts in flight at most")
    set_.add_argument("--rate", type=number, metavar="R", help="attempts started per second")
    set_.add_argument("--paused", action="store_true", help="start no attempt of the flow")
    set_.add_argument("--max-attempts", type=int, metavar="N",
                      help="attempts of the flow's tasks that set none")
    set_.add_argument("--retry-backoff", type=number, metavar="S",
                      help="seconds before the first retry (doubling), for tasks that set none")
    set_.add_argument("--max-backoff", type=number, metavar="S",
                      help="no retry of the flow waits longer (at most 86400)")
    command(group, "pause", common, _pause_flow,
             "start no attempt of the flow on any process").add_argument("key", metavar="KEY")
    command(group, "resume", common, _resume_flow,
             "start its waiting tasks again, in due order").add_argument("key", metavar="KEY")
    command(group, "get", common, _get_flow,
             "show a flow's limits and load").add_argument("key", metavar="KEY")
    command(group, "delete", common, _delete_flow,
             "back to the default limits").add_argument("key", metavar="KEY")
    command(group, "list", common, _list_flows, "the flows whose limits were set")


# What `flows set` clears when it is not given, by the view's field.
_FLOW_SETTINGS = ("paused", "parallelism", "rate", "max_attempts", "retry_backoff",
                  "max_backoff")


def _set_flow(client: Client, args: argparse.Namespace) -> Any:
    """PUT replaces the whole configuration. In an incident an operator raising one retry
    default resumed a paused flow and dropped its limits without a word (the first-hour
    audit): what changed that was not given is named on stderr."""
    try:
        before = client.get_flow(args.key)
    except ClientError:  # only for the note: the set itself says what is wrong
        before = None
    after = client.set_flow(args.key, {
        "parallelism": args.parallelism, "rate": args.rate, "paused": args.paused,
        "max_attempts": args.max_attempts, "retry_backoff": args.retry_backoff,
        "max_backoff": args.max_backoff})
    cleared = [f"{name} {json.dumps(getattr(before, name))} -> {json.dumps(getattr(after, name))}"
               for name in _FLOW_SETTINGS if before is not None and getattr(args, name) in
               (None, False) and getattr(before, name) != getattr(after, name)]
    if cleared:
        sys.stderr.write(f"timewheel: note: flows set replaces the whole configuration; "
                         f"not given, so changed: {', '.join(cleared)}\n")
    return after


def _pause_flow(client: Client, args: argparse.Namespace) -> Any:
    return client.pause_flow(args.key)


def _resume_flow(client: Client, args: argparse.Namespace) -> Any:
    return client.resume_flow(args.key)


def _get_flow(client: Client, args: argparse.Namespace) -> Any:
    return client.get_flow(args.key)


def _list_flows(client: Client, args: argparse.Namespace) -> Any:
    return client.list_flows()


def _delete_flow(client: Client, args: argparse.Namespace) -> Any:
    client.delete_flow(args.key)
    return {"key": args.key, "deleted": True}

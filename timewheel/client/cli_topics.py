"""``timewheel topics set|get|list|delete|publish``: the topic commands of the client CLI
(timewheel/client/cli.py has the others and ``run``, cli_common.py the shared option types).

    timewheel topics set orders --endpoint billing=https://billing.example.com/hook \\
        --endpoint email=https://mail.example.com/hook --endpoint-header billing 'X-Team: b'
    timewheel topics publish orders --key order-42 --body '{"id": 42}'

``publish`` takes the options of ``tasks add`` except the URL (each endpoint's is its task's).
"""

from __future__ import annotations

import argparse
from typing import Any

from timewheel.client import cli_common as shared
from timewheel.client.sync import Client


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                 common: argparse.ArgumentParser) -> None:
    topics = commands.add_parser("topics", help="fan-out: one publish, a task per endpoint")
    group = topics.add_subparsers(dest="action", required=True, metavar="ACTION")

    set_ = shared.command(group, "set", common, _set_topic,
                         "create or replace a topic and its endpoints (PUT /topics/{name})")
    set_.add_argument("name", metavar="NAME")
    set_.add_argument("--endpoint", dest="endpoints", action="append", required=True,
                      type=_endpoint, metavar="NAME=URL", help="an endpoint; repeat for more")
    set_.add_argument("--endpoint-header", dest="endpoint_headers", action="append", nargs=2,
                      default=[], metavar=("NAME", "'HEADER: VALUE'"),
                      help="a header sent to that endpoint only (over the published ones)")
    set_.set_defaults(parser=set_)

    for name, handler, summary in (
            ("get", _get_topic, "show a topic and its recent publishes"),
            ("delete", _delete_topic, "delete a topic (its publishes' tasks stay)")):
        shared.command(group, name, common, handler, summary).add_argument("name", metavar="NAME")
    listing = shared.command(group, "list", common, _list_topics, "one page of topics")
    listing.add_argument("--limit", type=int, metavar="N", help="page size")
    listing.add_argument("--cursor", metavar="C", help="next_cursor of the previous page")

    publish = shared.command(group, "publish", common, _publish,
                            "one task per endpoint, key <key>.<endpoint>, all or none")
    publish.add_argument("name", metavar="NAME")
    publish.add_argument("--key", metavar="K", help="the publish's key (generated when absent); "
                         "repeating a publish with the same key and content is safe")
    when = publish.add_mutually_exclusive_group()
    when.add_argument("--delay", type=shared.number, metavar="S", help="seconds from now")
    when.add_argument("--at", type=shared.execute_at, metavar="TIME",
                      help="RFC 3339 date-time with offset, or Unix seconds")
    shared.task_options(publish)
    publish.set_defaults(url_arg=None)


def _endpoint(text: str) -> dict[str, Any]:
    name, equals, url = text.partition("=")
    if not equals or not name or not url:
        raise argparse.ArgumentTypeError(f"expected NAME=URL, got {text!r}")
    return {"name": name, "url": url, "headers": {}}


def _set_topic(client: Client, args: argparse.Namespace) -> Any:
    endpoints = {e["name"]: e for e in args.endpoints}
    for name, header in args.endpoint_headers:
        field, colon, value = header.partition(":")
        if name not in endpoints or not colon or not field.strip():
            args.parser.error(f"argument --endpoint-header: {name} {header!r}: expected an "
                              "endpoint given with --endpoint and 'Header: value'")
        endpoints[name]["headers"][field.strip()] = value.strip()
    # Sent as given (a name twice included): the service judges the input.
    return client.set_topic(args.name, {"endpoints": args.endpoints})


def _get_topic(client: Client, args: argparse.Namespace) -> Any:
    return client.get_topic(args.name)


def _delete_topic(client: Client, args: argparse.Namespace) -> Any:
    client.delete_topic(args.name)
    return {"name": args.name, "deleted": True}


def _list_topics(client: Client, args: argparse.Namespace) -> Any:
    return client.list_topics(limit=args.limit, cursor=args.cursor)


def _publish(client: Client, args: argparse.Namespace) -> Any:
    """Printed as the API answers it: ``{"tasks": [...]}``."""
    fields = shared.task_fields(args)
    del fields["callback_url"]
    for option, field in (("key", "key"), ("delay", "delay"), ("at", "execute_at")):
        if getattr(args, option) is not None:
            fields[field] = getattr(args, option)
    return {"tasks": [t.model_dump(mode="json") for t in client.publish(args.name, fields)]}

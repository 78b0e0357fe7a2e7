"""``timewheel keys generate|rotate``: payload encryption keys (docs/security.md).

``generate`` prints a fresh ``<id>:<base64 key>`` entry for TIMEWHEEL_ENCRYPTION_KEYS.
``rotate`` seals every task under the first listed key (timewheel/store/rotation.py); it reads
the same settings as ``timewheel serve`` (TIMEWHEEL_REDIS_URL, _REDIS_CLUSTER, _KEY_PREFIX,
_ENCRYPTION_KEYS; with no Redis URL, the embedded Redis of TIMEWHEEL_DATA_DIR, which a running
``timewheel serve`` holds) and runs beside the serving processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from pydantic import ValidationError

from timewheel.errors import NotReplicated, StoreUnavailable
from timewheel.settings import Settings
from timewheel.store.connection import make_redis
from timewheel.store.durability import Durability
from timewheel.store.embedded import socket_dir
from timewheel.store.encryption import generate_line
from timewheel.store.rotation import DEFAULT_STEP, Rotation, RotationReport


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = commands.add_parser("keys", help="payload encryption keys (generate, rotate)",
                               description=__doc__)
    verbs = keys.add_subparsers(dest="keys_command", required=True)
    generate = verbs.add_parser("generate", help="print a fresh <id>:<base64 key> entry")
    generate.add_argument("--id", default="k1", help="the key's id (default k1)")
    rotate = verbs.add_parser(
        "rotate", help="seal every task under the first key of TIMEWHEEL_ENCRYPTION_KEYS",
        description="Seals every task record, attempt history entry and schedule spec that is "
        "not under the first key of TIMEWHEEL_ENCRYPTION_KEYS (or not sealed at all) under it, "
        "in bounded steps beside the running service. A record changed meanwhile is left as it is "
        "(tasks_changed): run it again until tasks_rekeyed=0 before unlisting an old key.")
    rotate.add_argument("--step", type=int, default=DEFAULT_STEP,
                        help=f"keys read per step (default {DEFAULT_STEP})")


def _say(text: str, *, error: bool = True) -> None:
    out = sys.stderr if error else sys.stdout
    out.write(text + "\n")
    out.flush()


def run(args: argparse.Namespace) -> int:
    if args.keys_command == "generate":
        try:
            _say(generate_line(args.id), error=False)
        except ValueError as exc:
            _say(f"timewheel keys generate: {exc}")
            return 2
        return 0
    return rotate(args.step)


def rotate(step: int) -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = [f"  {'.'.join(map(str, e['loc']))}: {e['msg']}"
                    for e in exc.errors(include_input=False, include_url=False)]
        _say("timewheel: invalid settings:\n" + "\n".join(problems))
        return 2
    cipher = settings.cipher()
    if cipher is None:
        _say("timewheel keys rotate: TIMEWHEEL_ENCRYPTION_KEYS is not set")
        return 2
    url = settings.redis_url
    if url is None:
        socket = os.path.join(socket_dir(settings.data_dir), "redis.sock")
        if not os.path.exists(socket):
            _say(f"timewheel keys rotate: no TIMEWHEEL_REDIS_URL, and no embedded Redis of "
                 f"{settings.data_dir} running (start timewheel serve first)")
            return 2
        url = f"unix://{socket}"

    def progress(report: RotationReport) -> None:
        _say(f"timewheel keys rotate: {report.line()}")

    async def main() -> RotationReport:
        redis = make_redis(url, cluster=settings.redis_cluster)
        try:
            rotation = Rotation(redis, settings.key_prefix, cipher, step=max(1, step),
                                durability=Durability(settings.redis_wait_replicas,
                                                      settings.redis_wait_timeout_ms))
            return await rotation.run(progress)
        finally:
            await redis.aclose()

    try:
        report = asyncio.run(main())
    except NotReplicated as exc:
        _say(f"timewheel keys rotate: rotated, but not yet on every replica ({exc}): keep the "
             "old key listed, and run it again until it says rotated")
        return 1
    except StoreUnavailable as exc:
        _say(f"timewheel keys rotate: Redis unavailable: {exc}")
        return 1
    _say(f"rotated to key id {cipher.key_id!r}: {report.line()}", error=False)
    if (report.tasks_unreadable or report.attempts_unreadable or report.schedules_unreadable
            or report.topics_unreadable):
        _say("timewheel keys rotate: some records are sealed under a key id that "
             "TIMEWHEEL_ENCRYPTION_KEYS does not list (or do not verify); list their key and "
             "run it again")
        return 3
    return 0

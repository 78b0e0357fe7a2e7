"""One hash slot moved between two masters of a live cluster, the way ``redis-cli --cluster
reshard`` moves it (redis-cli.c, ``clusterManagerMoveSlot``), and a move that broke off half-way
finished the way ``redis-cli --cluster fix`` finishes an open slot that is migrating on one node
and importing on another: forward, to the importing node.

The steps (https://redis.io/docs/latest/commands/cluster-setslot/, "Redis Cluster live
resharding explained"): ``CLUSTER SETSLOT <slot> IMPORTING <source id>`` on the target,
``MIGRATING <target id>`` on the source, ``CLUSTER GETKEYSINSLOT`` + ``MIGRATE ... KEYS`` in
batches until the source holds none, then ``SETSLOT <slot> NODE <target id>`` on the target, the
source and every other master.

A broken-off move is never undone with ``SETSLOT STABLE``: once the slot is closed, the target
neither owns nor imports it, so it answers MOVED to a MIGRATE of the keys that went over and
they stay there, out of reach of every client. The soak's first harness did exactly that and
lost the tasks whose record or minute slice had moved (bench/README.md, "Fault-injection soak").

Roles and slots are read from each server about itself (its ``myself`` line): another node's
table may lag a failover, and a SETSLOT sent on its word fails half-way.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from tests.cluster.replicated import ReplicatedCluster
from tests.support.redis_server import HOST, RedisServer

MIGRATE_TIMEOUT_MS = 5000
BATCH_RETRIES = 5  # a batch that failed for a transient reason (IOERR, a timeout) is sent again
_OPEN = re.compile(r"^\[(\d+)-([<>])-([0-9a-f]+)\]$")


@dataclass
class Migration:
    slot: int
    source: int  # ports
    target: int
    moved: int = 0  # keys moved
    batches: int = 0
    retried: int = 0  # batches sent again after a transient error


@dataclass
class SlotView:
    """What one master says of itself: its id, the slots it serves, the slots it has open."""

    node_id: str
    owned: set[int]
    migrating: dict[int, str]  # slot -> target id
    importing: dict[int, str]  # slot -> source id


def view(conn: redis.Redis) -> SlotView:
    text = conn.execute_command("CLUSTER", "NODES")
    text = text.decode() if isinstance(text, bytes) else str(text)
    line = next(row.split() for row in text.splitlines() if "myself" in row.split()[2])
    owned: set[int] = set()
    migrating: dict[int, str] = {}
    importing: dict[int, str] = {}
    for token in line[8:]:
        if found := _OPEN.match(token):
            slot, arrow, other = int(found.group(1)), found.group(2), found.group(3)
            (migrating if arrow == ">" else importing)[slot] = other
        elif "-" in token:
            lo, hi = token.split("-")
            owned.update(range(int(lo), int(hi) + 1))
        else:
            owned.add(int(token))
    return SlotView(line[0], owned, migrating, importing)


def masters(cluster: ReplicatedCluster) -> list[RedisServer]:
    """The live servers that say they are masters."""
    return [s for s in cluster.servers if s.running and not cluster.is_replica(s)]


def slot_owner(cluster: ReplicatedCluster, slot: int) -> int:
    """The port of the one master that says it serves ``slot``."""
    owners = []
    for server in masters(cluster):
        with server.client() as conn:
            if slot in view(conn).owned:
                owners.append(server.port)
    if len(owners) != 1:
        raise RuntimeError(f"slot {slot} is served by {owners or 'no master'}")
    return owners[0]


def plan_migration(cluster: ReplicatedCluster, slot: int, target: int) -> Migration:
    """A move of ``slot`` from the master that serves it now to master ``target``."""
    migration = Migration(slot, slot_owner(cluster, slot), target)
    if migration.source == target:
        raise ValueError(f"slot {slot} is already on {target}")
    return migration


def migrate(cluster: ReplicatedCluster, migration: Migration, *, batch: int = 10,
            pause: float = 0.05, after_batch: Callable[[Migration], None] | None = None
            ) -> Migration:
    """Run ``migration``, ``batch`` keys at a time with ``pause`` seconds between batches (so
    that clients meet the slot half-moved). ``after_batch`` runs after each batch (a test
    breaks the move off from there). If anything fails, the slot is left open on both nodes
    and ``migration`` says how far it got: ``finish_migration`` completes it."""
    _open(cluster, migration)
    _move_keys(cluster, migration, batch, pause, after_batch)
    _close(cluster, migration)
    return migration


def migrate_slot(cluster: ReplicatedCluster, slot: int, target: int, *, batch: int = 10,
                 pause: float = 0.05, after_batch: Callable[[Migration], None] | None = None
                 ) -> Migration:
    """Move ``slot`` from the master that serves it to master ``target`` (see ``migrate``)."""
    return migrate(cluster, plan_migration(cluster, slot, target), batch=batch, pause=pause,
                   after_batch=after_batch)


def finish_migration(cluster: ReplicatedCluster, migration: Migration, *, batch: int = 10
                     ) -> Migration:
    """Complete a move that broke off anywhere (redis-cli --cluster fix, "migrating on the
    source, importing on the target"): open states set again where they were lost, the rest
    of the keys moved, the target named owner on every master. Safe to call again."""
    with cluster.server(migration.target).client() as dst:
        target_owns = migration.slot in view(dst).owned
    if not target_owns:
        _open(cluster, migration)
    _move_keys(cluster, migration, batch, 0.0, None)
    _close(cluster, migration)
    return migration


def _ids(cluster: ReplicatedCluster, migration: Migration) -> tuple[str, str]:
    with cluster.server(migration.source).client() as src, \
            cluster.server(migration.target).client() as dst:
        return view(src).node_id, view(dst).node_id


def _open(cluster: ReplicatedCluster, migration: Migration) -> None:
    """IMPORTING on the target first, then MIGRATING on the source (redis-cli's order: a
    client sent ASK by the source must find the target ready); each only where not set yet."""
    src_id, dst_id = _ids(cluster, migration)
    slot = migration.slot
    with cluster.server(migration.source).client() as src, \
            cluster.server(migration.target).client() as dst:
        if view(dst).importing.get(slot) != src_id:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        source = view(src)
        if slot in source.owned and source.migrating.get(slot) != dst_id:
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)


def _move_keys(cluster: ReplicatedCluster, migration: Migration, batch: int, pause: float,
               after_batch: Callable[[Migration], None] | None) -> None:
    with cluster.server(migration.source).client() as src:
        while keys := src.execute_command("CLUSTER GETKEYSINSLOT", migration.slot, batch):
            for attempt in range(BATCH_RETRIES + 1):
                try:
                    src.execute_command("MIGRATE", HOST, migration.target, "", 0,
                                        MIGRATE_TIMEOUT_MS, "KEYS", *keys)
                    break
                except redis.ResponseError as exc:
                    # IOERR: the target did not answer in time (a loaded host); the keys are
                    # still on the source, or already moved (then the next GETKEYSINSLOT
                    # no longer lists them). Anything else (BUSYKEY: a key on both nodes) is
                    # not retried: it needs a look, not a REPLACE.
                    if not str(exc).startswith("IOERR") or attempt == BATCH_RETRIES:
                        raise
                    migration.retried += 1
                    time.sleep(0.2)
            migration.moved += len(keys)
            migration.batches += 1
            if after_batch is not None:
                after_batch(migration)
            if pause:
                time.sleep(pause)


def _close(cluster: ReplicatedCluster, migration: Migration) -> None:
    """SETSLOT NODE on the target first (it then serves the slot), then the source (it stops
    sending ASK), then every other master (each stops sending MOVED to the source)."""
    _src_id, dst_id = _ids(cluster, migration)
    others = [s.port for s in masters(cluster) if s.port not in (migration.source,
                                                                 migration.target)]
    for port in [migration.target, migration.source, *others]:
        with cluster.server(port).client() as conn:
            conn.execute_command("CLUSTER SETSLOT", migration.slot, "NODE", dst_id)

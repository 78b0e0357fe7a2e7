"""A Redis Cluster in production shape for tests: three masters, each with one replica, real
redis-server processes on loopback, and the operations the durability tests need (who serves a
slot, a master's death and its replica's promotion, a live slot migration)."""

from __future__ import annotations

import re
import subprocess
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

from tests.support.redis_server import CLUSTER_TIMEOUT, HOST, RedisServer, redis_cli_binary
from tests.support.waiting import settle

# The replica of a dead master takes over whatever the age of its data (the default refuses
# after node_timeout x 10 without the master; tests stop replicas for a moment on purpose).
_CLUSTER_ARGS = ["--cluster-replica-validity-factor", "0"]


def cluster_info(conn: redis.Redis) -> dict[str, str]:
    text = conn.execute_command("CLUSTER INFO")
    if isinstance(text, dict):  # some client versions parse the reply already
        return {str(k): str(v) for k, v in text.items()}
    text = text.decode() if isinstance(text, bytes) else str(text)
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


def knows(conn: redis.Redis, node_id: str) -> bool:
    """The node behind ``conn`` has ``node_id`` in its table."""
    return node_id in conn.execute_command("CLUSTER", "NODES").decode()


class ReplicatedCluster:
    """``size`` masters with one replica each. ``masters`` and ``replicas`` are the roles the
    cluster was created with; ``roles()`` reads the current ones (a failover swaps them)."""

    def __init__(self, directory: Path, *, size: int = 3) -> None:
        self.directory = Path(directory)
        self.size = size
        self.masters: list[RedisServer] = []
        self.replicas: list[RedisServer] = []

    @property
    def servers(self) -> list[RedisServer]:
        return [*self.masters, *self.replicas]

    @property
    def seed_url(self) -> str:
        return self.masters[0].url

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def start(self, attempts: int = 3) -> Self:
        """Start the nodes, join the masters, attach a replica to each. Ports are probed, so
        a parallel worker may take one first: then start over on new ports."""
        for attempt in range(1, attempts + 1):
            self.masters = self._new(f"a{attempt}-master")
            self.replicas = self._new(f"a{attempt}-replica")
            try:
                for server in self.servers:
                    server.start()
                self._create()
                self._attach_replicas()
                self.wait_ok()
                return self
            except Exception:
                self.stop()
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")

    def _new(self, name: str) -> list[RedisServer]:
        return [RedisServer(self.directory / f"{name}{i}", cluster=True, extra_args=_CLUSTER_ARGS)
                for i in range(self.size)]

    def _create(self) -> None:
        cmd = [redis_cli_binary(), "--cluster", "create",
               *(f"{HOST}:{m.port}" for m in self.masters),
               "--cluster-replicas", "0", "--cluster-yes"]
        done = subprocess.run(cmd, capture_output=True, timeout=CLUSTER_TIMEOUT, check=False)
        if done.returncode != 0:
            out = (done.stdout + done.stderr).decode(errors="replace")
            raise RuntimeError(f"redis-cli --cluster create failed ({done.returncode}):\n{out}")

    def _attach_replicas(self) -> None:
        """Replica i replicates master i: MEET, wait until it knows its master, REPLICATE."""
        for master, replica in zip(self.masters, self.replicas, strict=True):
            with master.client() as m, replica.client() as r:
                master_id = m.execute_command("CLUSTER MYID").decode()
                r.execute_command("CLUSTER MEET", HOST, master.port)
                settle(partial(knows, r, master_id), CLUSTER_TIMEOUT,
                       f"replica {replica.port} to meet {master.port}")
                r.execute_command("CLUSTER REPLICATE", master_id)

    def wait_ok(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """Every live node: state ok, all slots served, every node known; every master that
        has a replica attached sees it online."""
        live = [s for s in self.servers if s.running]
        states: dict[int, tuple[str | None, ...]] = {}

        def ready() -> bool:
            for server in live:
                with server.client() as conn:
                    info = cluster_info(conn)
                    states[server.port] = (info.get("cluster_state"),
                                           info.get("cluster_slots_ok"),
                                           info.get("cluster_known_nodes"))
            linked = all(self.replica_linked(r) for r in live if self.is_replica(r))
            return (linked and all(s == ("ok", "16384", str(len(self.servers)))
                                   for s in states.values()) and self._views_agree(live))

        settle(ready, timeout, lambda: f"the cluster to be ready (states: {states})")

    def _views_agree(self, live: list[RedisServer]) -> bool:
        """Every live node's table names as masters, among the live nodes, exactly those that
        say they are masters (roles spread by gossip: right after CLUSTER REPLICATE a peer may
        still list the replica as a master, and ``roles()`` / ``replica_of()`` read one node's
        table). A dead node left in the tables (``master,fail``) is not compared."""
        ports = {s.port for s in live}
        masters = {s.port for s in live if not self.is_replica(s)}
        for server in live:
            with server.client() as conn:
                text = conn.execute_command("CLUSTER", "NODES").decode()
            seen = {int(re.split(r"[:@]", line.split()[1])[1]) for line in text.splitlines()
                    if "master" in line.split()[2].split(",")}
            if seen & ports != masters:
                return False
        return True

    def is_replica(self, server: RedisServer) -> bool:
        with server.client() as conn:
            return conn.info("replication").get("role") == "slave"

    def replica_linked(self, server: RedisServer) -> bool:
        with server.client() as conn:
            return conn.info("replication").get("master_link_status") == "up"

    def roles(self) -> dict[int, int | None]:
        """port -> the port of its master (None for a master), as a live node sees it now;
        failed nodes are left out."""
        live = next(s for s in self.servers if s.running)
        with live.client() as conn:
            text = conn.execute_command("CLUSTER", "NODES").decode()
        ids, masters = {}, {}
        for line in text.splitlines():
            node_id, addr, flags, master_id = line.split()[:4]
            port = int(re.split(r"[:@]", addr)[1])
            ids[node_id] = port
            if "fail" not in flags.split(",") and "fail?" not in flags.split(","):
                masters[port] = None if "master" in flags.split(",") else master_id
        return {port: None if m is None else ids.get(m) for port, m in masters.items()}

    def owner(self, key: str) -> int:
        """Port of the master serving ``key``'s slot now."""
        live = next(s for s in self.servers if s.running)
        with live.client() as conn:
            slot = int(conn.execute_command("CLUSTER KEYSLOT", key))
            for row in conn.execute_command("CLUSTER SLOTS"):
                if row[0] <= slot <= row[1]:
                    return int(row[2][1])
        raise LookupError(f"no node serves slot {slot}")

    def replica_of(self, master_port: int) -> RedisServer:
        return self.server(next(p for p, m in self.roles().items() if m == master_port))

    def wait_promoted(self, dead_port: int, timeout: float = 30.0) -> int:
        """After ``dead_port`` died: wait until its replica serves its slots and the cluster
        is ok again on every live node; the new master's port."""
        replica = self.replica_of(dead_port).port
        roles: dict[int, int | None] = {}

        def promoted() -> bool:
            roles.update(self.roles())
            return roles.get(replica, 0) is None and self.state_ok()

        settle(promoted, timeout,
               lambda: f"replica {replica} to take over from {dead_port} (roles: {roles})")
        return replica

    def state_ok(self) -> bool:
        """cluster_state:ok on every live node."""
        for server in self.servers:
            if server.running:
                with server.client() as conn:
                    if cluster_info(conn).get("cluster_state") != "ok":
                        return False
        return True

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

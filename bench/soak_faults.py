"""The soak's faults: a plan drawn from the seed, and the code that injects each kind.

Every fault starts at a planned offset from the start of the load (``at``), 2 ms before the
middle of a burst of tasks the load created 5 s earlier, one due every millisecond around
that instant (bench/soak_load.py): the fault lands while attempts are between their start in
Redis and their send (or while their start calls are in flight to Redis), which is where a
process or Redis fault can double or delay a callback. A process fault is *aimed*: a burst's
tasks are all in one bucket and due within 16 ms, so one claim usually takes them all, and
the injector asks Redis which process holds the claim on the burst's middle task and kills or
stops that one; the planned target when no live process held it in time.
Faults run one after the other; each is logged with the time it began and the time the system
was whole again (the process restarted or resumed, Redis answering, the cluster ok).

Kinds: ``proc_kill`` (SIGKILL, restart 1 s later), ``proc_stop`` (SIGSTOP longer than any
lease, then SIGCONT), ``proc_partition`` (one Redis only: the process's connections to Redis
held, both ways, longer than any lease, while it runs and the others go on; what it sent
meanwhile reaches Redis after the heal, unless it aborted the connection:
tests/support/partition_proxy.py), ``redis_restart`` (SIGKILL of redis-server, restart from
its AOF on the same port), ``redis_stall`` (SIGSTOP of redis-server longer than the
service's socket timeout); with a cluster, ``failover``
(CLUSTER FAILOVER FORCE on a replica), ``master_kill`` (SIGKILL of a master, its replica
promoted, the old master restarted as a replica) and ``slot_migration`` (a task bucket's slot
moved to another master, key batch by key batch).
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from tests.cluster.replicated import ReplicatedCluster
from tests.cluster.reshard import finish_migration, migrate, plan_migration, slot_owner
from tests.support.redis_server import RedisServer
from timewheel.store.connection import SOCKET_TIMEOUT
from timewheel.store.keys import Keyspace
from timewheel.store.layout import HEAD_SIZE, NONE, digest, unpack_head

if TYPE_CHECKING:
    from bench.soak import Wheel

PROCESS_FAULTS = ("proc_kill", "proc_stop", "proc_partition")
# (proc_partition last: the short mode's first four faults stay where they were before it)
SINGLE_KINDS = ("proc_kill", "proc_stop", "redis_restart", "redis_stall", "proc_partition")
CLUSTER_KINDS = ("proc_kill", "proc_stop", "failover", "master_kill", "slot_migration")
# Seconds from the fault's instant at which a burst's tasks are due: one a millisecond from
# 8 ms before to 8 ms after. A process starts an attempt in Redis 5 ms before it is due and,
# once answered, waits for its time: wherever the fault lands, some are started and not yet
# sent. (Denser bursts make the process fall behind: it then sends each as soon as its start is
# answered, and the window closes.)
BURST = tuple(ms / 1000 for ms in range(-8, 9))
BURST_BUCKET = 5
AIM_FROM_S = 0.3  # claims reach a tick + 250 ms ahead: by then the burst's is usually made
RESTART_AFTER_S = 1.0
LEAD_S = 0.002  # a fault starts this long before the middle of its burst
REDIS_DOWN_S = 1.0  # a restart is not instant: its supervisor's delay, the AOF's load


def burst_keys(keys: Keyspace, n: int) -> list[str]:
    """The keys of fault ``n``'s burst, in BURST's order: all in one bucket, so that one claim
    call (everything of a bucket due up to its horizon) usually takes them all."""
    found = (key for j in range(10_000) if keys.bucket_of(key := f"b{n}-{j}") == BURST_BUCKET)
    return [next(found) for _ in BURST]


@dataclass
class Fault:
    at: float  # seconds after the load started
    kind: str
    target: int  # serve process index, or a choice among Redis nodes
    duration: float  # how long a stop or stall lasts (0 for the others)
    aimed: bool = False  # the target was the process seen holding the fault's burst
    aim_error: str = ""  # why aiming stopped early, if it did


def stop_seconds(timeout: float, margin: float, tick: float) -> float:
    """Longer than any lease (due + timeout + margin, claimed up to a tick ahead)."""
    return timeout + margin + tick + 3.0


def stall_seconds() -> float:
    """Longer than the service's Redis socket timeout."""
    return SOCKET_TIMEOUT + 2.0


def plan(seed: int, load_s: float, processes: int, *, cluster: bool, short: bool,
         timeout: float, margin: float, tick: float) -> list[Fault]:
    """The faults of one run. Short mode: one of each single-Redis kind (kill, stop, Redis
    restart, Redis stall), or of each cluster kind. Long mode: kinds drawn from a shuffled bag
    (so each comes up equally often), a random gap after each fault's recovery."""
    rng = random.Random(seed)
    kinds = CLUSTER_KINDS if cluster else SINGLE_KINDS
    recovery = timeout + margin + 2 * tick  # leases of what it held run out, then a tick
    out: list[Fault] = []
    t = 8.0 + rng.uniform(0, 2)
    bag: list[str] = []
    while True:
        if short:
            if len(out) == len(kinds):
                break
            kind = kinds[len(out)]
        else:
            if not bag:
                bag = list(kinds)
                rng.shuffle(bag)
            kind = bag.pop()
        duration = 0.0
        if kind in ("proc_stop", "proc_partition"):
            duration = stop_seconds(timeout, margin, tick) + (0 if short else rng.uniform(0, 4))
        elif kind == "redis_stall":
            duration = stall_seconds() + (0 if short else rng.uniform(0, 3))
        if not short and t + duration + recovery > load_s - 5:
            break
        out.append(Fault(round(t, 3), kind, rng.randrange(processes), round(duration, 3)))
        busy = {"proc_kill": 3.0, "redis_restart": 3.0, "master_kill": 15.0,
                "failover": 8.0, "slot_migration": 8.0}.get(kind, duration)
        t += busy + recovery + (rng.uniform(2, 4) if short else rng.uniform(4, 14))
    return out


class Injector:
    """Runs the faults one at a time, each at its instant (blocking: a thread of its own), and
    logs each in the history."""

    def __init__(self, wheel: Wheel) -> None:
        self.wheel = wheel
        self.keys = Keyspace(wheel.key_prefix)
        self._tokens: dict[bytes, str] = {}  # claim digest -> claim token (lua/claim.lua)

    def run_all(self, faults: list[Fault], t0: float, errors: list[str]) -> None:
        for n, fault in enumerate(faults):
            if fault.kind in PROCESS_FAULTS:
                self._sleep_until(t0 + fault.at - AIM_FROM_S)
                try:
                    self._aim(fault, burst_keys(self.keys, n)[len(BURST) // 2],
                              until=t0 + fault.at - 0.008)
                except Exception as exc:  # the last aim stands; the history says why
                    fault.aim_error = repr(exc)
            self._sleep_until(t0 + fault.at - LEAD_S)
            try:
                self.run(fault)
            except Exception as exc:  # reported with the summary; the run goes on
                errors.append(f"{fault.kind} at {fault.at}: {exc!r}")

    @staticmethod
    def _sleep_until(t: float) -> None:
        if t > time.time():
            time.sleep(t - time.time())

    def _aim(self, fault: Fault, task_key: str, *, until: float) -> None:
        """Target the live process whose claim holds ``task_key``, read again every 5 ms until
        ``until`` (a claim can still be released or taken again), over one connection: a new
        client costs ~1 ms of this process, which the load shares."""
        where, record = self.wheel.redis, self.keys.task(task_key)
        server = (where.server(where.owner(record)) if isinstance(where, ReplicatedCluster)
                  else where)
        with server.client() as conn:
            while time.time() < until:
                self._aim_once(fault, conn, task_key)
                time.sleep(0.005)

    def _aim_once(self, fault: Fault, conn: redis.Redis, task_key: str) -> None:
        """A task's record keeps only its claim token's digest; the token
        (``<pid>.<hex>.<n>``, engine/ticker.py) is in the name of the claim call's key list,
        ``cl:<token>``, in the task's bucket. Those are looked up once per claim: a SCAN of
        the keyspace (of the node that serves the bucket, on a cluster)."""
        raw = conn.getrange(self.keys.task(task_key), 0, HEAD_SIZE - 1)
        assert isinstance(raw, bytes)  # a client without decode_responses
        if len(raw) < HEAD_SIZE:
            return  # not created yet
        claim = unpack_head(raw)["claim"]
        if claim == NONE:
            return
        if claim not in self._tokens:
            bucket = self.keys.bucket_of(task_key)
            for name in conn.scan_iter(match=self.keys.claim_call(bucket, "*"), count=1000):
                token = name.decode().rpartition(":cl:")[2]
                self._tokens[digest(token)] = token
        token = self._tokens.get(claim)
        pid = int(token.partition(".")[0]) if token else None
        slot = next((i for i, s in enumerate(self.wheel.slots) if s.pid == pid), None)
        if slot is not None:
            fault.target, fault.aimed = slot, True

    def run(self, fault: Fault) -> dict[str, Any]:
        """Inject ``fault`` and log it; one that fails half-way is logged too (with its error:
        it may have left something broken), then the error is raised."""
        method = getattr(self, f"_{fault.kind}")
        start = time.time()
        try:
            info: dict[str, Any] = method(fault) or {}
        except Exception as exc:
            self.wheel.history.add("fault", kind=fault.kind, start=start, end=time.time(),
                                   planned_at=fault.at, aimed=fault.aimed,
                                   aim_error=fault.aim_error, target=fault.target,
                                   error=repr(exc))
            raise
        return self.wheel.history.add("fault", kind=fault.kind, start=start, end=time.time(),
                                      planned_at=fault.at, aimed=fault.aimed,
                                      aim_error=fault.aim_error, **info)

    # -- serve processes ---------------------------------------------------------------

    def _proc_kill(self, fault: Fault) -> dict[str, Any]:
        slot = self.wheel.slots[fault.target]
        pid = slot.pid
        slot.up = False
        self.wheel.kill(slot, "SIGKILL")
        time.sleep(RESTART_AFTER_S)
        self.wheel.restart(slot)
        return {"target": slot.name, "pid": pid, "detail": f"restarted as pid {slot.pid}"}

    def _proc_stop(self, fault: Fault) -> dict[str, Any]:
        slot = self.wheel.slots[fault.target]
        slot.up = False
        os.kill(slot.pid, signal.SIGSTOP)
        time.sleep(fault.duration)
        os.kill(slot.pid, signal.SIGCONT)
        slot.up = True
        return {"target": slot.name, "pid": slot.pid, "detail": f"stopped {fault.duration} s"}

    def _proc_partition(self, fault: Fault) -> dict[str, Any]:
        # The process stays up (slot.up): the load goes on sending it requests, answered 503
        # (or not at all) while it cannot reach Redis.
        slot = self.wheel.slots[fault.target]
        proxy = self.wheel.proxies[slot.name]
        proxy.partition()
        try:
            time.sleep(fault.duration)
        finally:
            proxy.heal()
        return {"target": slot.name, "pid": slot.pid,
                "detail": f"cut from Redis {fault.duration} s"}

    # -- one Redis ---------------------------------------------------------------------

    def _server(self) -> RedisServer:
        assert isinstance(self.wheel.redis, RedisServer)
        return self.wheel.redis

    def _redis_restart(self, fault: Fault) -> dict[str, Any]:
        server = self._server()
        server.kill()
        down = time.time()
        time.sleep(REDIS_DOWN_S)
        server.start()
        return {"target": f"redis:{server.port}",
                "detail": f"SIGKILL, back from AOF after {time.time() - down:.2f} s"}

    def _redis_stall(self, fault: Fault) -> dict[str, Any]:
        server = self._server()
        with server.stopped():
            time.sleep(fault.duration)
        return {"target": f"redis:{server.port}", "detail": f"SIGSTOP {fault.duration} s"}

    # -- a cluster ---------------------------------------------------------------------

    def _cluster(self) -> ReplicatedCluster:
        assert isinstance(self.wheel.redis, ReplicatedCluster)
        return self.wheel.redis

    def _masters(self) -> list[int]:
        """The masters as each live server says of itself, once the cluster has settled from
        the previous fault (one node's table may still list a demoted master as one, and a
        SETSLOT or failover aimed by it fails half-way)."""
        cluster = self._cluster()
        cluster.wait_ok(60)
        return sorted(s.port for s in cluster.servers
                      if s.running and not cluster.is_replica(s))

    def _failover(self, fault: Fault) -> dict[str, Any]:
        cluster = self._cluster()
        masters = self._masters()
        old = masters[fault.target % len(masters)]
        replica = cluster.replica_of(old)
        with replica.client() as conn:
            conn.execute_command("CLUSTER FAILOVER FORCE")
        deadline = time.monotonic() + 30
        while cluster.roles().get(replica.port, 0) is not None or not cluster.state_ok():
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {replica.port} not promoted")
            time.sleep(0.1)
        cluster.wait_ok(30)
        return {"target": f"master:{old}", "detail": f"replica {replica.port} promoted"}

    def _master_kill(self, fault: Fault) -> dict[str, Any]:
        cluster = self._cluster()
        masters = self._masters()
        old = masters[fault.target % len(masters)]
        cluster.replica_of(old)  # fail now, before the kill, if it has none
        server = cluster.server(old)
        server.kill()
        try:
            promoted = cluster.wait_promoted(old)
        finally:  # back as a replica, whatever happened: never leave a node dead
            server.start()
            self.wheel.apply_appendfsync(server)
        cluster.wait_ok(60)
        return {"target": f"master:{old}",
                "detail": f"SIGKILL; replica {promoted} promoted; {old} back as a replica"}

    def _slot_migration(self, fault: Fault) -> dict[str, Any]:
        """Move a task bucket's slot to another master as ``redis-cli --cluster reshard``
        does (tests/cluster/reshard.py). A move that breaks off is finished forward, as
        ``redis-cli --cluster fix`` would: never undone (closing the slot strands on the
        target every key that moved, as the first harness did, losing their tasks)."""
        cluster = self._cluster()
        keys = Keyspace(self.wheel.key_prefix)
        bucket = fault.target * 5 % keys.buckets
        tag = keys.prefix(bucket)
        masters = self._masters()
        with cluster.server(masters[0]).client() as conn:
            slot = int(conn.execute_command("CLUSTER KEYSLOT", tag))
        source = slot_owner(cluster, slot)
        migration = plan_migration(cluster, slot, next(p for p in masters if p != source))
        broke = None
        try:
            migrate(cluster, migration)
        except Exception as exc:
            broke = _chain(exc)
            for attempt in range(3):
                try:
                    if attempt:
                        cluster.wait_ok(30)
                    finish_migration(cluster, migration)
                    break
                except Exception as again:
                    if attempt == 2:
                        raise RuntimeError(f"slot {slot} left open: {_chain(again)}; "
                                           f"it broke off with {broke}") from again
        cluster.wait_ok(60)
        info = {"target": f"slot:{slot}",
                "detail": f"bucket {bucket}: {migration.moved} keys from {source} to "
                          f"{migration.target} "
                          f"in {migration.batches} batches"}
        if migration.retried:
            info["detail"] += f", {migration.retried} batches sent again after IOERR"
        if broke:
            info["broke_off"] = broke
        return info


def _chain(exc: BaseException) -> str:
    """An error with the errors it was raised from or during (the first harness logged only
    its undo's MovedError, which hid why the move itself had failed)."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 4:
        parts.append(repr(seen))
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(parts)

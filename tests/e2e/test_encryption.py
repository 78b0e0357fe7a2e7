"""Payload encryption at rest end to end: real `timewheel serve` processes, a real redis-server,
a real receiver, and `redis-cli` reading every key as an operator's dump would.

- With TIMEWHEEL_ENCRYPTION_KEYS, no header value, body or response body is readable in Redis
  (every key read by its type, and the append-only file on disk); without (the control), all
  of them are. The callback still arrives with its headers and body.
- A task sealed under a key id the process does not list is failed with a last_error naming
  it and never sent (control: a task sealed under a listed key, due at the same moment, is
  delivered); listed again, a replay delivers it. While another live process lists its key,
  a process that does not hands it back instead, and that one sends it.
- A rotation mid-run (tasks under the old key and the new, due while it runs) loses nothing:
  every task arrives once with its payload, and afterwards the new key alone reads every one.
- Bad keys refuse to start, naming the entry and never echoing a key.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Service
from tests.support.receiver import Reply, ThreadedReceiver
from tests.support.redis_server import HOST, RedisServer, redis_cli_binary
from tests.support.waiting import settle

pytestmark = pytest.mark.e2e

K0 = f"k0:{base64.b64encode(bytes(range(32))).decode()}"
K1 = f"k1:{base64.b64encode(bytes(range(100, 132))).decode()}"
HEADER_VALUE = "hdr-7f3a9c-secret"
BODY_VALUE = "body-2b8e41-secret"
RESPONSE_VALUE = "resp-c05d17-secret"
MARKERS = (HEADER_VALUE, BODY_VALUE, RESPONSE_VALUE)


def redis_cli(port: int, *args: str, stdin: str | None = None) -> bytes:
    done = subprocess.run([redis_cli_binary(), "-h", HOST, "-p", str(port), "--raw", *args],
                          input=None if stdin is None else stdin.encode(), capture_output=True,
                          timeout=60, check=True)
    return done.stdout


def dump_with_redis_cli(port: int) -> bytes:
    """`redis-cli --scan`, then every key read as its type says (GET, HGETALL, ZRANGE, LRANGE,
    SMEMBERS): what an operator, a replica or a backup sees."""
    names = [n for n in redis_cli(port, "--scan").decode().splitlines() if n]
    types = redis_cli(port, stdin="".join(f"TYPE {n}\n" for n in names)).decode().split()
    assert len(types) == len(names)
    read = {"string": "GET {}", "hash": "HGETALL {}", "zset": "ZRANGE {} 0 -1 WITHSCORES",
            "list": "LRANGE {} 0 -1", "set": "SMEMBERS {}"}
    commands = "".join(read[t].format(n) + "\n" for n, t in zip(names, types, strict=True))
    return redis_cli(port, stdin=commands)


def aof_bytes(server: RedisServer) -> bytes:
    """Every append-only file of the server (Redis 6: one file; 7: a directory of them)."""
    return b"".join(p.read_bytes() for p in server.directory.rglob("*.aof*") if p.is_file())


def create(service: Service, key: str, url: str, **fields: Any) -> dict[str, Any]:
    with service.client() as client:
        resp = client.post("/tasks", json={
            "key": key, "callback_url": url, "headers": {"X-Secret": HEADER_VALUE},
            "body": {"note": BODY_VALUE, "key": key}, **fields})
    assert resp.status_code == 201, resp.text
    return resp.json()  # type: ignore[no-any-return]


def view(service: Service, key: str) -> dict[str, Any]:
    with service.client() as client:
        resp = client.get(f"/tasks/{key}")
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def wait_status(service: Service, keys: list[str], status: str, timeout: float = 30
                ) -> dict[str, dict[str, Any]]:
    def probe() -> dict[str, dict[str, Any]] | None:
        views = {key: view(service, key) for key in keys}
        return views if all(v["status"] == status for v in views.values()) else None
    return settle(probe, timeout, f"{keys} {status}")


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "control-plain"])
def test_a_dump_of_redis_shows_no_payload(
        encrypted: bool, start_service: Callable[..., Service], receiver: ThreadedReceiver,
        redis_server_e2e: RedisServer) -> None:
    receiver.respond("/ok", [Reply(200, body=RESPONSE_VALUE.encode())])
    receiver.respond("/bad", [Reply(400, body=RESPONSE_VALUE.encode())])
    service = start_service(**({"encryption_keys": K0} if encrypted else {}))
    create(service, "delivered", receiver.url("/ok"))
    create(service, "failed", receiver.url("/bad"))
    create(service, "pending", receiver.url("/ok"), delay=3600)
    with service.client() as client:  # a schedule's task template holds headers and body too
        resp = client.put("/schedules/hourly", json={"every": 3600, "task": {
            "callback_url": receiver.url("/ok"), "headers": {"X-Secret": HEADER_VALUE},
            "body": {"note": BODY_VALUE}}})
        assert resp.status_code == 201, resp.text
    wait_status(service, ["delivered"], "succeeded")
    wait_status(service, ["failed"], "failed")

    # The callback carries the request as given.
    [arrival] = receiver.arrivals_for("/ok")
    assert arrival.headers["x-secret"] == HEADER_VALUE
    assert json.loads(arrival.body) == {"note": BODY_VALUE, "key": "delivered"}
    # The API shows it decrypted: the pending task's request, the failed one's response.
    pending = view(service, "pending")
    assert pending["headers"]["X-Secret"] == HEADER_VALUE
    assert pending["body"] == {"note": BODY_VALUE, "key": "pending"}
    with service.client() as client:
        [attempt] = client.get("/tasks/failed/attempts").json()["attempts"]
        schedule = client.get("/schedules/hourly").json()
    assert attempt["response_body"] == RESPONSE_VALUE
    assert schedule["task"]["headers"] == {"X-Secret": HEADER_VALUE}
    assert schedule["task"]["body"] == {"note": BODY_VALUE}

    dump = dump_with_redis_cli(redis_server_e2e.port)
    aof = aof_bytes(redis_server_e2e)
    # The dump did read the tasks, the schedule and the occurrence it made.
    assert b"pending" in dump and b"pending" in aof and b"hourly" in dump
    for marker in MARKERS:
        assert (marker.encode() in dump) is not encrypted, marker
        assert (marker.encode() in aof) is not encrypted, marker


def test_unknown_key_id_fails_the_task_unsent(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """Tasks sealed under k0 by one process; a process listing only k1 moves them due (PATCH
    needs no plaintext) together with a control task sealed under k1."""
    old = start_service(encryption_keys=K0)
    for i in range(3):
        create(old, f"under-k0-{i}", receiver.url("/k0"), delay=3600,
               on_failure=receiver.url("/failed"))
    assert old.stop() == 0
    new = start_service(encryption_keys=K1)
    create(new, "under-k1", receiver.url("/k1"), delay=3600)
    with new.client() as client:
        for key in ("under-k0-0", "under-k0-1", "under-k0-2", "under-k1"):
            assert client.patch(f"/tasks/{key}", json={"delay": 0.5}).status_code == 200
    views = wait_status(new, ["under-k0-0", "under-k0-1", "under-k0-2"], "failed")
    wait_status(new, ["under-k1"], "succeeded")  # the control: the same wait delivers
    for v in views.values():
        assert v["last_error"] == ("encrypted with key id 'k0', which TIMEWHEEL_ENCRYPTION_KEYS "
                                   "does not list: list the key, then replay the task")
    assert receiver.arrivals_for("/k0") == []
    assert len(receiver.arrivals_for("/k1")) == 1
    for v in views.values():  # failed at its time, not before, as its first attempt
        assert (v["attempts"], v["finished_at"] >= v["execute_at"]) == (1, True)
    # Each failure calls its on_failure (its URL is stored unsealed): the receiver learns of it.
    settle(lambda: len(receiver.arrivals_for("/failed")) == 3, 30, "three on_failure results")
    reported = {json.loads(a.body)["key"]: json.loads(a.body)["attempt"]
                for a in receiver.arrivals_for("/failed")}
    assert reported == dict.fromkeys(views, 1)
    with new.client() as client:
        failed = client.get("/tasks", params={"status": "failed"}).json()
    assert {t["key"] for t in failed["tasks"]} >= set(views)
    assert "encrypted with key id 'k0'" in new.log()

    # The operator lists k0 again (after k1, which keeps sealing) and replays: delivered.
    assert new.stop() == 0
    both = start_service(encryption_keys=f"{K1},{K0}")
    with both.client() as client:
        assert client.post("/tasks/under-k0-1/replay").status_code in (200, 202)
    wait_status(both, ["under-k0-1"], "succeeded")
    [arrival] = receiver.arrivals_for("/k0")
    assert arrival.headers["x-secret"] == HEADER_VALUE
    assert json.loads(arrival.body) == {"note": BODY_VALUE, "key": "under-k0-1"}


def rotate(service: Service) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "timewheel.cli", "keys", "rotate",
                           "--step", "25"], env=service.env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_rotation_mid_run_loses_nothing(
        start_service: Callable[..., Service], receiver: ThreadedReceiver,
        redis_server_e2e: RedisServer, tmp_path: Path) -> None:
    """200 tasks sealed under k0 (due over the next seconds, and 40 an hour away), the process
    restarted with k1 first, 100 more under k1, and `keys rotate` run while they fall due.
    Every task arrives once with its payload; then a process with k1 alone delivers the 40
    after a PATCH brings them forward."""
    old = start_service(encryption_keys=K0)
    soon = [f"soon-{i}" for i in range(200)]
    later = [f"later-{i}" for i in range(40)]
    with old.client() as client:
        for i, key in enumerate(soon):
            resp = client.post("/tasks", json={
                "key": key, "callback_url": receiver.url("/r"), "delay": 4 + (i % 40) * 0.1,
                "headers": {"X-Secret": f"{HEADER_VALUE}-{key}"}, "body": {"key": key}})
            assert resp.status_code == 201
        for key in later:
            create(old, key, receiver.url("/later"), delay=3600)
    assert old.stop() == 0
    new = start_service(encryption_keys=f"{K1},{K0}")
    fresh = [f"fresh-{i}" for i in range(100)]
    with new.client() as client:
        resp = client.post("/tasks/batch", json={"tasks": [
            {"key": key, "callback_url": receiver.url("/r"), "delay": 1 + (i % 30) * 0.1,
             "headers": {"X-Secret": f"{HEADER_VALUE}-{key}"}, "body": {"key": key}}
            for i, key in enumerate(fresh)]})
        assert resp.status_code in (200, 201, 207), resp.text
    before = len(receiver.arrivals_for("/r"))
    done = rotate(new)  # runs while the tasks fall due
    assert done.returncode == 0, done.stderr
    assert "rotated to key id 'k1'" in done.stdout
    report = dict(part.split("=") for part in done.stdout.split(": ", 1)[1].split())
    # It ran mid-run: tasks under k0 were still pending (rekeyed: at least the 40 later
    # ones, and some soon ones), and deliveries went on after it.
    assert int(report["tasks_rekeyed"]) > len(later), done.stdout
    expected = set(soon) | set(fresh)
    assert before < len(expected)

    settle(lambda: len(receiver.arrivals_for("/r")) >= len(expected) or None, 60,
           "every task delivered")
    arrivals = receiver.arrivals_for("/r")
    keys = [json.loads(a.body)["key"] for a in arrivals]
    assert sorted(keys) == sorted(expected)  # each once, none lost
    for arrival in arrivals:
        key = json.loads(arrival.body)["key"]
        assert arrival.headers["x-secret"] == f"{HEADER_VALUE}-{key}"

    # Every record is now under k1: a process without k0 reads and delivers the rest.
    assert new.stop() == 0
    again = rotate(new)
    assert again.returncode == 0 and "tasks_rekeyed=0" in again.stdout, again.stdout
    only_k1 = start_service(encryption_keys=K1)
    with only_k1.client() as client:
        for key in later:
            assert client.patch(f"/tasks/{key}", json={"delay": 0.2}).status_code == 200
    wait_status(only_k1, later, "succeeded")
    assert sorted(json.loads(a.body)["key"] for a in receiver.arrivals_for("/later")) == sorted(
        later)


@pytest.mark.parametrize(("value", "problem"), [
    ("k0:not-base64!", "key 'k0' is not valid base64"),
    (f"k0:{base64.b64encode(bytes(31)).decode()}", "key 'k0' is 31 bytes"),
    ("just-a-key", "entry 1 is not <id>:<base64 key>"),
    (f"{K0},{K0}", "key id 'k0' is listed twice"),
])
def test_bad_keys_refuse_to_start(value: str, problem: str, tmp_path: Path,
                                  redis_server_e2e: RedisServer) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEWHEEL_")}
    env.update({"TIMEWHEEL_REDIS_URL": redis_server_e2e.url,
                "TIMEWHEEL_ENCRYPTION_KEYS": value, "TIMEWHEEL_DATA_DIR": str(tmp_path)})
    done = subprocess.run([sys.executable, "-m", "timewheel.cli", "serve", "--port", "1"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "invalid settings" in done.stderr and "encryption_keys" in done.stderr
    assert problem in done.stderr, done.stderr
    assert value.partition(":")[2] not in done.stderr or value.partition(":")[2] == ""


def test_the_startup_log_redacts_the_keys(start_service: Callable[..., Service]) -> None:
    service = start_service(encryption_keys=f"{K1},{K0}")
    line = next(x for x in service.log().splitlines() if "starting with settings:" in x)
    assert "encryption_keys=<redacted:2>" in line
    assert K0.partition(":")[2] not in service.log() and K1.partition(":")[2] not in line


def test_processes_whose_key_lists_do_not_fit_name_each_other(
        start_service: Callable[..., Service]) -> None:
    """Step 1 of a key change skipped in a rolling deploy: a new process seals with k1 while
    an old one lists only k0. The new one says so as it starts (its first check), naming the
    old one; the old one at its next check (every 10 s)."""
    old = start_service(encryption_keys=K0)
    new = start_service(encryption_keys=f"{K1},{K0}")
    settle(lambda: "does not list key id 'k1'" in new.log(), 20, "the new process's error")
    settle(lambda: "seals payloads with key id 'k1'" in old.log(), 30, "the old process's error")
    assert new.log().count("does not list key id 'k1'") == 1  # once, not every check
    assert "seals payloads with key id" not in new.log()  # it can open what the old one seals


def test_a_process_lacking_the_key_hands_its_tasks_to_one_that_lists_it(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """Step 1 of a key change skipped: the new process seals with k1, the old one lists only k0.
    The new one is stopped (SIGSTOP) while the tasks fall due, so the old one claims every one:
    it hands each back, unsent, while the new one is still listed as live, and the new one
    sends them all once it runs again. None fails."""
    new = start_service(encryption_keys=f"{K1},{K0}")
    old = start_service(encryption_keys=K0)
    settle(lambda: "seals payloads with key id 'k1'" in old.log(), 20, "the old process's check")
    keys = [f"under-k1-{i}" for i in range(4)]
    for key in keys:
        create(new, key, receiver.url("/k1"), delay=4, on_failure=receiver.url("/failed"))
    new.signal(signal.SIGSTOP)  # before its tick claims them (1.25 s ahead at most)
    try:
        settle(lambda: "are handed back for the processes that list it" in old.log(), 20,
               lambda: f"the old process handing back; its log:\n{old.log()}")
        assert receiver.arrivals_for("/k1") == []
    finally:
        new.signal(signal.SIGCONT)
    views = wait_status(old, keys, "succeeded")
    assert {v["attempts"] for v in views.values()} == {1}  # the hand-backs were not counted
    arrivals = receiver.arrivals_for("/k1")
    assert sorted(json.loads(a.body)["key"] for a in arrivals) == keys
    assert {a.headers["x-secret"] for a in arrivals} == {HEADER_VALUE}
    assert receiver.arrivals_for("/failed") == []

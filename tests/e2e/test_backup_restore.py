"""docs/deploy.md, "Backup and restore", run as written against a running `timewheel serve`.

The procedure's blocks are read from docs/deploy.md (tests/support/deploy_doc.py). The wheel
holds one of everything (tests/support/wheel_contents.py); after the restore a new service on
the restored Redis must show all of it as it was at the backup and deliver the due tasks to a
real receiver once each, none early. The external test also shows what a restore cannot keep,
as the document says: a task created after the backup is gone, one cancelled after it comes
back, one delivered after it is delivered again with the same webhook-id.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Service
from tests.support import deploy_doc
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer, redis_cli_binary, redis_server_binary
from tests.support.waiting import settle
from tests.support.wheel_contents import PAUSED, Contents, early, ok, post

pytestmark = pytest.mark.e2e


def start(services: list[Service], directory: Path, redis_url: str | None) -> Service:
    service = Service(directory, redis_url)
    services.append(service)
    return service.start()


def check_restored(contents: Contents, restored: Service, started_at: float,
                   once: list[str]) -> None:
    """The due tasks ``once`` arrive once each, the schedule goes on, the paused flow's task
    waits until the flow is resumed, and nothing ever arrives early."""
    receiver = contents.receiver
    contents.wait_delivered()
    receiver.wait_for_sync(1 + len(receiver.arrivals_for("/sched")), timeout=30, path="/sched")
    assert any(a.received_at >= started_at for a in receiver.arrivals_for("/sched"))
    counts = {key: len(contents.arrivals(key)) for key in once}
    assert counts == dict.fromkeys(once, 1)
    assert contents.arrivals("bk-held") == []  # its flow is still paused
    assert len(contents.arrivals("bk-done")) == 1  # delivered before the backup, not again
    with restored.client() as http:
        ok(http.post(f"/flows/{PAUSED}/resume"))
        receiver.wait_for_sync(1, timeout=30, path="/held")
        for key in [*once, "bk-held"]:
            settle(lambda key=key: http.get(f"/tasks/{key}").json()["status"] == "succeeded",
                   30, f"{key} to succeed")
        assert http.get("/tasks/bk-far").json()["status"] == "scheduled"
        assert http.get("/tasks/bk-cancelled").json()["status"] == "cancelled"
    assert early(receiver.arrivals) == []


def test_embedded_backup_of_a_running_service_restores_every_task(
        tmp_path: Path, receiver: ThreadedReceiver, services: list[Service]) -> None:
    """`valkey-cli --rdb` from the running embedded Valkey, restored into a fresh data dir
    through an append-only base file; `timewheel serve` on that data dir has it all."""
    live = start(services, tmp_path / "live", None)
    contents = Contents(receiver, soon_s=30)
    with live.client() as http:
        contents.create(http)
        before = contents.snapshot(http)
    env = {"PY": sys.executable, "TIMEWHEEL_DATA_DIR": str(live.directory / "data"),
           "BACKUP": str(tmp_path / "backup"), "NEW": str(tmp_path / "restored" / "data")}
    deploy_doc.run(["embedded-tools", "backup-embedded"], env, tmp_path)
    assert (tmp_path / "backup" / "dump.rdb").stat().st_size > 0
    assert live.stop() == 0
    assert [a for a in receiver.arrivals if a.path != "/done" and a.path != "/sched"] == []

    output = deploy_doc.run(["embedded-tools", "restore"], env, tmp_path)
    assert sorted((tmp_path / "restored" / "data").iterdir()) == [
        tmp_path / "restored" / "data" / "appendonlydir"], output
    started_at = time.time()
    restored = start(services, tmp_path / "restored", None)
    with restored.client() as http:
        contents.compare(before, contents.snapshot(http))
    check_restored(contents, restored, started_at, contents.due)


def test_external_backup_with_bgsave_restores_it_as_it_was_then(
        tmp_path: Path, receiver: ThreadedReceiver, services: list[Service]) -> None:
    """BGSAVE on an external Redis and a copy of its dump.rdb, restored into a new Redis
    directory: the wheel as it was at the backup, with the losses the document names."""
    with RedisServer(tmp_path / "redis", appendfsync="always") as source:
        live = start(services, tmp_path / "live", source.url)
        contents = Contents(receiver, soon_s=25)
        with live.client() as http:
            contents.create(http)
            post(http, {"key": "bk-cancel-late", "callback_url": receiver.url("/cancel-late"),
                        "delay": 25})
            post(http, {"key": "bk-again", "callback_url": receiver.url("/again"), "delay": 3})
            before = contents.snapshot(http)
            before["task bk-cancel-late"] = ok(http.get("/tasks/bk-cancel-late"))
        env = {"CLI": redis_cli_binary(), "SERVER": redis_server_binary(),
               "REDIS_URL": source.url, "REDIS_DIR": str(source.directory),
               "BACKUP": str(tmp_path / "backup"), "NEW": str(tmp_path / "redis-restored")}
        deploy_doc.run(["backup-bgsave"], env, tmp_path)
        with live.client() as http:  # after the backup: lost or undone by the restore
            post(http, {"key": "bk-late", "callback_url": receiver.url("/late"), "delay": 3600})
            assert http.delete("/tasks/bk-cancel-late").status_code == 204
        receiver.wait_for_sync(1, timeout=20, path="/again")  # delivered after the backup
        assert live.stop() == 0
    assert [a.path for a in receiver.arrivals if a.path not in ("/done", "/sched")] == ["/again"]

    deploy_doc.run(["restore"], env, tmp_path)
    with RedisServer(tmp_path / "redis-restored", appendfsync="always") as target:
        started_at = time.time()
        restored = start(services, tmp_path / "restored", target.url)
        with restored.client() as http:
            after = contents.snapshot(http)
            after["task bk-cancel-late"] = ok(http.get("/tasks/bk-cancel-late"))
            contents.compare(before, after)  # bk-cancel-late: scheduled again
            assert http.get("/tasks/bk-late").status_code == 404
        check_restored(contents, restored, started_at, [*contents.due, "bk-cancel-late"])
        again = contents.arrivals("bk-again")
        assert len(again) == 2 and again[1].received_at >= started_at
        assert {a.headers["timewheel-attempt"] for a in again} == {"1"}

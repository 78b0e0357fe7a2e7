"""One service a data dir (timewheel/store/embedded.py): a second service started on a data
dir a running one holds refuses to start, and leaves the first one's embedded Redis alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from timewheel.store.embedded import DataDirInUse, EmbeddedRedis


def test_a_second_service_on_a_data_dir_refuses_and_leaves_the_first_alone(
        tmp_path: Path) -> None:
    """Before the lock, the second took the first's server for a left-over and stopped it,
    and the first answered 503 until restarted. Now the second refuses, naming the first, the
    first's server runs on, and once the first stops the data dir is free."""
    data = tmp_path / "data"
    first = EmbeddedRedis(data)
    first.start()
    try:
        with pytest.raises(DataDirInUse, match=rf"in use by another timewheel process "
                                               rf"\(pid {os.getpid()}\)"):
            EmbeddedRedis(data).start()
        client = redis.Redis.from_url(first.url)
        try:
            assert client.ping()
        finally:
            client.close()
        assert first._process is not None and first._process.poll() is None
    finally:
        first.stop()
    again = EmbeddedRedis(data)
    again.start()
    again.stop()


def test_a_killed_service_lets_go_of_its_data_dir(tmp_path: Path) -> None:
    """The lock is the kernel's: a service that is SIGKILLed holds the data dir no longer,
    and the next one starts (stopping the server the dead one left, if it outlived it)."""
    data = tmp_path / "data"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from timewheel.store.embedded import EmbeddedRedis; "
         "held = EmbeddedRedis(Path(sys.argv[1])); held.start(); "
         "print('up', flush=True); time.sleep(600)",
         str(data)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "up\n"
        with pytest.raises(DataDirInUse, match=rf"\(pid {holder.pid}\)"):
            EmbeddedRedis(data).start()
        holder.kill()
        holder.wait()
        after = EmbeddedRedis(data)
        after.start()
        after.stop()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()

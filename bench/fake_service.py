"""An in-memory stand-in for ``timewheel serve``, only to test the bench harness itself.

    python -m bench.fake_service --port 8080

It speaks just enough of docs/api.md for bench/run.py (``POST /tasks``,
``GET/DELETE /tasks/{key}``, ``GET /healthz``) and fires each task from the
event loop at its ``execute_at`` with aiohttp, retrying 5xx with a jittered,
doubling backoff. No Redis, no persistence, no validation worth the name: its
numbers say nothing about timewheel. ``python -m bench.run --fake-service``
uses it so the harness can be exercised before the service exists.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import signal
import sys
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import require_loopback, run


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _parse_when(value: Any) -> float:
    if isinstance(value, int | float):
        return round(float(value), 3)
    return dt.datetime.fromisoformat(str(value)).timestamp()


class FakeWheel:
    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.handles: dict[str, asyncio.TimerHandle] = {}
        self.session: aiohttp.ClientSession | None = None
        self.sem = asyncio.Semaphore(200)

    def view(self, t: dict[str, Any]) -> dict[str, Any]:
        return {
            "key": t["key"], "status": t["status"], "execute_at": _iso(t["execute_at"]),
            "callback_url": t["callback_url"], "method": t["method"], "attempts": t["attempts"],
            "max_attempts": t["max_attempts"], "next_attempt_at": _iso(t["next_attempt_at"]),
            "last_attempt_at": _iso(t["last_attempt_at"]), "last_status_code": t["last_status"],
            "last_error": t["last_error"], "created_at": _iso(t["created_at"]),
            "finished_at": _iso(t["finished_at"]),
        }

    def _arm(self, key: str, when: float) -> None:
        loop = asyncio.get_running_loop()
        self.handles[key] = loop.call_later(max(0.0, when - time.time()), self._due, key)

    def _due(self, key: str) -> None:
        t = self.tasks.get(key)
        if t is None or t["status"] not in ("scheduled", "retrying"):
            return
        # loop timers may fire a little before the wall-clock instant (ms rounding):
        # never fire early, re-arm for the remainder instead
        if time.time() < t["next_attempt_at"]:
            self._arm(key, t["next_attempt_at"])
            return
        t["status"] = "delivering"
        asyncio.get_running_loop().create_task(self._deliver(t))

    async def _deliver(self, t: dict[str, Any]) -> None:
        assert self.session is not None
        t["attempts"] += 1
        t["last_attempt_at"] = now = time.time()
        headers = {
            **t["headers"], "content-type": "application/json", "webhook-id": t["key"],
            "webhook-timestamp": str(int(now)), "timewheel-attempt": str(t["attempts"]),
            "timewheel-scheduled-at": _iso(t["execute_at"]) or "", "user-agent": "timewheel-fake/0",
        }
        status: int | None = None
        try:
            async with self.sem, self.session.request(
                t["method"], t["callback_url"], data=json.dumps(t["body"]).encode(),
                headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=t["timeout"]),
            ) as resp:
                await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            t["last_error"] = repr(exc)
        t["last_status"] = status
        if status is not None and 200 <= status < 300:
            t["status"], t["finished_at"], t["next_attempt_at"] = "succeeded", time.time(), None
        elif (status is None or status >= 500 or status in (408, 429)) and \
                t["attempts"] < t["max_attempts"]:
            backoff = min(3600.0, t["retry_backoff"] * 2 ** (t["attempts"] - 1))
            t["next_attempt_at"] = time.time() + backoff * random.uniform(0.9, 1.1)
            t["status"] = "retrying"
            self._arm(t["key"], t["next_attempt_at"])
        else:
            t["status"], t["finished_at"], t["next_attempt_at"] = "failed", time.time(), None

    async def create(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            key = data.get("key") or uuid.uuid4().hex
            if "execute_at" in data:
                when = _parse_when(data["execute_at"])
            else:
                when = time.time() + float(data.get("delay", 0))
            task = {
                "key": key, "callback_url": str(data["callback_url"]),
                "method": str(data.get("method", "POST")).upper(),
                "headers": dict(data.get("headers") or {}), "body": data.get("body"),
                "execute_at": when, "timeout": float(data.get("timeout", 10)),
                "max_attempts": int(data.get("max_attempts", 5)),
                "retry_backoff": float(data.get("retry_backoff", 1)),
            }
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"detail": [{"msg": str(exc)}]}, status=422)
        old = self.tasks.get(key)
        if old is not None:
            same = all(old[k] == v for k, v in task.items())
            return web.json_response(self.view(old) if same else {"detail": "conflict"},
                                     status=200 if same else 409)
        task.update(status="scheduled", attempts=0, next_attempt_at=when, last_attempt_at=None,
                    last_status=None, last_error=None, created_at=time.time(), finished_at=None)
        self.tasks[key] = task
        self._arm(key, when)
        return web.json_response(self.view(task), status=201, headers={"Location": f"/tasks/{key}"})

    async def get(self, request: web.Request) -> web.Response:
        t = self.tasks.get(request.match_info["key"])
        if t is None:
            return web.json_response({"detail": "not found"}, status=404)
        return web.json_response(self.view(t))

    async def delete(self, request: web.Request) -> web.Response:
        t = self.tasks.get(request.match_info["key"])
        if t is None:
            return web.json_response({"detail": "not found"}, status=404)
        if t["status"] in ("succeeded", "failed", "cancelled"):
            return web.json_response(self.view(t), status=409)
        t["status"], t["finished_at"] = "cancelled", time.time()
        h = self.handles.pop(t["key"], None)
        if h is not None:
            h.cancel()
        return web.Response(status=204)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})


async def _serve(host: str, port: int, max_seconds: float) -> int:
    wheel = FakeWheel()
    wheel.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200))
    app = web.Application()
    app.add_routes([web.post("/tasks", wheel.create), web.get("/tasks/{key}", wheel.get),
                    web.delete("/tasks/{key}", wheel.delete), web.get("/healthz", wheel.healthz)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=1024).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), timeout=max_seconds)
    except TimeoutError:
        pass
    for h in wheel.handles.values():
        h.cancel()
    await runner.cleanup()
    await wheel.session.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fake_service")
    p.add_argument("serve", nargs="?", help="ignored (mirrors `timewheel serve`)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-seconds", type=float, default=3600.0)
    args = p.parse_args(argv)
    require_loopback(args.host)
    return run(_serve(args.host, args.port, args.max_seconds))


if __name__ == "__main__":
    sys.exit(main())

"""What `POST /tasks` would cost without timewheel: two stand-ins on the same uvicorn settings
as `timewheel serve` (uvloop, httptools, no access log), for bench/README.md's "What bounds
POST /tasks".

    python -m bench.run --workload post --tasks 20000 \\
        --service-cmd "{python} -m bench.asgi_floor raw serve --host {host} --port {port}"

``raw``: a bare ASGI callable that parses the body and answers 201 (``DELETE``: 204, anything
else: 200). ``fastapi``: one FastAPI route with a pydantic body model and a
``response_model``, nothing else. Neither stores anything; their figures are floors.
"""

# No `from __future__ import annotations`: FastAPI reads the route's annotations when it is
# declared, and the models here are local to fastapi_app.
import argparse
import json
from typing import Any

import uvicorn

ANSWER = json.dumps({"key": "x", "status": "scheduled", "attempts": 0,
                     "execute_at": "2026-11-26T16:00:00.000Z",
                     "created_at": "2026-11-26T15:00:00.000Z"}).encode()


async def raw(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            done = message["type"] != "lifespan.startup"
            await send({"type": "lifespan.shutdown.complete" if done
                        else "lifespan.startup.complete"})
            if done:
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    status, answer = {"POST": (201, ANSWER), "DELETE": (204, b"")}.get(
        scope["method"], (200, b'{"status":"ok"}'))
    if scope["method"] == "POST":
        json.loads(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": answer})


def fastapi_app() -> Any:
    from fastapi import FastAPI, Response
    from pydantic import BaseModel

    app = FastAPI()

    class TaskIn(BaseModel):
        key: str | None = None
        callback_url: str
        execute_at: Any = None
        body: Any = None

    class TaskOut(BaseModel):
        key: str
        status: str
        execute_at: str
        created_at: str
        attempts: int

    @app.post("/tasks", status_code=201, response_model=TaskOut)
    async def create(task: TaskIn) -> TaskOut:
        return TaskOut(key=task.key or "x", status="scheduled", attempts=0,
                       execute_at="2026-11-26T16:00:00.000Z",
                       created_at="2026-11-26T15:00:00.000Z")

    @app.delete("/tasks/{key}", status_code=204, response_model=None)
    async def delete(key: str) -> Response:
        return Response(status_code=204)

    @app.get("/healthz")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["raw", "fastapi"])
    p.add_argument("serve", nargs="?", help="ignored (mirrors `timewheel serve`)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    args = p.parse_args()
    app = raw if args.kind == "raw" else fastapi_app()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()

"""``POST /tasks`` without FastAPI's routing and dependency solving, for a request that is
well formed; every other request goes on to the FastAPI route (api/tasks.py ``create_task``),
which stays the one definition of the endpoint: its OpenAPI entry, its errors.

Why: FastAPI's machinery is most of what a create costs the service. Routing through the app's
routers, solving three dependencies and building the response took ~60 % of the in-process CPU
of a create (cProfile), and a one-route FastAPI app answered half as many POSTs a second as
uvicorn does (bench/README.md, "What bounds ``POST /tasks``"). The figures with and without
this route are in bench/README.md, "``POST /tasks`` off FastAPI's routing".

What this route does is the FastAPI route's happy path, in its order: the scope check (which
raises the same 401/403 as the route class, before the body is read), the body read strictly
as JSON (api/routing.py), validation by the same model in the same (Python) mode, the wheel
(api/deps.py ``get_wheel``), ``wheel.tasks.create`` and the task view encoded as FastAPI
encodes a ``response_model``. A body that is not ``application/json``, not strict JSON or
not valid for the model (or that fails to be read at all) is handed, bytes and all, to the
FastAPI route, so every answer to a malformed request comes from one place. Errors raised
after validation (a conflict, Redis unavailable, a limit of the settings) are the same domain
errors the FastAPI route raises, answered by the same handlers (api/errors.py) around the
router.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import URLPath
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Message, Receive, Scope, Send

from timewheel.api.deps import Needs, get_wheel
from timewheel.api.routing import StrictJSONRequest
from timewheel.api.views import task_view
from timewheel.models import TaskCreate
from timewheel.scopes import Scope as TokenScope

PATH = "/tasks"
_PASSED = "timewheel.create_route.passed"  # scope key: this request goes to the FastAPI route


class CreateTaskRoute(BaseRoute):
    """Placed first among the app's routes (api/app.py); matches ``POST /tasks`` only."""

    path_format = PATH  # the span name of a traced request (timewheel/tracing.py)

    def __init__(self) -> None:
        self.needs = Needs(TokenScope.WRITE)

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        raise NoMatchFound(name, path_params)  # nameless: url_for finds FastAPI's routes

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"] == PATH and not scope.get("root_path")  # else: FastAPI's
                and _PASSED not in scope):
            return Match.FULL, {"route": self}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = StrictJSONRequest(scope, receive)
        await self.needs(request)
        if request.headers.get("content-type", "").partition(";")[0].strip().lower() \
                != "application/json":
            await _pass_on(scope, receive, send, None)
            return
        try:
            body = await request.body()
        except Exception:  # the client left mid-body (or the size limit refused it)
            await _pass_on(scope, receive, send, None)
            return
        try:
            fields = TaskCreate.model_validate(await request.json())
        except Exception:  # not JSON, not valid, or worse (nested too deep to parse)
            await _pass_on(scope, receive, send, body)
            return
        wheel = await get_wheel(request)
        result = await wheel.tasks.create(fields)
        content = task_view(result.record).model_dump_json(by_alias=True).encode()
        response = Response(content, status_code=201 if result.created else 200,
                            media_type="application/json")
        if result.created:
            response.headers["Location"] = f"{PATH}/{result.record.key}"
        await response(scope, receive, send)


async def _pass_on(scope: Scope, receive: Receive, send: Send, body: bytes | None) -> None:
    """Route the request again, past this route, with the body this route has read (None:
    left unread)."""
    scope[_PASSED] = True
    replayed = body is None

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body or b"", "more_body": False}

    router = scope["router"]
    await router.app(scope, replay, send)

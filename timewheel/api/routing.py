"""The route class of the API (``/tasks``, ``/flows``, ...): checks the bearer token and its scope
before the body is read, and parses JSON strictly.

- Every route declares its scope with ``dependencies=[Needs.READ|WRITE|ADMIN]`` (api/deps.py);
  a route that declares none is refused when the app is built, so none is left open by mistake.
- Authentication first: with a plain dependency FastAPI parses (and validates) the body before
  any dependency runs, so an unauthenticated caller (or one whose token's scope is too small)
  would learn about its malformed JSON (422) instead of getting 401 (or 403).
- Strict JSON: Python's json module accepts ``NaN`` and ``Infinity``, which are not JSON, and
  reads ``1e400`` as infinity; they would reach validation (whose error echo then fails to
  encode: a 500) or be stored in a body sent as ``application/json``. A body that is not
  UTF-8 would be a bare 400. All are refused here as FastAPI's own 422 ``json_invalid``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from timewheel.api.deps import Needs, needed_scope


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    """A JSON number too large for a float (``1e400``) would become ``inf``: refused as the
    constants are (its echo in a 422 could not be encoded: a 500)."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is too large a number")
    return value


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            raw = await self.body()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise json.JSONDecodeError("body is not UTF-8", "", exc.start) from exc
            try:
                self._json = json.loads(text, parse_constant=_no_constants,
                                        parse_float=_finite)
            except ValueError as exc:
                if isinstance(exc, json.JSONDecodeError):
                    raise
                raise json.JSONDecodeError(str(exc), text, 0) from exc
        return self._json


_AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or invalid bearer token (when tokens are set)"},
    403: {"description": "the token's scope is too small; the detail names the scope needed"},
}


class TaskRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        kwargs["responses"] = {**_AUTH_RESPONSES, **(kwargs.get("responses") or {})}
        super().__init__(path, endpoint, **kwargs)
        needs = self._needs()
        self.description = f"{self.description}\n\nToken scope: `{needs.scope.value}`.".lstrip()

    def _needs(self) -> Needs:
        needs = needed_scope(self.dependencies)
        if needs is None:
            raise TypeError(f"{sorted(self.methods or ())} {self.path} declares no scope: add "
                            "dependencies=[Needs.READ] (or WRITE, ADMIN; api/deps.py)")
        return needs

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()  # called by APIRoute.__init__
        needs = self._needs()

        async def strict_handler(request: Request) -> Response:
            await needs(request)
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler

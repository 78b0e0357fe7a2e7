"""The route class of ``/tasks``: checks the bearer token before the body is read, and parses
JSON strictly.

- Authentication first: with a plain dependency FastAPI parses (and validates) the body before
  any dependency runs, so an unauthenticated caller would learn about its malformed JSON (422)
  instead of getting 401.
- Strict JSON: Python's json module accepts ``NaN`` and ``Infinity``, which are not JSON; they
  would reach validation (whose error echo then fails to encode: a 500) or be stored in a body
  sent as ``application/json``. A body that is not UTF-8 would be a bare 400. Both are refused
  here as FastAPI's own 422 ``json_invalid``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from timewheel.api.deps import require_token


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            raw = await self.body()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise json.JSONDecodeError("body is not UTF-8", "", exc.start) from exc
            try:
                self._json = json.loads(text, parse_constant=_no_constants)
            except ValueError as exc:
                if isinstance(exc, json.JSONDecodeError):
                    raise
                raise json.JSONDecodeError(str(exc), text, 0) from exc
        return self._json


class TaskRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            await require_token(request)
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler

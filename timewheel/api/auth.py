"""``GET /auth``: the scope of the caller's token, so a client (the dashboard) can show only what
the token may do (docs/api.md v3, "Scoped tokens"; this endpoint is an addition to the contract).
Any valid token may ask; without tokens configured every caller is ``admin``."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from timewheel.api.deps import Needs, granted_scope
from timewheel.api.routing import TaskRoute

router = APIRouter(tags=["operations"], route_class=TaskRoute)


class AuthView(BaseModel):
    scope: Literal["read", "write", "admin"] = Field(
        description="what the token may do: read (every GET), write (also tasks and "
                    "schedules), admin (also flows)")


@router.get("/auth", dependencies=[Needs.READ], response_model=AuthView,
            responses={401: {"description": "missing or invalid bearer token"}})
async def whoami(request: Request) -> AuthView:
    """The scope of the token this request carries."""
    return AuthView(scope=(await granted_scope(request)).value)

"""Dependencies of the routes: the wheel of this app, and bearer tokens with their scopes.

Both are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in its thread pool,
a thread hop per request on the hottest path (POST /tasks)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

from timewheel.errors import StoreUnavailable, WheelMismatch
from timewheel.scopes import Scope
from timewheel.service import Wheel


async def get_wheel(request: Request) -> Wheel:
    wheel: Wheel = request.state.wheel
    if not wheel.store.ready:
        # Redis was down at start-up: learn the wheel's bucket count before any read or write,
        # or a task would be stored under a bucket the other processes never look in.
        try:
            await wheel.store.init()
        except WheelMismatch as exc:
            raise StoreUnavailable(str(exc)) from exc
    return wheel


WheelDep = Annotated[Wheel, Depends(get_wheel)]


_GRANTED = "timewheel.granted"  # request scope key: the token's scope, once checked


async def granted_scope(request: Request) -> Scope:
    """The scope of the request's bearer token (``admin`` when no tokens are configured: every
    caller may do everything, as in v1 and v2); 401 without a configured token.

    Every configured token is compared, each in constant time, and the match is folded in
    without a branch, so neither the position of a match, its scope nor the length of a common
    prefix shows in the response time. The token is never echoed or logged. Checked once per
    request (the route class checks before the body is read, the dependency again after)."""
    known: Scope | None = request.scope.get(_GRANTED)
    if known is not None:
        return known
    wheel: Wheel = request.state.wheel
    tokens = wheel.settings.api_tokens
    if not tokens:
        request.scope[_GRANTED] = Scope.ADMIN
        return Scope.ADMIN
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    presented = given.strip().encode()
    rank = 0
    for token in tokens:
        rank = max(rank, token.scope.rank * hmac.compare_digest(presented, token.bearer))
    if scheme.lower() != "bearer" or not presented or not rank:
        raise HTTPException(status_code=401, detail="missing or invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    request.scope[_GRANTED] = scope = Scope.of_rank(rank)
    return scope


class Needs:
    """The dependency that declares a route's scope: ``dependencies=[Needs.WRITE]`` (docs/api.md
    v3, "Scoped tokens"). 401 without a right token, 403 naming the scope needed when the
    token's scope is too small."""

    READ: Any
    WRITE: Any
    ADMIN: Any

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    async def __call__(self, request: Request) -> None:
        granted = await granted_scope(request)
        if not granted.covers(self.scope):
            needed = self.scope.value
            raise HTTPException(
                status_code=403,
                detail=(f"this token has scope {granted.value}; {request.method} "
                        f"{request.url.path} needs {needed}"),
                # RFC 6750, section 3.1: the scope the request needs
                headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", '
                                             f'scope="{needed}"'})


Needs.READ = Depends(Needs(Scope.READ))
Needs.WRITE = Depends(Needs(Scope.WRITE))
Needs.ADMIN = Depends(Needs(Scope.ADMIN))


def needed_scope(dependencies: Sequence[Any]) -> Needs | None:
    """The ``Needs`` among a route's dependencies (the highest, should a router add one to a
    route's own: FastAPI runs both), or None when it declares none."""
    found = [d.dependency for d in dependencies if isinstance(d.dependency, Needs)]
    return max(found, key=lambda needs: needs.scope.rank, default=None)

"""Dependencies of the routes: the wheel of this app, and bearer-token checks.

Both are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in its thread pool,
a thread hop per request on the hottest path (POST /tasks)."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from timewheel.errors import StoreUnavailable, WheelMismatch
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


async def require_token(request: Request) -> None:
    """With TIMEWHEEL_API_TOKENS set, demand ``Authorization: Bearer <one of them>``.

    Every configured token is compared, each in constant time, so neither the position of a
    match nor the length of a common prefix shows in the response time. The token is never
    echoed or logged."""
    wheel: Wheel = request.state.wheel
    tokens = wheel.settings.api_tokens
    if not tokens:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    presented = given.strip().encode()
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(presented, token.get_secret_value().encode())
    if scheme.lower() != "bearer" or not presented or not matched:
        raise HTTPException(status_code=401, detail="missing or invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})

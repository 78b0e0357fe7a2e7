"""``redis_errors``: Redis failures as ``StoreUnavailable`` (the API's 503), keeping the cause.
Its own module so that every store module can use it without importing the Store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.exceptions import RedisError

from timewheel.errors import StoreUnavailable


@asynccontextmanager
async def redis_errors(what: str) -> AsyncIterator[None]:
    try:
        yield
    except RedisError as exc:
        raise StoreUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc

"""``redis_errors``: Redis failures as ``StoreUnavailable`` (the API's 503), keeping the cause.
Its own module so that every store module can use it without importing the Store."""

from __future__ import annotations

from types import TracebackType

from redis.exceptions import OutOfMemoryError, RedisClusterException, RedisError

from timewheel.errors import RedisFull, StoreUnavailable

# Redis 6.2 wraps an error raised inside a script in a plain ERR, so only the text tells.
OOM_TEXT = "command not allowed when used memory > 'maxmemory'"


class redis_errors:  # lower case: used like the function it replaced
    """``async with redis_errors("what"):`` turns a RedisError into StoreUnavailable("what: ...").

    A class, not an ``@asynccontextmanager``: it wraps every Redis call of the delivery path
    (several per callback), and the generator machinery cost ~1 us a use, a class ~0.3 us."""

    __slots__ = ("_what",)

    def __init__(self, what: str) -> None:
        self._what = what

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        # RedisClusterException is no RedisError: the cluster client's "cannot be connected"
        # (no node reachable) is Redis unavailable all the same.
        if isinstance(exc, RedisError | RedisClusterException):
            full = isinstance(exc, OutOfMemoryError) or OOM_TEXT in str(exc)
            raise (RedisFull if full else StoreUnavailable)(
                f"{self._what}: {type(exc).__name__}: {exc}") from exc

"""The Python client of timewheel: ``Client`` (blocking) and ``AsyncClient`` (asyncio), typed
with the same models as the service (``timewheel.models``). See docs/client.md.

    from timewheel.client import Client
    from timewheel.models import TaskCreate

    with Client("http://127.0.0.1:8080", token="...") as tw:
        task = tw.create_task(TaskCreate(callback_url="https://example.com/hook", delay=60))

This package talks HTTP only: it never imports the engine, the store or the API.
"""

from timewheel.client.async_client import AsyncClient
from timewheel.client.errors import (
    APIError,
    ClientError,
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    UnauthorizedError,
    UnavailableError,
    UnexpectedAnswerError,
    UnreachableError,
)
from timewheel.client.sync import Client

__all__ = ["APIError", "AsyncClient", "Client", "ClientError", "ConflictError",
           "ForbiddenError", "InvalidRequestError", "NotFoundError", "PayloadTooLargeError",
           "UnauthorizedError", "UnavailableError", "UnexpectedAnswerError", "UnreachableError"]

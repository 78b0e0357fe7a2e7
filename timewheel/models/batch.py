"""Models of ``POST /tasks/batch`` (docs/api.md, "POST /tasks/batch").

Each item is validated on its own, so that one bad item does not fail the whole request: the
request model accepts any JSON value as an item and the handler validates each into
``TaskCreate``. A non-object item is that item's 422 (pydantic's ``model_type`` error), like any
other invalid item. What the request model itself refuses (422 for the whole request): ``tasks``
missing, not a list, empty, or longer than ``MAX_BATCH_ITEMS``, and unknown top-level fields.

The OpenAPI document still shows the items as ``TaskCreate``: ``TaskItem`` validates as "any"
but describes itself with TaskCreate's schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from timewheel.models.tasks import TaskCreate, TaskView

MAX_BATCH_ITEMS = 1000


class TaskItem:
    """One item of a batch: any JSON value when the request is parsed (the handler validates it
    into ``TaskCreate`` on its own), documented as ``TaskCreate``."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.any_schema()

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        # The generator's generate_inner registers TaskCreate as a definition (a component in
        # /openapi.json, shared with POST /tasks) and answers with a $ref to it; handler(...)
        # alone would inline the whole schema.
        generator = getattr(handler, "generate_json_schema", None)
        if isinstance(generator, GenerateJsonSchema):
            return generator.generate_inner(TaskCreate.__pydantic_core_schema__)
        return handler(TaskCreate.__pydantic_core_schema__)  # pragma: no cover - older pydantic


class BatchCreate(BaseModel):
    """Body of ``POST /tasks/batch``: 1 to 1000 ``POST /tasks`` bodies."""

    model_config = ConfigDict(extra="forbid")

    tasks: Annotated[list[Annotated[Any, TaskItem]],
                     Field(min_length=1, max_length=MAX_BATCH_ITEMS)]


class BatchItemResult(BaseModel):
    """The outcome of one item, at the item's position in the request.

    - 201: created; ``task`` is the new task.
    - 200: an identical task with this key exists (a repeated request); ``task`` is it.
    - 409: the key exists with other content; ``task`` is the existing task, ``detail`` says so.
    - 422: the item is invalid and nothing was stored for it; ``detail`` is FastAPI's error list
      (``loc`` starts with ``["body", "tasks", <index>]``); ``key`` is null unless the item held
      a valid key.
    """

    key: str | None
    status: Literal[201, 200, 409, 422]
    task: TaskView | None = None
    detail: str | list[dict[str, Any]] | None = None


class BatchResult(BaseModel):
    """Response of ``POST /tasks/batch``: one result per item, in request order."""

    results: list[BatchItemResult]

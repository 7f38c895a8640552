"""The stream events of a streamed response (`/v1/responses` with `stream`), as the
official SDK's `Response*Event` types read them; `sequence_number` orders them
(`gateway.openai.responses.events` numbers them).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from schemas.responses import OutputItem, OutputText, ResponseObject


class ResponseEvent(BaseModel):
    """One event of a streamed response; `sequence_number` orders them and is what
    `starting_after` counts (`gateway.openai.responses.events`)."""

    type: str
    sequence_number: int


class ResponseLifecycleEvent(ResponseEvent):
    """`response.created`, `.in_progress`, `.completed`, `.failed`, `.incomplete`."""

    response: ResponseObject


class OutputItemEvent(ResponseEvent):
    """`response.output_item.added` and `.done`."""

    output_index: int = 0
    item: OutputItem


class _ItemEvent(ResponseEvent):
    """An event of the output item `item_id`, the `output_index`th of the response."""

    item_id: str
    output_index: int = 0


class ContentPartEvent(_ItemEvent):
    """`response.content_part.added` and `.done`."""

    content_index: int = 0
    part: OutputText


class _TextEvent(_ItemEvent):
    content_index: int = 0
    logprobs: list[dict[str, object]] = Field(default_factory=list)


class TextDeltaEvent(_TextEvent):
    type: str = "response.output_text.delta"
    delta: str


class TextDoneEvent(_TextEvent):
    type: str = "response.output_text.done"
    text: str


class ResponseErrorEvent(ResponseEvent):
    """`error`: the stream stopped before the response's end."""

    type: str = "error"
    code: str
    message: str
    param: str | None = None


class FunctionCallArgumentsDeltaEvent(_ItemEvent):
    type: str = "response.function_call_arguments.delta"
    delta: str


class FunctionCallArgumentsDoneEvent(_ItemEvent):
    type: str = "response.function_call_arguments.done"
    name: str
    arguments: str

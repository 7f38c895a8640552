"""What a client learns when its generation fails in a worker.

An engine's exception text names files, arguments, internal state and sometimes other
requests; a client gets a stable code and a fixed message instead, and the exception
goes to the worker's log with its traceback. The same holds for an output the bus
refused (`RecordRejected`): the client learns that the pipeline could not carry it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bus.produce_failures import PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE, RecordRejected
from workers.core import JsonOutputInterrupted, ToolCallInterrupted

ENGINE_ERROR = "engine_error"
ENGINE_ERROR_MESSAGE = "the engine failed on this request"
JSON_OUTPUT_INTERRUPTED = "output_interrupted"
JSON_OUTPUT_INTERRUPTED_MESSAGE = (
    "the worker writing the JSON answer stopped before its end; send the request again"
)
TOOL_CALL_INTERRUPTED = "tool_call_interrupted"
TOOL_CALL_INTERRUPTED_MESSAGE = (
    "the worker writing the tool call stopped before its end; send the request again"
)


@dataclass(frozen=True, slots=True)
class ClientError:
    """The `GenerationError` fields a failed generation ends with."""

    code: str
    message: str


def client_error(exc: BaseException) -> ClientError:
    """The code and message for a generation that raised `exc`: never its text."""
    if isinstance(exc, RecordRejected):
        return ClientError(PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE)
    if isinstance(exc, JsonOutputInterrupted):
        return ClientError(JSON_OUTPUT_INTERRUPTED, JSON_OUTPUT_INTERRUPTED_MESSAGE)
    if isinstance(exc, ToolCallInterrupted):
        return ClientError(TOOL_CALL_INTERRUPTED, TOOL_CALL_INTERRUPTED_MESSAGE)
    return ClientError(ENGINE_ERROR, ENGINE_ERROR_MESSAGE)

"""A completion's answer when its request offers tools, as OpenAI sends it (pure).

The worker reads the calls from the whole answer and ends the stream with them
(`DeliveryDone.tool_calls`). Streamed, text that may be a call is never sent as
content: a named tool choice streams its arguments as they come (all its text is
arguments), while `auto` and `required` hold the text back until the end, then send
either the calls or the text. As OpenAI does, an answer that called tools ends with
`finish_reason: tool_calls`, except a named tool choice's, which ends with `stop`.
"""

from __future__ import annotations

from schemas.api import AssistantMessage, ChunkDelta, ChunkFunction, ChunkToolCall
from schemas.events import DeliveryDone
from schemas.tools import ToolCalls, ToolUse, call_id


def finish_reason(tool_use: ToolUse | None, end: DeliveryDone, retracted: bool) -> str:
    if retracted:
        return "content_filter"
    if end.tool_calls is not None and tool_use is not None and tool_use.choice != "function":
        return "tool_calls"
    reason = end.status.openai_finish_reason
    assert reason is not None, "a done event's status is terminal"
    return reason


def message(text: str, end: DeliveryDone, retracted: bool) -> AssistantMessage:
    """The whole answer: its calls (and any text beside them), else its text."""
    calls = end.tool_calls
    if calls is None or retracted:
        return AssistantMessage(content=text)
    return AssistantMessage(content=calls.content, tool_calls=list(calls.calls))


class StreamedAnswer:
    """What a streamed completion sends of each delta, and at the end."""

    def __init__(self, tool_use: ToolUse | None, request_id: str) -> None:
        self.tool_use = tool_use
        self.request_id = request_id
        self.holding = tool_use is not None and tool_use.choice != "function"
        self._held: list[str] = []
        self._named_started = False

    def delta(self, text: str) -> list[ChunkDelta] | None:
        """The chunks for `text`: None when it is content to send as it is (the hot
        path), none while it is held back."""
        if self.holding:
            self._held.append(text)
            return []
        if self.tool_use is None:
            return None
        function = ChunkFunction(arguments=text)
        call = ChunkToolCall(index=0, function=function)
        if not self._named_started:
            self._named_started = True
            call.id, call.type = call_id(self.request_id, 0), "function"
            function.name = self.tool_use.function
        return [ChunkDelta(tool_calls=[call])]

    def end(self, end: DeliveryDone, retracted: bool) -> list[ChunkDelta]:
        """What was held back: the calls, else the text (nothing after a retraction)."""
        if not self.holding or retracted:
            return []
        if end.tool_calls is None:
            text = "".join(self._held)
            return [ChunkDelta(content=text)] if text else []
        return call_chunks(end.tool_calls)


def call_chunks(calls: ToolCalls) -> list[ChunkDelta]:
    """Every call whole, one chunk each (after the text beside them, if any)."""
    chunks = [ChunkDelta(content=calls.content)] if calls.content else []
    for index, call in enumerate(calls.calls):
        chunks.append(
            ChunkDelta(
                tool_calls=[
                    ChunkToolCall(
                        index=index,
                        id=call.id,
                        type="function",
                        function=ChunkFunction(
                            name=call.function.name, arguments=call.function.arguments
                        ),
                    )
                ]
            )
        )
    return chunks

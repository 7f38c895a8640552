"""The tools stage's decisions, pure: what a round's results are on the
stream, and the next round of the turn.

A server-tools round that called tools ends on its worker (`ToolCallsMade` on
`chat.tokens`, a `ToolRound` on `chat.tools`). The stage runs each call
(`servertools.toolbox`), writes a `ToolResult` per call at the positions after the
calls, then queues the next round: the same turn, the calls and results appended to
its messages, as a new request (`round_request_id`) through the scheduler, which
places it on the conversation's previous worker while it has room (prefix cache).
After `max_rounds` rounds the model is shown no tools: it answers in text. A round
whose results or next round cannot be built or sent ends the answer instead
(`round_failed`): an error at the position after its results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from schemas.events import (
    ChatMessage,
    GenerationError,
    GenerationRequest,
    Role,
    ToolResult,
    ToolRound,
    calls_span,
    now,
    stream_fields,
)
from schemas.tools import round_request_id


@dataclass(frozen=True, slots=True)
class Caller:
    """Whose turn a call runs for: a tool reaches only this owner's data."""

    org_id: str
    user_id: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one call gave: its result as JSON text, or an error result."""

    content: str
    error: bool = False


ERROR_CHARS = 1000
"""The most of an error's message the model is given."""


def error_outcome(message: str) -> Outcome:
    """The result a failed call gives the model: `{"error": message}` (its first
    `ERROR_CHARS` characters)."""
    return Outcome(orjson.dumps({"error": message[:ERROR_CHARS]}).decode(), error=True)


def caller_of(tool_round: ToolRound) -> Caller:
    return Caller(tool_round.request.org_id, tool_round.request.user_id)


def results(tool_round: ToolRound, outcomes: Sequence[Outcome]) -> list[ToolResult]:
    """The round's results on the stream, one per call in order, at the positions after
    the calls' own."""
    first = tool_round.seq + calls_span(len(tool_round.calls.calls))
    return [
        ToolResult(
            **stream_fields(tool_round.request, first + index),
            call_id=call.id,
            name=call.function.name,
            content=outcome.content,
            error=outcome.error,
        )
        for index, (call, outcome) in enumerate(zip(tool_round.calls.calls, outcomes, strict=True))
    ]


def round_failed(tool_round: ToolRound, code: str, message: str) -> GenerationError:
    """The answer's end when its round could not be handed on: an error of the round's
    attempt at the position after its results (the next round's first), so it follows
    whatever of the round is on the stream already."""
    calls = len(tool_round.calls.calls)
    first = tool_round.seq + calls_span(calls) + calls
    return GenerationError(**stream_fields(tool_round.request, first), code=code, message=message)


def next_round(tool_round: ToolRound, answered: Sequence[ToolResult]) -> GenerationRequest:
    """The turn's next round: the calls and their results appended to the messages, at
    the position after the results, as the next attempt of the answer (its events
    outrank the paused round's). The model may call tools again while rounds are left;
    a forced choice holds only the first round."""
    request = tool_round.request
    turn = request.server_tools
    if turn is None:
        raise ValueError(f"{request.request_id} is not a server-tools turn")
    following = turn.round + 1
    calls = tool_round.calls
    messages = (
        *request.messages,
        ChatMessage(role=Role.ASSISTANT, content=calls.content or "", tool_calls=calls.calls),
        *(ChatMessage(role=Role.TOOL, content=r.content, tool_call_id=r.call_id) for r in answered),
    )
    tool_use = None
    if request.tool_use is not None and following < turn.max_rounds:
        tool_use = request.tool_use.model_copy(update={"choice": "auto", "function": None})
    first_seq = (answered[-1].seq if answered else tool_round.seq + len(calls.calls)) + 1
    return request.model_copy(
        update={
            "request_id": round_request_id(turn.answer_id, following),
            "attempt": request.attempt + 1,
            "messages": messages,
            "tool_use": tool_use,
            "stream": None,
            "server_tools": turn.model_copy(update={"round": following, "first_seq": first_seq}),
            "created_at": now(),
        }
    )

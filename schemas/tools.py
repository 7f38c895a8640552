"""Tool calling, as OpenAI's function tools have it: what a request offers the model
(`ToolSpec`), how the model may use them (`ToolUse`), and what it called (`ToolCall`).

The same shapes travel everywhere: in the OpenAI-compatible API, in the
`GenerationRequest` on the bus, into the chat template (`tools=`), and back on the done
events. How a tool choice becomes a constraint on the output, and the output tool calls
again, is `workers.tool_calls`.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from schemas.events import GenerationRequest

FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
"""What OpenAI accepts as a function's name."""


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        None, description="a JSON Schema of the arguments object; unset: any object"
    )
    strict: bool | None = None


class ToolSpec(BaseModel):
    """One tool a request offers the model: a function."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["function"] = "function"
    function: FunctionSpec


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    arguments: str = Field(description="the arguments object as JSON text")


class ToolCall(BaseModel):
    """A call the model made (or, in a request's history, made before)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolUse(BaseModel):
    """The tools a request offers and how the model may use them.

    `auto`: the model decides, its tool parser finds the calls in its text; `required`:
    the output is held (vLLM structured outputs) to a list of calls of these tools,
    at most one unless `parallel`; `function`: the output is held to the arguments of
    the function named `function`. A request whose tool choice is `none` carries no
    `ToolUse`: the model sees no tools."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    tools: tuple[ToolSpec, ...] = Field(min_length=1)
    choice: Literal["auto", "required", "function"] = "auto"
    function: str | None = Field(None, description="the function named by the tool choice")
    parallel: bool = Field(True, description="the model may call several tools at once")

    @property
    def constrained(self) -> bool:
        """The output is held to a JSON schema (required or named tool choice)."""
        return self.choice != "auto"

    def spec(self, name: str) -> FunctionSpec | None:
        return next((t.function for t in self.tools if t.function.name == name), None)


class ToolCalls(BaseModel):
    """An answer that called tools, as its done event carries it: the calls, and the
    text around them that is not a call (`content`, none for a constrained answer)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    calls: tuple[ToolCall, ...] = Field(min_length=1)
    content: str | None = None


def call_id(request_id: str, index: int) -> str:
    """The id of an answer's `index`th call, as OpenAI spells ids (`call_...`): a function
    of the request and the call's place, so the gateway streaming a named call and the
    worker ending the answer (any attempt) name it the same."""
    digest = hashlib.blake2b(f"{request_id}\n{index}".encode(), digest_size=12).hexdigest()
    return f"call_{digest}"


# --- server-side tools: chatpipe runs the calls itself (`chat.tools`) ------------------


class ServerToolTurn(BaseModel):
    """A native turn whose tool calls chatpipe runs itself (server-side tools).

    Each round is its own `GenerationRequest` (its own request id, so the scheduler
    places it as any request); every round's stream events carry the first round's id,
    `answer_id`, so the safety stage, the gateway, `chat.answers` and the recorder see
    one answer: text, tool calls, tool results, more text, its end."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    answer_id: str = Field(
        description="the request id of the client's stream: every round's events carry it"
    )
    round: int = Field(0, ge=0, description="tool rounds before this one")
    max_rounds: int = Field(
        ge=0, description="after this many rounds the model is shown no tools and answers in text"
    )
    first_seq: int = Field(0, ge=0, description="where this round's events start in the answer")

    @property
    def tools_left(self) -> bool:
        """This round may still call tools."""
        return self.round < self.max_rounds


def round_request_id(answer_id: str, round_: int) -> str:
    """The request id of a turn's `round_`th tool round: a function of the turn, so a
    round published twice (a redelivered `chat.tools` record) is one request."""
    return answer_id if round_ == 0 else f"{answer_id}.tool{round_}"


class RoundsHeld:
    """What a cancel names among a stage's requests. A cancel names the answer
    (`GenerationRequest.answer_id`, the first round's id); a server-tools turn's later
    round has an id of its own (`round_request_id`), so a stage holding one keeps it here.
    An answer has one round at a time: the next is queued once this one paused."""

    def __init__(self) -> None:
        self._by_answer: dict[str, str] = {}

    def hold(self, request: GenerationRequest) -> None:
        if request.request_id != request.answer_id:
            self._by_answer[request.answer_id] = request.request_id

    def release(self, request: GenerationRequest) -> None:
        if self._by_answer.get(request.answer_id) == request.request_id:
            del self._by_answer[request.answer_id]

    def named(self, answer_id: str) -> str:
        """The request a cancel of `answer_id` names here: its round held, else itself."""
        return self._by_answer.get(answer_id, answer_id)


class ToolStep(BaseModel):
    """A server tool's call or its result, as a stored answer keeps it (in stream order)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["tool_call", "tool_result"]
    id: str = Field(description="the call's id (a result names the call it answers)")
    name: str
    arguments: str | None = Field(None, description="a call's arguments, JSON text")
    content: str | None = Field(None, description="a result, JSON text")
    error: bool = False

"""OpenAI Responses API models (`/v1/responses`), as the official SDK sends and reads them.

A request's fields are either honoured or refused: `ResponseRequest` declares the ones
chatpipe honours; any other field the client sets is a 400 naming it
(`refused_fields`), `unsupported_parameter` for one of OpenAI's that chatpipe does not
do, `unknown_parameter` for one OpenAI does not know either. A field set to nothing
(null, `[]`, `{}`) or to what chatpipe does anyway (`NEUTRAL`) is no request at all.

The response holds the fields the SDK's `Response` type requires (its stream events
are `schemas.response_events`): an assistant message with one `output_text` part, or
the function calls the model made (`FunctionCallItem`, after the message of any text
beside them).
"""

from __future__ import annotations

import builtins
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from schemas.api import MaxTokens, Temperature, Text, TopP
from schemas.events import DeliveryError, Usage
from schemas.lifecycle import RequestStatus
from schemas.tools import FUNCTION_NAME, FunctionSpec

RESPONSE_ID_PREFIX = "resp_"

# --- requests -------------------------------------------------------------------------


class InputTextPart(BaseModel):
    """A text part of an input message; `output_text` is how an earlier answer's own
    output comes back as input."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text"]
    text: Text


class RefusalPart(BaseModel):
    """An earlier answer's refusal, sent back as input: its text is the message's."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["refusal"]
    refusal: Text

    @property
    def text(self) -> str:
        return self.refusal


class UnreadPart(BaseModel):
    """A part chatpipe's models cannot read (`input_image`, `input_file`, `input_audio`,
    …): refused by its place in `input` (`unread_parts`)."""

    model_config = ConfigDict(extra="allow")

    type: str

    @property
    def text(self) -> str:
        return ""


def _part_type(part: object) -> str:
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return {"input_text": "text", "output_text": "text", "refusal": "refusal"}.get(
        str(kind), "unread"
    )


ContentPart = Annotated[
    Annotated[InputTextPart, Tag("text")]
    | Annotated[RefusalPart, Tag("refusal")]
    | Annotated[UnreadPart, Tag("unread")],
    Discriminator(_part_type),
]

InputContent = Text | list[ContentPart]


def content_text(content: InputContent) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class InputItem(BaseModel):
    """One message of `input`. `system` and `developer` messages are instructions for this
    answer; `user` and `assistant` messages are the conversation."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: InputContent

    @property
    def text(self) -> str:
        return content_text(self.content)

    @property
    def instructs(self) -> bool:
        return self.role in ("system", "developer")


class FunctionCallItem(BaseModel):
    """A function call the model made: an output item, and as input (`function_call`)
    the call an earlier answer made, sent back beside its result."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    id: str | None = None
    call_id: Text
    name: str = Field(pattern=FUNCTION_NAME)
    arguments: str = Field(description="the arguments object as JSON text")
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutput(BaseModel):
    """`function_call_output`: the result of the call `call_id`, as the tool's text."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: Text
    output: InputContent

    @property
    def text(self) -> str:
        return content_text(self.output)


class UnreadItem(BaseModel):
    """An input item of a type chatpipe does not take (`reasoning`, `item_reference`, a
    hosted tool's call, …): refused by its place in `input` (`unread_parts`)."""

    model_config = ConfigDict(extra="allow")

    type: str


_ITEM_TYPES = frozenset({"message", "function_call", "function_call_output"})


def _item_type(item: object) -> str:
    """An input item's type; a message may leave it out (`EasyInputMessage`)."""
    value = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "")
    return value if isinstance(value, str) and value in _ITEM_TYPES else "unread"


InputEntry = Annotated[
    Annotated[InputItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[UnreadItem, Tag("unread")],
    Discriminator(_item_type),
]
"""One item of `input`: a message, a function call or its result (any other is refused)."""


def unread_parts(entries: str | list[Any]) -> list[tuple[str, str, bool]]:
    """(`param`, type, whether it is a content part) of every input item, and content
    part, chatpipe cannot read."""
    found: list[tuple[str, str, bool]] = []
    for index, item in enumerate(entries if isinstance(entries, list) else ()):
        if isinstance(item, UnreadItem):
            found.append((f"input.{index}.type", item.type, False))
            continue
        field = "content" if isinstance(item, InputItem) else "output"
        parts = getattr(item, field, None)
        for number, part in enumerate(parts if isinstance(parts, list) else ()):
            if isinstance(part, UnreadPart):
                found.append((f"input.{index}.{field}.{number}.type", part.type, True))
    return found


class FunctionTool(FunctionSpec):
    """A function the model may call (`tools`), in the Responses API's flat shape: the
    chat route's function, typed."""

    type: Literal["function"]


class HostedTool(BaseModel):
    """A tool OpenAI runs itself (`web_search`, `file_search`, …): refused by name."""

    model_config = ConfigDict(extra="allow")

    type: str


def _tool_type(tool: object) -> str:
    kind = tool.get("type") if isinstance(tool, dict) else getattr(tool, "type", None)
    return "function" if kind == "function" else "hosted"


ResponseTool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_type),
]


class ToolChoiceNamed(BaseModel):
    """`tool_choice` naming the function the model must call; any other `type` (a
    hosted tool, `allowed_tools`) is refused by name."""

    model_config = ConfigDict(extra="ignore")

    type: str
    name: str | None = Field(None, pattern=FUNCTION_NAME)


class TextFormatJsonSchema(BaseModel):
    """`text.format` holding the answer to a JSON Schema (the engine's structured output)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["json_schema"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Text | None = None
    json_schema: dict[str, Any] | None = Field(
        None, alias="schema", description="unset: any JSON object"
    )
    strict: bool | None = None


class TextFormatPlain(BaseModel):
    type: Literal["text", "json_object"]


class TextRequest(BaseModel):
    """`text`: how the answer is written. Any field other than `format` is refused."""

    model_config = ConfigDict(extra="allow")

    format: (
        Annotated[TextFormatPlain | TextFormatJsonSchema, Field(discriminator="type")] | None
    ) = None

    @property
    def asks_json(self) -> bool:
        return self.format is not None and self.format.type != "text"


class ResponseRequest(BaseModel):
    """`POST /v1/responses`. Fields not declared here are kept (`model_extra`) to be
    refused by name."""

    model_config = ConfigDict(extra="allow")

    input: Text | list[InputEntry] = Field(
        description="the user's text, or messages (a stored response's ends with a user "
        "message), function calls and their outputs"
    )
    instructions: Text | None = Field(
        None,
        description="a system message for this answer only (not carried over by "
        "previous_response_id)",
    )
    model: Text | None = Field(None, description="one of GET /v1/models; unset: the default")
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool = False
    previous_response_id: Text | None = Field(
        None,
        description="a stored response of the caller's: the answer continues its "
        "conversation from it",
    )
    store: bool = Field(True, description="false: the response is not stored, nor retrievable")
    background: bool = Field(
        False, description="answer at once; the generation goes on (needs store)"
    )
    tools: list[ResponseTool] | None = Field(
        None, description="functions the model may call; at most CHATPIPE_MAX_TOOLS"
    )
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceNamed | None = Field(
        None, description="unset: auto with tools, none without"
    )
    parallel_tool_calls: bool | None = Field(
        None, description="the model may call several tools in one answer (default true)"
    )
    text: TextRequest | None = Field(None, description="`format`: text, json_object or json_schema")

    @property
    def items(self) -> list[InputItem | FunctionCallItem | FunctionCallOutput]:
        if isinstance(self.input, str):
            return [InputItem(role="user", content=self.input)]
        return [item for item in self.input if not isinstance(item, UnreadItem)]

    @property
    def all_instructions(self) -> str | None:
        """`instructions`, then every system or developer message of `input`."""
        texts = [self.instructions or "", *(i.text for i in self.messages if i.instructs)]
        joined = "\n\n".join(t for t in texts if t)
        return joined or None

    @property
    def messages(self) -> list[InputItem]:
        return [item for item in self.items if isinstance(item, InputItem)]

    @property
    def conversation_items(self) -> list[InputItem | FunctionCallItem | FunctionCallOutput]:
        return [item for item in self.items if not isinstance(item, InputItem) or
                not item.instructs]  # fmt: skip

    @property
    def runs_as_completion(self) -> bool:
        """It offers tools, carries function calls or their results, or asks for JSON:
        it runs as a chat completion and is not stored."""
        return (
            bool(self.tools)
            or self.tool_choice not in (None, "none", "auto")
            or len(self.messages) < len(self.items)
            or (self.text is not None and self.text.asks_json)
        )


OPENAI_FIELDS = frozenset(
    {
        "conversation",
        "include",
        "max_tool_calls",
        "metadata",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "stream_options",
        "top_logprobs",
        "truncation",
        "user",
    }
)
"""Fields of OpenAI's request that chatpipe does not honour (set, they are refused)."""

INSTEAD: dict[str, str] = {
    "conversation": "previous_response_id continues a stored response's conversation",
    "include": "a response holds all it has; GET /v1/responses/{id} reads it again",
    "max_tool_calls": "tool_choice none answers without calls",
    "prompt": "send the prompt as instructions and input",
    "reasoning": "the models served here do not reason apart from their answer",
    "safety_identifier": "the API key names its user",
    "service_tier": "the API key's tier sets the service",
    "stream_options": "usage comes with response.completed",
    "top_logprobs": "POST /v1/chat/completions answers with logprobs",
    "user": "the API key names its user",
}
"""What to do instead of a refused field, said with the refusal."""

NEUTRAL: dict[str, tuple[object, ...]] = {"truncation": ("auto",)}
"""Values that ask for what chatpipe does anyway: old turns dropped or summarised when
the window is full (`auto`)."""


def refused_fields(request: ResponseRequest) -> list[tuple[str, str]]:
    """(field, code) of every field set that chatpipe does not honour."""
    refused = []
    for name, value in (request.model_extra or {}).items():
        if value in (None, [], {}) or value in NEUTRAL.get(name, ()):
            continue
        refused.append(
            (name, "unsupported_parameter" if name in OPENAI_FIELDS else "unknown_parameter")
        )
    for name, value in (request.text.model_extra or {}).items() if request.text else ():
        if value not in (None, [], {}):
            refused.append((f"text.{name}", "unsupported_parameter"))
    return refused


def response_id(message_id: str) -> str:
    return RESPONSE_ID_PREFIX + message_id


def message_id_of(response_id: str) -> str | None:
    """The assistant message a response id names; None for an id that names none."""
    if not response_id.startswith(RESPONSE_ID_PREFIX):
        return None
    return response_id.removeprefix(RESPONSE_ID_PREFIX) or None


# --- responses ------------------------------------------------------------------------

ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
IncompleteReason = Literal["max_output_tokens", "content_filter"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[dict[str, object]] = Field(default_factory=list)
    logprobs: list[dict[str, object]] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    content: list[OutputText] = Field(default_factory=list)


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> ResponseUsage:
        return cls(input_tokens=usage.prompt_tokens,
                   input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
                   output_tokens=usage.completion_tokens,
                   total_tokens=usage.prompt_tokens + usage.completion_tokens)  # fmt: skip


class ResponseError(BaseModel):
    code: str = Field(
        description="`rate_limit_exceeded` when retrying later may help, "
        "else `server_error`; the message starts with chatpipe's own code"
    )
    message: str

    @classmethod
    def of(cls, error: DeliveryError) -> ResponseError:
        code = "rate_limit_exceeded" if error.retry_after is not None else "server_error"
        return cls(code=code, message=f"{error.code}: {error.message}")


class IncompleteDetails(BaseModel):
    reason: IncompleteReason


class ConversationRef(BaseModel):
    id: str = Field(description="the chatpipe conversation (GET /v1/conversations/{id})")


def _plain_text() -> dict[str, object]:
    return {"format": {"type": "text"}}


OutputItem = Annotated[OutputMessage | FunctionCallItem, Field(discriminator="type")]


class ResponseObject(BaseModel):
    """A response as `GET /v1/responses/{id}` and the stream's lifecycle events give it."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: ResponseStatus
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    conversation: ConversationRef | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    usage: ResponseUsage | None = None
    parallel_tool_calls: bool = True
    tool_choice: str | dict[str, builtins.object] = "auto"  # `object`: a field
    tools: list[dict[str, builtins.object]] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)
    text: dict[str, builtins.object] = Field(default_factory=_plain_text)
    truncation: Literal["auto"] = "auto"

    @property
    def output_text(self) -> str:
        return "".join(
            part.text
            for item in self.output
            if isinstance(item, OutputMessage)
            for part in item.content
        )


_STATUS: dict[RequestStatus, tuple[ResponseStatus, IncompleteReason | None]] = {
    RequestStatus.FINISHED_STOPPED: ("completed", None),
    RequestStatus.FINISHED_LENGTH: ("incomplete", "max_output_tokens"),
    RequestStatus.FINISHED_FILTERED: ("incomplete", "content_filter"),
    RequestStatus.FINISHED_ABORTED: ("cancelled", None),
    RequestStatus.FINISHED_ERROR: ("failed", None),
}


def response_status(status: RequestStatus) -> tuple[ResponseStatus, IncompleteReason | None]:
    """A response's status (and why it is incomplete) for its answer's request status;
    anything not finished is `in_progress`."""
    return _STATUS.get(status, ("in_progress", None))


class ResponseDeleted(BaseModel):
    """`DELETE /v1/responses/{id}`: the response is gone."""

    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class ListedInputText(BaseModel):
    type: Literal["input_text"] = "input_text"
    text: str


class ListedInputMessage(BaseModel):
    """A user message a response was asked with, as `input_items` lists it."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["user"] = "user"
    status: Literal["completed"] = "completed"
    content: list[ListedInputText]


ListedItem = Annotated[ListedInputMessage | OutputMessage, Field(discriminator="role")]


class ResponseItemList(BaseModel):
    """`GET /v1/responses/{id}/input_items`: one page of the input a response was asked
    with."""

    object: Literal["list"] = "list"
    data: list[ListedItem]
    first_id: str | None
    last_id: str | None
    has_more: bool

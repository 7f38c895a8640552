"""HTTP API models (DESIGN §4), kept apart from the Kafka events (STYLE 3).

Native API: conversations and their messages. OpenAI-compatible API: the
subset of `/v1/chat/completions` and `/v1/models` that the official SDKs send
and read; unknown request fields are ignored, as OpenAI-compatible servers do.
Every error, on either API, is one `ErrorBody`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticCustomError

from schemas.files import MAX_FILES_PER_TURN, Citation
from schemas.events import CacheOutcome, Rating, Role, Usage
from schemas.lifecycle import RequestStatus
from schemas.tools import FUNCTION_NAME, ToolCall, ToolSpec

# --- request text and bounds ----------------------------------------------------------


def _encodable(text: str) -> str:
    """JSON may carry lone surrogates (`"\\ud800"`) that no store or bus can encode:
    refused here, a 422 before anything is stored, charged or queued."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode: lone surrogates cannot be stored") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]
"""Any string a request carries."""

SEED_LIMIT = 1 << 64
"""A seed is an unsigned 64-bit integer, as the engines take it."""

StopText = Annotated[Text, Field(min_length=1)]
"""A stop sequence: an empty one would match everywhere (vLLM refuses it)."""
Seed = Annotated[int, Field(ge=0, lt=SEED_LIMIT, description="0 <= seed < 2**64")]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
MaxTokens = Annotated[int, Field(ge=1, description="at most CHATPIPE_MAX_TOKENS_LIMIT")]


# --- errors ---------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: str = Field(description="machine-readable, e.g. model_not_found")
    message: str
    type: str = Field(description="OpenAI error class, e.g. invalid_request_error")
    param: str | None = Field(None, description="the request field at fault, if one is")


class ErrorBody(BaseModel):
    """The one error shape of the gateway, compatible with OpenAI's."""

    error: ErrorDetail


# --- native API -----------------------------------------------------------------------


class CreateConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: Text = Field("", max_length=200)


class RenameConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: Text = Field(max_length=200, description="the user's title; empty: the generated one")


class ConversationPublic(BaseModel):
    conversation_id: str
    title: str = Field(description="the user's title, else the generated one")
    created_at: float


class ConversationList(BaseModel):
    """One page of the caller's conversations, newest first."""

    data: list[ConversationPublic]
    next_cursor: str | None = Field(description="`cursor` of the next page; null on the last")


class MessagePublic(BaseModel):
    message_id: str
    seq: int
    role: Role
    content: str
    parent_id: str | None
    model: str | None
    status: RequestStatus
    created_at: float
    alias: str | None = Field(None, description="the model alias asked for; `model`: its version")
    children: list[str] = Field(
        default_factory=list,
        description="messages directly below, oldest first: regenerations and edits are siblings",
    )
    selected_child: str | None = Field(None, description="the child the thread continues with")
    citations: list[Citation] = Field(
        default_factory=list,
        description="an answer's sources: the chunks of the user's files its prompt carried",
    )


class ConversationDetail(ConversationPublic):
    """The conversation as a message tree: every branch, and the selected thread."""

    messages: list[MessagePublic] = Field(description="every message of every branch, seq order")
    roots: list[str] = Field(default_factory=list, description="messages without a parent")
    thread: list[str] = Field(
        default_factory=list, description="the selected branch, root first: what the model sees"
    )


class TurnOptions(BaseModel):
    """Model and sampling of one answer. Fields left out take the deployment's defaults."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = Field(None, description="one of GET /v1/models; unset: the default")
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    ignore_eos: bool = False
    file_ids: list[Annotated[Text, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=MAX_FILES_PER_TURN,
        description="the caller's files (POST /v1/files) to answer from: the chunks most "
        "similar to the message go into the prompt, and the answer cites them")


class PostMessage(TurnOptions):
    """A user turn (also the body of an edit: the new text of the message)."""

    content: Text = Field(description="not blank; at most CHATPIPE_MAX_MESSAGE_CHARS")


class CancelledRequest(BaseModel):
    request_id: str
    status: Literal["cancelling"] = Field(
        "cancelling", description="the stream of the request ends with status finished_aborted"
    )


FEEDBACK_TEXT_CHARS = 2000


class MessageFeedback(BaseModel):
    """A thumbs up or down on an answer, with an optional comment."""

    model_config = ConfigDict(extra="forbid")

    rating: Rating
    text: Text = Field("", max_length=FEEDBACK_TEXT_CHARS)


class FeedbackAccepted(BaseModel):
    message_id: str
    rating: Rating
    status: Literal["recorded"] = "recorded"


# A dataclass, not a model: the stores build it from rows (`message_usage`) as the API
# shows it.
@pydantic_dataclass(frozen=True, slots=True)
class TurnUsage:
    """What one answer cost; `cached_tokens` is the part of the prompt the prefix cache served."""

    message_id: str
    seq: int
    model: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


class ConversationUsage(BaseModel):
    """Per answer (every branch, seq order) and in total: the cost of a growing history."""

    conversation_id: str
    turns: list[TurnUsage]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


# --- OpenAI-compatible API: requests --------------------------------------------------


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: Text


class InputMessage(BaseModel):
    """One message of `messages`; `developer` is OpenAI's newer name for `system`. An
    assistant message may carry the tool calls it made (its content then may be null),
    a `tool` message the result of one of them (`tool_call_id`)."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: Text | None = None

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def texts(self) -> list[str]:
        """The content's text parts (one for plain text); each is bounded on its own."""
        if isinstance(self.content, list):
            return [part.text for part in self.content]
        return [self.content or ""]

    @property
    def chat_role(self) -> Role:
        return Role.SYSTEM if self.role == "developer" else Role(self.role)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(BaseModel):
    """`tool_choice` naming the function the model must call."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: FunctionName


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    messages: list[InputMessage] = Field(
        min_length=1, description="at most CHATPIPE_MAX_MESSAGES")
    model: Text
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = Field(None, description="newer name of max_tokens")
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: StopText | list[StopText] | None = Field(None, description=(
        "at most CHATPIPE_MAX_STOP_SEQUENCES, each at most CHATPIPE_MAX_STOP_CHARS long"))
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    user: Text | None = None
    ignore_eos: bool = Field(False, description="vLLM extension, for benchmarks")
    tools: list[ToolSpec] | None = Field(None, description=(
        "functions the model may call; at most CHATPIPE_MAX_TOOLS"))
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="unset: auto with tools, none without")
    parallel_tool_calls: bool | None = Field(
        None, description="the model may call several tools in one answer (default true)")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_tokens is None else self.max_tokens


# --- OpenAI-compatible API: responses -------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    response_cache: CacheOutcome | None = Field(
        None, description="chatpipe's response cache: hit (replayed from the cache, no GPU "
        "time; the tokens are those of the answer it replays) or miss; null: not looked up")

    @classmethod
    def of(cls, usage: Usage) -> CompletionUsage:
        return cls(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
            response_cache=usage.cache,
        )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage


class ChunkFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ChunkToolCall(BaseModel):
    """Part of a streamed tool call: the first part of call `index` has its id, type and
    name; the arguments' JSON text may come in several parts, to be joined."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChunkFunction


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One streamed chunk; with `include_usage` the last one has no choices and the usage."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "chatpipe"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- OpenAI-compatible API: text completions and embeddings ---------------------------

UNKNOWN_PARAMETER = "unknown_parameter"


class OpenAIRequest(BaseModel):
    """A request body of the OpenAI-compatible API that refuses a field OpenAI's does not
    have, as OpenAI does: a validation error of type `unknown_parameter` naming it, which
    `gateway.errors` answers with a 400 (the native API's unknown fields stay a 422)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = [name for name in data if name not in cls.model_fields]
            if unknown:
                raise PydanticCustomError(UNKNOWN_PARAMETER,
                                          "unrecognized request argument supplied: {field}",
                                          {"field": str(unknown[0])})
        return data


class CompletionRequest(OpenAIRequest):
    """`POST /v1/completions`: text in, text out, the prompt as it is (no chat template).

    Every field of OpenAI's request is declared: what chatpipe cannot honour is refused
    by `gateway.completions` with a 400 naming it when set to anything but its default;
    a field OpenAI does not define is a 400 `unknown_parameter`."""

    model: Text
    prompt: Text | list[Text] | list[int] | list[list[int]] = Field(description=(
        "a string, or a list holding one string; token arrays and several prompts are "
        "refused"))
    max_tokens: MaxTokens = Field(16, description="OpenAI's default, 16")
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: StopText | list[StopText] | None = Field(None, description=(
        "at most CHATPIPE_MAX_STOP_SEQUENCES, each at most CHATPIPE_MAX_STOP_CHARS long"))
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = Field(False, description="the prompt before the completion in `text`")
    user: Text | None = None
    ignore_eos: bool = Field(False, description="vLLM extension, for benchmarks")
    n: int = Field(1, ge=1, description="refused unless 1")
    best_of: int | None = Field(None, ge=1, description="refused unless 1")
    logprobs: int | None = Field(None, ge=0, le=5, description="refused")
    suffix: Text | None = Field(None, description="refused")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="refused unless 0")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="refused unless 0")
    logit_bias: dict[str, float] | None = Field(None, description="refused unless empty")

    # The same fields as a chat completion's, read the same way.
    include_usage = ChatCompletionRequest.include_usage
    stop_sequences = ChatCompletionRequest.stop_sequences


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: None = None


class TextCompletion(BaseModel):
    """A whole text completion, or (`stream`) one chunk of one: the same object."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class EmbeddingRequest(OpenAIRequest):
    """`POST /v1/embeddings`. Token arrays as input are refused (400, `input`): their
    tokens would be another model's."""

    model: Text
    input: Text | list[Text] | list[int] | list[list[int]] = Field(
        description="a string or a list of strings, each not empty; at most "
        "CHATPIPE_MAX_EMBEDDING_INPUTS, each within the model's window")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="refused unless the model's own")
    user: Text | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(
        description="the vector; base64: its little-endian float32 bytes")


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage

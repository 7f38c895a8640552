"""The model, engine and worker settings (composed into `chatpipe.settings.Settings`)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from workers.coalesce import ChunkPacing
from workers.core import WorkerConfig

DEFAULT_MODEL_DIR = Path(os.path.expanduser("~/.cache/chatpipe/smollm2-135m-instruct"))
"""The default model's directory, as `chatpipe make-model` builds it (`make setup` runs it)."""


class EngineSettings(BaseModel):
    """The model served and the engine that runs it."""

    engine: Literal["vllm", "sim"] = Field(
        "vllm", description="vllm (AsyncLLM in the worker) or sim (deterministic text, no model)"
    )
    model: Path = Field(
        DEFAULT_MODEL_DIR,
        description="local HF model directory (default: SmolLM2-135M-Instruct, built by"
        " `chatpipe make-model`)",
    )
    model_name: str = Field(
        "", description="name clients ask for; empty: the model directory's name"
    )
    max_model_len: int | None = Field(
        None,
        description="context length (prompt + answer) conversations are fitted into for a"
        " model not in context_window_tokens; unset: the model's own (its config.json, as"
        " vLLM reads it)",
    )
    vllm_args: dict[str, Any] = Field(
        default_factory=dict,
        description="vllm engine: AsyncEngineArgs fields over vLLM's"
        ' defaults, e.g. {"max_num_seqs": 64} (docs/operating/engine.md)',
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

    @model_validator(mode="after")
    def _name_the_model(self) -> EngineSettings:
        if not self.model_name:
            self.model_name = directory_name(self.model)
        if not self.model_name:
            raise ValueError(f"name the model at {self.model}: set CHATPIPE_MODEL_NAME")
        return self

    def context_length(self) -> int:
        """The context the gateway fits conversations into: `max_model_len`, else the
        engine's, which is `vllm_args`' `max_model_len` or the model's own
        (`model_context_length`)."""
        if self.max_model_len:
            return self.max_model_len
        engine = self.vllm_args.get("max_model_len")
        if isinstance(engine, int) and engine > 0:
            return engine
        return model_context_length(self.model)

    @model_validator(mode="after")
    def _check_engine_slots(self) -> EngineSettings:
        if self.engine == "vllm" and "max_slots" in self.model_fields_set:
            raise ValueError(
                "max_slots is the sim engine's: the vllm engine runs vLLM's"
                """ max_num_seqs, e.g. CHATPIPE_VLLM_ARGS='{"max_num_seqs": 64}'"""
            )
        return self


class WorkerSettings(BaseModel):
    """A worker process: its name, chunk pacing, heartbeats, drain and probe file."""

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

    def config(self, shard: str = "") -> WorkerConfig:
        """The worker stage's configuration, reading the chat.work topic of `shard`."""
        pacing = ChunkPacing(
            self.coalesce_ms / 1000, self.coalesce_max_ms / 1000, self.coalesce_max_chunks_per_s
        )
        return WorkerConfig(
            self.worker_id, pacing, self.heartbeat_interval_s, self.ready_file, shard=shard
        )


def directory_name(model: Path) -> str:
    """The name a model is served under unless named: its directory's."""
    return model.expanduser().resolve().name


CONTEXT_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
"""Where a Hugging Face config states its context length; vLLM reads the same keys, takes
the smallest, and takes `model_max_length` over them where a config has it."""
SCALED_ALREADY = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn",
                            "deepseek_llama_scaling"})  # fmt: skip
"""RoPE types whose stated length is the scaled one already (vLLM applies no factor)."""
FALLBACK_CONTEXT_LENGTH = 2048
"""vLLM's own for a config that states none."""


def model_context_length(model: Path) -> int:
    """The context length of the model in `model` as vLLM derives it: the smallest length
    its `config.json` (or its text model's) states, scaled by its RoPE factor, and at
    most its tokenizer's `model_max_length`; `FALLBACK_CONTEXT_LENGTH` where it states
    none or cannot be read (the start-up check names a missing or damaged file)."""
    config = _json_object(model / "config.json")
    config = config.get("text_config") or config
    found = [config[key] for key in CONTEXT_LENGTH_KEYS if isinstance(config.get(key), int)]
    if isinstance(config.get("model_max_length"), int):
        found = [config["model_max_length"]]
    if not found:
        return FALLBACK_CONTEXT_LENGTH
    length = float(min(found))
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) not in SCALED_ALREADY:
        length *= float(rope.get("factor") or 1.0)
    tokenizer_max = _json_object(model / "tokenizer_config.json").get("model_max_length")
    if isinstance(tokenizer_max, int | float):
        length = min(length, tokenizer_max)
    return int(length)


def _json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}

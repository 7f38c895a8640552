"""The `vllm` engine adapter: vLLM's `AsyncLLM` in this process.

vLLM runs its scheduler and model in a child process (EngineCore) and streams
outputs back; this adapter renders the chat prompt, maps sampling options and
tiers onto vLLM's, and turns `RequestOutput`s into `EngineOutput`s.

Engine arguments are vLLM's own defaults, as `vllm serve MODEL` has them, except
the few in `CHATPIPE_ENGINE_ARGS` (and the KV cache's size on the CPU);
`vllm_args` (CHATPIPE_VLLM_ARGS) overrides any `AsyncEngineArgs` field. The
engine's slot count is what vLLM resolved.

Requests are submitted under their plain `request_id`: vLLM appends a random
suffix internally, so a redelivered attempt never clashes with a stale one, and
`abort(request_id)` ends every attempt of that request still in this engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.prompt import (
    completion_prompt_ids,
    prompt_token_ids,
    template_messages,
    template_tools,
    text_ids,
)
from schemas.events import (
    GenerationRequest,
    Logprobs,
    SamplingOptions,
    TokenLogprob,
    TopLogprob,
)
from schemas.lifecycle import RequestStatus
from workers.engine import Continuation, EngineOutput, EngineStats
from workers.vllm_tools import ToolReader

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.v1.metrics.stats import SchedulerStats

log = logging.getLogger(__name__)

CHATPIPE_ENGINE_ARGS: dict[str, Any] = {
    # Tiers are vLLM priorities (`Tier.rank`): vLLM's "fcfs" default would ignore them.
    "scheduling_policy": "priority",
    # No periodic stats lines in the log. vLLM's Prometheus logger still records every
    # step (the worker's own stat logger turns stats on, and vLLM always adds it):
    # its `vllm:` metrics are served beside chatpipe's (ops.metrics).
    "disable_log_stats": True,
    # Output held to a JSON schema (a required or named tool choice) is compact JSON with
    # only the properties the schema names, as OpenAI writes tool arguments. With vLLM's
    # defaults a model may write whitespace, or properties of its own, without end (the
    # tiny model did, until max_tokens). xgrammar, vLLM's first choice, allows no other
    # properties; llguidance, its fallback for schemas xgrammar cannot take, does with
    # `disable_additional_properties`, and takes the most of JSON Schema.
    "structured_outputs_config": {
        "backend": "guidance",
        "disable_any_whitespace": True,
        "disable_additional_properties": True,
    },
}
"""What chatpipe sets over vLLM's defaults; `vllm_args` may override each."""

CPU_KV_CACHE_BYTES = 1 << 30
"""The KV cache on the CPU backend unless `vllm_args` sizes it. vLLM's own default
there is 92 % of the host's memory (`gpu_memory_utilization` read as a share of
RAM), which must be free at start: beside the broker and chatpipe's stages it
seldom is (the 13 GiB development machine refused it with 11.5 GiB free). A GPU
keeps vLLM's sizing."""

WARM_UP = (
    SamplingOptions(max_tokens=4),
    SamplingOptions(max_tokens=4, logprobs=1),
    SamplingOptions(max_tokens=4, json_object=True),
)
"""The requests an engine runs before it takes work (`VllmEngine.start`)."""

SET_BY_SETTINGS = {"model": "CHATPIPE_MODEL", "served_model_name": "CHATPIPE_MODEL_NAME"}
"""Engine args chatpipe takes from its own settings (the gateway and the worker's
tokenizer read them too), never from `vllm_args`."""

_STATUS_BY_FINISH_REASON = {
    "stop": RequestStatus.FINISHED_STOPPED,
    "repetition": RequestStatus.FINISHED_STOPPED,
    "length": RequestStatus.FINISHED_LENGTH,
    "abort": RequestStatus.FINISHED_ABORTED,
    "error": RequestStatus.FINISHED_ERROR,
}


class VllmEngine:
    """Engine adapter over `vllm.v1.engine.async_llm.AsyncLLM`.

    `stats()` combines the requests inside `generate()` with the scheduler's
    own counts from its latest step; `peak_running` is the largest batch the
    vLLM scheduler ran, so it shows continuous batching, not just concurrency.
    """

    def __init__(
        self,
        model_path: Path,
        model_name: str,
        vllm_args: Mapping[str, Any] | None = None,
        tool_parser: str = "hermes",
    ) -> None:
        self.model = model_name
        self.tool_parser = tool_parser
        self.model_path = Path(model_path)
        self._engine_args = resolve_engine_args(
            self.model_path, model_name, vllm_args or {}, on_cpu=_vllm_runs_on_cpu()
        )
        self._max_slots: int | None = None
        self.sampling_defaults: dict[str, Any] = {}
        """The model's sampling defaults, as vLLM read them (known once started)."""
        self.peak_running = 0
        self._llm: Any = None
        self._tokenizer: Any = None
        self._active: Counter[str] = Counter()
        self._abort_requested: set[str] = set()
        self._scheduler_stats: SchedulerStats | None = None

    def engine_args(self) -> dict[str, Any]:
        """The `AsyncEngineArgs` fields this engine starts with (every other field at
        vLLM's default); `vllm serve` given the same runs the same engine."""
        return dict(self._engine_args)

    @property
    def max_slots(self) -> int:
        """Requests the engine runs at once: vLLM's resolved `max_num_seqs`."""
        if self._max_slots is None:
            raise RuntimeError("max_slots is known once the engine has started")
        return self._max_slots

    @property
    def vllm_config(self) -> VllmConfig:
        """Every setting vLLM resolved from the engine args (once started)."""
        if self._llm is None:
            raise RuntimeError("the engine is not running")
        return self._llm.vllm_config

    async def start(self) -> None:
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        if not tokenizer.chat_template:
            raise ValueError(f"{self.model_path} has no chat template")
        args = AsyncEngineArgs(**engine_arg_values(self._engine_args))
        stats_tap = _scheduler_stats_tap(self._on_scheduler_stats)
        # Construction blocks until the EngineCore process has loaded the model
        # and sized the KV cache; AsyncLLM supports building outside the loop.
        # vLLM's defaults (max_num_seqs, batched tokens) depend on the usage
        # context: chatpipe serves an API, as `vllm serve` does.
        self._llm = await asyncio.to_thread(
            AsyncLLM.from_engine_args,
            args,
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=[stats_tap],
        )
        try:
            self._max_slots = self._llm.vllm_config.scheduler_config.max_num_seqs
            self.sampling_defaults = self._llm.vllm_config.model_config.get_diff_sampling_param()
            self._tokenizer = tokenizer
            self._tools = ToolReader(tokenizer, self.tool_parser, self.model)
            await self._warm_up()
        except BaseException:
            await self.stop()  # the engine's processes go with the failed start
            raise

    async def _warm_up(self) -> None:
        """Take once each path a first request may take (a chat prompt, its sampling,
        logprobs, a JSON format), so no client's request waits for it: vLLM's own warm-up
        compiles the model but leaves the first request of each kind the slow one, its
        first token several times later than the next request's."""
        assert self._llm is not None
        prompt = {"type": "token", "prompt_token_ids": prompt_token_ids(
            self._tokenizer, [{"role": "user", "content": "Hello"}])}  # fmt: skip
        for n, options in enumerate(WARM_UP):
            try:
                params = sampling_params(options, self.sampling_defaults)
                async for _ in self._llm.generate(prompt, params, f"chatpipe-warm-up-{n}"):
                    pass
            except ValueError as exc:  # what this engine's settings refuse, no client asks
                log.warning("warm-up request %d not taken: %s", n, exc)

    async def stop(self) -> None:
        """Abort what still runs (its streams end FINISHED_ABORTED), then shut down."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        if self._active:
            await llm.abort(list(self._active))
        await asyncio.to_thread(llm.shutdown)

    async def generate(
        self, request: GenerationRequest, continuation: Continuation | None = None
    ) -> AsyncIterator[EngineOutput]:
        llm = self._llm
        if llm is None:
            raise RuntimeError("engine is not running")
        prompt, prompt_tokens = self._prompt(request, continuation)
        completion_tokens = continuation.tokens if continuation else 0
        params = sampling_params(request.sampling, self.sampling_defaults)
        params.max_tokens = max(1, request.sampling.max_tokens - completion_tokens)
        reading = self._tools.reading(request, params)
        if continuation is not None:
            reading.add(continuation.text)
        stream = llm.generate(
            prompt,
            params,
            request.request_id,
            priority=request.tier.rank,  # vLLM runs lower values first
        )
        self._active[request.request_id] += 1
        try:
            async with aclosing(stream):  # closing it early aborts the request in vLLM
                async for out in stream:
                    choice = out.outputs[0]
                    completion_tokens += len(choice.token_ids)
                    if not out.finished and request.request_id in self._abort_requested:
                        # abort() ran before vLLM registered the request.
                        await llm.abort(request.request_id)
                    reading.add(choice.text)
                    status = finish_status(choice.finish_reason) if out.finished else None
                    yield EngineOutput(
                        text=choice.text,
                        token_ids=tuple(choice.token_ids),
                        new_tokens=len(choice.token_ids),
                        completion_tokens=completion_tokens,
                        prompt_tokens=prompt_tokens,
                        cached_tokens=out.num_cached_tokens or 0,
                        status=status,
                        tool_calls=reading.calls() if status is not None else None,
                        logprobs=token_logprobs(
                            choice.token_ids,
                            choice.logprobs,
                            request.sampling.logprobs,
                            self._tokenizer,
                        ),
                    )
        finally:
            self._active[request.request_id] -= 1
            if not self._active[request.request_id]:
                del self._active[request.request_id]
                self._abort_requested.discard(request.request_id)

    async def abort(self, request_id: str) -> None:
        if self._llm is None:
            return
        if request_id in self._active:
            self._abort_requested.add(request_id)
        await self._llm.abort(request_id)

    @property
    def kv_cache_usage(self) -> float | None:
        """Share of the KV cache in use at the scheduler's latest step (1 = full)."""
        return self._scheduler_stats.kv_cache_usage if self._scheduler_stats else None

    def stats(self) -> EngineStats:
        in_flight = self._active.total()
        sched = self._scheduler_stats
        running = min(in_flight, sched.num_running_reqs if sched else in_flight)
        return EngineStats(
            running=running,
            waiting=in_flight - running,
            free_kv_blocks=self._free_kv_blocks(),
        )

    def _prompt(
        self, request: GenerationRequest, continuation: Continuation | None
    ) -> tuple[dict[str, Any], int]:
        """The engine's prompt, and how many of its tokens are the request's own prompt
        (a continuation's answer so far is completion, counted once as such). No
        message's content, nor the answer so far, can become a special token
        (`common.prompt`); a text completion's prompt is its text as it is."""
        if request.prompt is not None:
            token_ids = completion_prompt_ids(self._tokenizer, request.prompt)
        else:
            token_ids = prompt_token_ids(
                self._tokenizer,
                template_messages(request.messages),
                template_tools(request.tool_use),
            )
        prompt_tokens = len(token_ids)
        if continuation is not None and continuation.token_ids:
            token_ids = token_ids + list(continuation.token_ids)  # the answer so far, exactly
        elif continuation is not None:
            token_ids = token_ids + text_ids(self._tokenizer, continuation.text)
        # Rendered already: vLLM takes the ids as they are, on this loop (a raw prompt
        # would go through its renderer on a thread first).
        prompt: dict[str, Any] = {"type": "token", "prompt_token_ids": token_ids}
        if request.cache_salt:
            prompt["cache_salt"] = request.cache_salt
        return prompt, prompt_tokens

    def _free_kv_blocks(self) -> int | None:
        total = self._llm.vllm_config.cache_config.num_gpu_blocks if self._llm else None
        if not total:
            return None
        usage = self._scheduler_stats.kv_cache_usage if self._scheduler_stats else 0.0
        return round(total * (1.0 - usage))

    def _on_scheduler_stats(self, stats: SchedulerStats) -> None:
        self._scheduler_stats = stats
        self.peak_running = max(self.peak_running, stats.num_running_reqs)


def resolve_engine_args(
    model_path: Path,
    model_name: str,
    vllm_args: Mapping[str, Any],
    *,
    on_cpu: bool,
    known: Collection[str] | None = None,
) -> dict[str, Any]:
    """The `AsyncEngineArgs` fields an engine starts with: the model, chatpipe's
    `CHATPIPE_ENGINE_ARGS` (on the CPU also `CPU_KV_CACHE_BYTES`, unless `vllm_args`
    sizes the cache), then `vllm_args` over them; every other field stays at vLLM's
    default. `known` is the field names (default: `AsyncEngineArgs`'s).

    Raises `ValueError` naming each `vllm_args` key that is no field, or that
    chatpipe's own settings set (`SET_BY_SETTINGS`)."""
    known = engine_arg_names() if known is None else known
    problems = [
        f"{name!r} is set by {SET_BY_SETTINGS[name]}"
        for name in vllm_args
        if name in SET_BY_SETTINGS
    ]
    for name in vllm_args:
        if name not in known and name not in SET_BY_SETTINGS:
            close = difflib.get_close_matches(name.replace("-", "_"), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{name!r} is not an AsyncEngineArgs field{hint}")
    if problems:
        raise ValueError("CHATPIPE_VLLM_ARGS: " + "; ".join(problems))
    args = {"model": str(model_path), "served_model_name": [model_name], **CHATPIPE_ENGINE_ARGS}
    if on_cpu and not {"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(vllm_args):
        args["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    return {**args, **vllm_args}


def engine_arg_values(args: Mapping[str, Any]) -> dict[str, Any]:
    """`args` as `AsyncEngineArgs` takes them: a config given as a JSON object (as
    CHATPIPE_VLLM_ARGS gives it) becomes its vLLM config class, as vLLM's CLI does."""
    from vllm.config import StructuredOutputsConfig

    values = dict(args)
    if isinstance(values.get("structured_outputs_config"), dict):
        values["structured_outputs_config"] = StructuredOutputsConfig(
            **values["structured_outputs_config"]
        )
    return values


def engine_arg_names() -> frozenset[str]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))


def _vllm_runs_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _scheduler_stats_tap(on_stats: Callable[[SchedulerStats], None]) -> type:
    """A vLLM stat-logger class that hands every step's `SchedulerStats` to `on_stats`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SchedulerStatsTap(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            if scheduler_stats is not None:
                on_stats(scheduler_stats)

        def log_engine_initialized(self) -> None:
            pass

    return SchedulerStatsTap


ENGINE_SAMPLING = (
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "top_k",
    "logit_bias",
    "logprobs",
)
"""`SamplingOptions` fields that are `SamplingParams` fields of the same name and meaning;
unset, the model's default, else vLLM's."""


def sampling_params(
    options: SamplingOptions, model_defaults: Mapping[str, Any] | None = None
) -> SamplingParams:
    """vLLM's parameters for `options`: what a request left unset takes the model's
    default (`model_defaults`: its generation config's, as `vllm serve` applies them),
    else vLLM's own."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    defaults = {
        name: value for name, value in (model_defaults or {}).items() if name in ENGINE_SAMPLING
    }
    given = {
        name: value for name in ENGINE_SAMPLING if (value := getattr(options, name)) is not None
    }
    return SamplingParams(
        max_tokens=options.max_tokens,
        seed=options.seed,
        stop=list(options.stop) or None,
        ignore_eos=options.ignore_eos,
        output_kind=RequestOutputKind.DELTA,
        structured_outputs=json_constraint(options),
        **(defaults | given),
    )


def json_constraint(options: SamplingOptions) -> Any:
    """vLLM's structured outputs for `response_format` (as vLLM's server maps it), or None."""
    from vllm.sampling_params import StructuredOutputsParams

    if options.json_schema is not None:
        return StructuredOutputsParams(json=options.json_schema)
    if options.json_object:
        return StructuredOutputsParams(json_object=True)
    return None


LEAST_LOGPROB = -9999.0
"""Stands for -inf (JSON has no infinity), as vLLM's server writes it."""


def token_logprobs(token_ids: Any, logprobs: Any, top: int | None, tokenizer: Any) -> Logprobs:
    """The new tokens' log probabilities from vLLM's per-token `{token id: Logprob}`,
    with the `top` likeliest (by rank) at each place; () when none were asked for."""
    if top is None or not logprobs:
        return ()

    def entry(token_id: int, found: Any) -> TopLogprob:
        token = found.decoded_token
        if token is None:
            token = tokenizer.decode([token_id])
        return TopLogprob(token=token, logprob=max(found.logprob, LEAST_LOGPROB))

    out = []
    for token_id, step in zip(token_ids, logprobs, strict=False):
        if step is None or token_id not in step:
            continue
        ranked = sorted(step.items(), key=lambda item: item[1].rank or 0)[:top]
        sampled = entry(token_id, step[token_id])
        out.append(
            TokenLogprob(
                token=sampled.token,
                logprob=sampled.logprob,
                top=tuple(entry(t, found) for t, found in ranked),
            )
        )
    return tuple(out)


def finish_status(finish_reason: str | None) -> RequestStatus:
    return _STATUS_BY_FINISH_REASON.get(finish_reason or "", RequestStatus.FINISHED_ERROR)

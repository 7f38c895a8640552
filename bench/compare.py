"""Side by side: vLLM's OpenAI server as `vllm serve` runs it, `chatpipe up`, and vLLM's
server again with chatpipe's own engine arguments; same model and load.

No two sides run at once (two cores). Each side is started, warmed up at every
concurrency level (every batch shape the levels make), driven through every
level by the same client, metered, stopped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import cancel, cpu, fetch_timer
from bench.hops import ttft_hops
from bench.load import LevelRun, closed_loop, fixed_prompts
from bench.metrics import LevelStats, level_stats, percentile
from bench.processes import (
    EngineConfig,
    Service,
    broker_ready,
    chatpipe_env,
    chatpipe_up_ready,
    engine_settings,
    free_port,
    start_broker,
    start_chatpipe_up,
    start_vllm_server,
    vllm_ready,
)
from bench.sse_client import Target
from bench.topic_log import content_chunk_tokens, token_chunks
from chatpipe.settings import SETTINGS

log = logging.getLogger("bench")

API_KEY = "bench-key"
VLLM, VLLM_SAME_ARGS, CHATPIPE = "vllm", "vllm-same-args", "chatpipe"
"""The sides: vLLM's server at its defaults, vLLM's server with chatpipe's engine args."""


@dataclass(frozen=True)
class Workload:
    levels: tuple[int, ...] = (1, 8, 32, 64)
    rounds: int = 3
    """Requests per level = rounds × concurrency (at least `min_requests`)."""
    min_requests: int = 8
    max_tokens: int = 128
    warmup_tokens: int = 16
    """Warm-up: one round at every level with answers this long, before any is measured."""
    disconnects: int = 48
    disconnect_concurrency: int = 8
    disconnect_max_tokens: int = 512
    quiet_wait_s: float = 15.0
    """Before each level, wait this long at most for other processes to go quiet."""
    runs: int = 2
    """Runs per level; the one with the most tokens/s is kept (the same rule on every side)."""
    patient_until: float = float("inf")
    """time.monotonic() after which nothing waits for quiet or runs a level again (time budget)."""

    def patient(self) -> bool:
        return time.monotonic() < self.patient_until

    def requests(self, concurrency: int) -> int:
        return max(self.min_requests, self.rounds * concurrency)


@dataclass
class Level:
    stats: LevelStats
    samples: dict[str, list[float]]
    cpu: cpu.CpuUse
    ttft_hops: dict[str, tuple[float, float]] | None = None
    """chatpipe only: p50/p90 ms of each hop of the time to first token."""
    tries: int = 1
    """Runs of this level; the kept one had the most tokens/s."""


@dataclass
class SideRun:
    name: str
    ready_s: float
    levels: list[Level] = field(default_factory=list)
    cancel: cancel.CancelStats | None = None
    settings: dict[str, object] = field(default_factory=dict)
    fetch_delay_ms: tuple[float, float] | None = None
    """chatpipe only: p50/p90 ms a record waits for a consumer on its broker (the floor of
    every Kafka hop there), at the stages' fetch wait."""

    def level(self, concurrency: int) -> Level | None:
        return next((lv for lv in self.levels if lv.stats.concurrency == concurrency), None)


async def drive(
    side: SideRun,
    target: Target,
    services: list[Service],
    workload: Workload,
    bootstrap: str | None = None,
) -> None:
    """Warm up, then every level; with `bootstrap`, per-chunk token counts come from chat.tokens."""
    prompts = fixed_prompts()
    for concurrency in workload.levels:
        await closed_loop(target, concurrency, concurrency, prompts, workload.warmup_tokens)
    for concurrency in workload.levels:
        run, use, tries = await _best_run(target, services, workload, concurrency, prompts)
        counts = hops = None
        if bootstrap is not None:
            ids = [r.request_id for r in run.records if r.request_id]
            logged = await token_chunks(bootstrap, ids)
            counts = {rid: content_chunk_tokens(chunks) for rid, chunks in logged.items()}
            hops = await ttft_hops(bootstrap, run.records)
        stats, samples = level_stats(side.name, concurrency, run.records, run.wall_s, counts)
        side.levels.append(Level(stats, samples, use, hops, tries))
        log.info(
            "%s c=%d: %d/%d done, %.0f tok/s, ttft p50 %.0f ms",
            side.name,
            concurrency,
            stats.completed,
            stats.requests,
            stats.tokens_per_s,
            stats.ttft_ms[0],
        )


async def _best_run(
    target: Target,
    services: list[Service],
    workload: Workload,
    concurrency: int,
    prompts: list[str],
) -> tuple[LevelRun, cpu.CpuUse, int]:
    """`workload.runs` runs of one level (fewer once out of time); the one with the most
    delivered tokens/s, so a run slowed by other work on a shared machine is not kept."""
    best: tuple[LevelRun, cpu.CpuUse] | None = None
    tries = 0
    while tries < max(1, workload.runs) and (best is None or workload.patient()):
        tries += 1
        if workload.quiet_wait_s > 0 and workload.patient():
            await cpu.wait_for_quiet(workload.quiet_wait_s, services)
        before = cpu.snapshot(services)
        run = await closed_loop(
            target, concurrency, workload.requests(concurrency), prompts, workload.max_tokens
        )
        use = cpu.between(before, cpu.snapshot(services))
        if best is None or _delivered_per_s(run) > _delivered_per_s(best[0]):
            best = (run, use)
    assert best is not None
    return *best, tries


def _delivered_per_s(run: LevelRun) -> float:
    tokens = sum(int(r.usage["completion_tokens"]) for r in run.records if r.completed and r.usage)
    return tokens / run.wall_s if run.wall_s > 0 else 0.0


async def vllm_side(
    cfg: EngineConfig, workload: Workload, log_dir: Path, same_args: bool = False
) -> SideRun:
    """vLLM's server as `vllm serve MODEL` runs it, or (`same_args`) with chatpipe's own
    engine arguments."""
    port = free_port()
    server = start_vllm_server(cfg, port, API_KEY, log_dir, same_args)
    try:
        side = SideRun(VLLM_SAME_ARGS if same_args else VLLM, await vllm_ready(server, port))
        log.info("%s ready in %.0f s", side.name, side.ready_s)
        target = Target("vllm", port, API_KEY, cfg.model_name)
        await drive(side, target, [server], workload)
        return side
    finally:
        server.stop()


async def chatpipe_side(
    cfg: EngineConfig,
    workload: Workload,
    log_dir: Path,
    engine: str = "vllm",
    name: str = CHATPIPE,
    **settings: object,
) -> SideRun:
    """`chatpipe up` on a broker of our own, so its topics can be read afterwards."""
    broker, bootstrap = start_broker(log_dir)
    up: Service | None = None
    try:
        await broker_ready(broker, bootstrap)
        port = free_port()
        env = chatpipe_env(API_KEY, log_dir, bootstrap, **{**engine_settings(cfg), **settings})
        up = start_chatpipe_up(env, port, log_dir, engine)
        side = SideRun(name, await chatpipe_up_ready(up), settings=dict(settings))
        log.info("chatpipe up (%s) ready in %.0f s", engine, side.ready_s)
        target = Target(name, port, API_KEY, cfg.model_name)
        await drive(side, target, [up, broker], workload, bootstrap)
        wait_ms = settings.get(
            "kafka_fetch_max_wait_ms", SETTINGS["kafka_fetch_max_wait_ms"].default
        )
        found = await fetch_timer.measure(bootstrap, int(wait_ms))  # type: ignore[call-overload]
        side.fetch_delay_ms = (percentile(found, 50), percentile(found, 90))
        if workload.disconnects:
            coalesce_ms = settings.get("coalesce_ms", SETTINGS["coalesce_ms"].default)
            coalesce_s = float(coalesce_ms) / 1000  # type: ignore[arg-type]
            side.cancel = await cancel.chatpipe_waste(target, bootstrap, workload, coalesce_s)
        return side
    finally:
        if up is not None:
            up.stop()
        broker.stop()

"""Side by side: vLLM's OpenAI server as `vllm serve` runs it, `chatpipe up`, and vLLM's
server again with chatpipe's own engine arguments; same model and load.

By default no two sides run at once (two cores): each side is started, warmed up at
every concurrency level (every batch shape the levels make), driven through every level
by the same client, metered, stopped. `interleaved` starts every side first and runs
each level on one side after the other (the order turned round every run), each
run once the others have gone quiet: on a machine whose speed drifts within minutes,
the runs compared are seconds apart instead of minutes. On one GPU two engines at
vLLM's defaults do not fit beside each other; there, run the sides one after the other.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
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
from chatpipe.settings import Settings

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
    runs_tokens_per_s: list[float] = field(default_factory=list)
    """Interleaved: the delivered tokens/s of every run, in the order they ran."""


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


@dataclass
class Contender:
    """A side that is up: where to send its load and what to meter."""

    side: SideRun
    target: Target
    services: list[Service]
    bootstrap: str | None = None
    """chatpipe: its broker, where per-chunk token counts and the hops are read back."""


async def drive(side: SideRun, target: Target, services: list[Service], workload: Workload,
                bootstrap: str | None = None) -> None:
    """Warm up, then every level; with `bootstrap`, per-chunk token counts come from chat.tokens."""
    contender = Contender(side, target, services, bootstrap)
    prompts = fixed_prompts()
    await _warm_up(contender, workload, prompts)
    for concurrency in workload.levels:
        run, use, tries = await _best_run(target, services, workload, concurrency, prompts)
        await _record(contender, concurrency, run, use, tries)


async def interleaved(contenders: list[Contender], workload: Workload) -> None:
    """Every level on every side in turn, `workload.runs` times, the order reversed each
    time (A B, B A, …); each run starts once the other sides have gone quiet (under
    INTERLEAVED_QUIET_CORES, INTERLEAVED_QUIET_WAIT_S at most). Each side keeps its run
    with the most tokens/s, as `drive` does."""
    prompts = fixed_prompts()
    for contender in contenders:
        await _warm_up(contender, workload, prompts)
    for concurrency in workload.levels:
        runs: dict[str, list[tuple[LevelRun, cpu.CpuUse]]] = {c.side.name: [] for c in contenders}
        for turn in range(max(1, workload.runs)):
            for contender in contenders if turn % 2 == 0 else contenders[::-1]:
                await cpu.wait_for_quiet(INTERLEAVED_QUIET_WAIT_S, contender.services,
                                         quiet_cores=INTERLEAVED_QUIET_CORES)
                before = cpu.snapshot(contender.services)
                run = await closed_loop(contender.target, concurrency,
                                        workload.requests(concurrency), prompts,
                                        workload.max_tokens)
                runs[contender.side.name].append((run, cpu.between(before, cpu.snapshot(
                    contender.services))))
        for contender in contenders:
            tried = runs[contender.side.name]
            run, use = max(tried, key=lambda ran: _delivered_per_s(ran[0]))
            level = await _record(contender, concurrency, run, use, len(tried))
            level.runs_tokens_per_s = [_delivered_per_s(ran) for ran, _ in tried]


INTERLEAVED_QUIET_CORES = 0.06
"""Interleaved, a run waits until the sides not under load use less than this: an idle
chatpipe stack backs its fetches off after `kafka_idle_after_s` (to ~0.04 cores), so a
vLLM run does not pay for chatpipe's fetching."""
INTERLEAVED_QUIET_WAIT_S = 20.0


def paired_ratios(side: Level, base: Level) -> list[float]:
    """Interleaved: run i of `side` over run i of `base` (the two ran seconds apart)."""
    return [a / b for a, b in zip(side.runs_tokens_per_s, base.runs_tokens_per_s, strict=False)
            if b > 0]


async def _warm_up(contender: Contender, workload: Workload, prompts: list[str]) -> None:
    """One round at every level: every batch shape the levels make."""
    for concurrency in workload.levels:
        await closed_loop(contender.target, concurrency, concurrency, prompts,
                          workload.warmup_tokens)


async def _record(contender: Contender, concurrency: int, run: LevelRun, use: cpu.CpuUse,
                  tries: int) -> Level:
    """The kept run of one level as the side's `Level` (chatpipe: with what its topics say)."""
    counts = hops = None
    if contender.bootstrap is not None:
        ids = [r.request_id for r in run.records if r.request_id]
        logged = await token_chunks(contender.bootstrap, ids)
        counts = {rid: content_chunk_tokens(chunks) for rid, chunks in logged.items()}
        hops = await ttft_hops(contender.bootstrap, run.records)
    side = contender.side
    stats, samples = level_stats(side.name, concurrency, run.records, run.wall_s, counts)
    level = Level(stats, samples, use, hops, tries)
    side.levels.append(level)
    log.info("%s c=%d: %d/%d done, %.0f tok/s, ttft p50 %.0f ms", side.name, concurrency,
             stats.completed, stats.requests, stats.tokens_per_s, stats.ttft_ms[0])
    return level


async def _best_run(target: Target, services: list[Service], workload: Workload,
                    concurrency: int, prompts: list[str]) -> tuple[LevelRun, cpu.CpuUse, int]:
    """`workload.runs` runs of one level (fewer once out of time); the one with the most
    delivered tokens/s, so a run slowed by other work on a shared machine is not kept."""
    best: tuple[LevelRun, cpu.CpuUse] | None = None
    tries = 0
    while tries < max(1, workload.runs) and (best is None or workload.patient()):
        tries += 1
        if workload.quiet_wait_s > 0 and workload.patient():
            await cpu.wait_for_quiet(workload.quiet_wait_s, services)
        before = cpu.snapshot(services)
        run = await closed_loop(target, concurrency, workload.requests(concurrency), prompts,
                                workload.max_tokens)
        use = cpu.between(before, cpu.snapshot(services))
        if best is None or _delivered_per_s(run) > _delivered_per_s(best[0]):
            best = (run, use)
    assert best is not None
    return *best, tries


def _delivered_per_s(run: LevelRun) -> float:
    tokens = sum(int(r.usage["completion_tokens"]) for r in run.records if r.completed and r.usage)
    return tokens / run.wall_s if run.wall_s > 0 else 0.0


async def vllm_side(cfg: EngineConfig, workload: Workload, log_dir: Path,
                    same_args: bool = False) -> SideRun:
    """vLLM's server as `vllm serve MODEL` runs it, or (`same_args`) with chatpipe's own
    engine arguments."""
    async with vllm_up(cfg, log_dir, same_args) as contender:
        await drive(contender.side, contender.target, contender.services, workload)
        return contender.side


@contextlib.asynccontextmanager
async def vllm_up(cfg: EngineConfig, log_dir: Path, same_args: bool = False,
                  ) -> AsyncIterator[Contender]:
    port = free_port()
    server = start_vllm_server(cfg, port, API_KEY, log_dir, same_args)
    try:
        side = SideRun(VLLM_SAME_ARGS if same_args else VLLM, await vllm_ready(server, port))
        log.info("%s ready in %.0f s", side.name, side.ready_s)
        yield Contender(side, Target("vllm", port, API_KEY, cfg.model_name), [server])
    finally:
        server.stop()


async def chatpipe_side(cfg: EngineConfig, workload: Workload, log_dir: Path, engine: str = "vllm",
                        name: str = CHATPIPE, **settings: object) -> SideRun:
    """`chatpipe up` on a broker of our own, so its topics can be read afterwards."""
    async with chatpipe_up(cfg, log_dir, engine, name, **settings) as contender:
        await drive(contender.side, contender.target, contender.services, workload,
                    contender.bootstrap)
        await chatpipe_extras(contender, workload)
        return contender.side


@contextlib.asynccontextmanager
async def chatpipe_up(cfg: EngineConfig, log_dir: Path, engine: str = "vllm",
                      name: str = CHATPIPE, **settings: object) -> AsyncIterator[Contender]:
    broker, bootstrap = start_broker(log_dir)
    up: Service | None = None
    try:
        await broker_ready(broker, bootstrap)
        port = free_port()
        env = chatpipe_env(API_KEY, log_dir, bootstrap, **{**engine_settings(cfg), **settings})
        up = start_chatpipe_up(env, port, log_dir, engine)
        side = SideRun(name, await chatpipe_up_ready(up), settings=dict(settings))
        log.info("chatpipe up (%s) ready in %.0f s", engine, side.ready_s)
        yield Contender(side, Target(name, port, API_KEY, cfg.model_name), [up, broker],
                        bootstrap)
    finally:
        if up is not None:
            up.stop()
        broker.stop()


async def chatpipe_extras(contender: Contender, workload: Workload) -> None:
    """After the levels: the broker's own fetch timer, then the cancellation waste."""
    side, bootstrap = contender.side, contender.bootstrap
    assert bootstrap is not None
    wait_ms = side.settings.get("kafka_fetch_max_wait_ms",
                                Settings.model_fields["kafka_fetch_max_wait_ms"].default)
    found = await fetch_timer.measure(bootstrap, int(wait_ms))  # type: ignore[call-overload]
    side.fetch_delay_ms = (percentile(found, 50), percentile(found, 90))
    if workload.disconnects:
        coalesce_ms = side.settings.get("coalesce_ms",
                                        Settings.model_fields["coalesce_ms"].default)
        coalesce_s = float(coalesce_ms) / 1000  # type: ignore[arg-type]
        side.cancel = await cancel.chatpipe_waste(contender.target, bootstrap, workload,
                                                  coalesce_s)

"""Pipeline capacity with the `sim` engine: every stage its own process, metered apart.

The broker and every stage (`chatpipe gateway|scheduler|worker|safety|recorder|…`)
run as separate processes so each one's CPU time can be read from /proc. The
sim engine emits a fixed token rate per stream and never runs out of slots, so
what is measured is the pipeline: how many SSE streams one gateway process
keeps at pace, the token events per second delivered end to end, and CPU
seconds per 1,000 delivered tokens per stage.

A level "holds" when every stream completes, the slowest tenth of streams
still receive at least 90% of the set token rate, and the first token p99 stays
under a second. Levels grow until one does not hold.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import cpu
from bench.load import fixed_prompts, held_streams
from bench.metrics import chunk_gaps, percentile
from bench.processes import (
    CHATPIPE,
    Service,
    broker_ready,
    chatpipe_env,
    child_env,
    free_port,
    http_ok,
    start_broker,
    start_stage,
    wait_until,
)
from bench.sse_client import StreamRecord, Target, chat_body, stream_chat
from chatpipe import cli
from chatpipe.settings import SETTINGS
from chatpipe.tiny_model import TINY_MODEL_DIR

log = logging.getLogger("bench")

API_KEY = "bench-key"
STAGES = tuple(sorted(cli.STAGES, key=lambda stage: stage == "gateway"))
"""Every stage a deployment runs as its own process; the gateway last (it is polled)."""


@dataclass(frozen=True)
class CapacityPlan:
    streams: tuple[int, ...] = (100, 200, 300, 400, 500)
    tokens_per_s: float = 20.0
    """Per stream, as the sim engine emits them."""
    hold_s: float = 6.0
    """How long each stream lasts (max_tokens = tokens_per_s × hold_s)."""
    ramp_s: float = 1.0
    coalesce_ms: float = 50.0
    quiet_wait_s: float = 15.0
    """Before each level, wait this long at most for other processes to go quiet."""
    patient_until: float = float("inf")
    """time.monotonic() after which no level waits for quiet (time budget)."""
    idle_s: float = 10.0
    """Before the levels: CPU of every process with no traffic for this long (0: skip),
    once its consumers have gone idle (`kafka_idle_after_s`)."""
    probes: int = 10
    """Before the levels: one request after the idle wait, then this many one at a time
    (time to first token at concurrency 1; 0: skip)."""

    @property
    def max_tokens(self) -> int:
        return round(self.tokens_per_s * self.hold_s)


@dataclass
class CapacityLevel:
    streams: int
    completed: int
    wall_s: float
    tokens: int
    chunks: int
    ttft_ms: tuple[float, float]
    chunk_gap_p99_ms: float
    stream_rate_p10: float
    """Tokens per second the slowest tenth of streams received (while streaming)."""
    tokens_per_s: float
    events_per_s: float
    """Delivered while every stream of the level was streaming (the steady state)."""
    cpu: cpu.CpuUse
    holds: bool

    def cpu_per_1k_tokens(self, seconds: float) -> float:
        return seconds / self.tokens * 1000 if self.tokens else float("nan")


@dataclass
class CapacityRun:
    plan: CapacityPlan
    levels: list[CapacityLevel] = field(default_factory=list)
    idle: cpu.CpuUse | None = None
    """The stack with no traffic (`plan.idle_s`)."""
    ttft_after_idle_ms: float | None = None
    """The first request after the idle period."""
    ttft_c1_ms: tuple[float, float] | None = None
    """p50 / p90 of `plan.probes` requests one at a time, after that first one."""

    @property
    def max_held(self) -> int:
        return max((lv.streams for lv in self.levels if lv.holds), default=0)


async def capacity(
    plan: CapacityPlan,
    log_dir: Path,
    profiler: list[str] | None = None,
    profile_dir: Path | None = None,
    **settings: object,
) -> CapacityRun:
    """Start broker and stages, then hold ever more streams until a level fails."""
    broker, bootstrap = start_broker(log_dir)
    stages: list[Service] = []
    try:
        await broker_ready(broker, bootstrap)
        env = chatpipe_env(
            API_KEY,
            log_dir,
            bootstrap,
            **{
                **settings,
                "engine": "sim",
                "sim_tokens_per_s": plan.tokens_per_s,
                "max_slots": 100_000,
                "coalesce_ms": plan.coalesce_ms,
            },
        )
        await asyncio.to_thread(
            subprocess.run,
            [CHATPIPE, "topics", "create"],
            env=child_env(env),
            check=True,
            capture_output=True,
            timeout=60,
        )
        port = free_port()
        for stage in STAGES:
            wrapper = _profiled(profiler, profile_dir, stage)
            stages.append(start_stage(stage, {**env, "CHATPIPE_PORT": str(port)}, log_dir, wrapper))
        target = Target("chatpipe-sim", port, API_KEY, TINY_MODEL_DIR.name)
        await wait_until(lambda: http_ok(port, "/healthz"), stages[-1], 240, "/healthz")
        await _first_answer(target, stages[-1])
        run = CapacityRun(plan)
        idle = settings.get("kafka_idle_after_s", SETTINGS["kafka_idle_after_s"].default)
        assert isinstance(idle, int | float | str), idle
        idle_after_s = float(idle)
        await _idle_and_probes(run, target, [*stages, broker], idle_after_s)
        for streams in plan.streams:
            level = await _level(target, plan, streams, [*stages, broker])
            run.levels.append(level)
            log.info(
                "capacity %d streams: %d done, %.0f tok/s, %.0f events/s, holds=%s",
                streams,
                level.completed,
                level.tokens_per_s,
                level.events_per_s,
                level.holds,
            )
            if not level.holds:
                break
        return run
    finally:
        for service in reversed(stages):
            service.stop()
        broker.stop()


async def _idle_and_probes(
    run: CapacityRun, target: Target, services: list[Service], idle_after_s: float
) -> None:
    """Cores each process burns with no traffic, then what a request after that idle time
    and requests one at a time wait for their first token."""
    plan = run.plan
    if plan.idle_s > 0:
        await asyncio.sleep(idle_after_s + 2.0)  # until the consumers have backed off
        before = cpu.snapshot(services)
        await asyncio.sleep(plan.idle_s)
        run.idle = cpu.between(before, cpu.snapshot(services))
        log.info(
            "idle: %.3f cores (%s)",
            run.idle.cores(run.idle.tested),
            ", ".join(
                f"{name} {run.idle.cores(s):.3f}" for name, s in sorted(run.idle.by_process.items())
            ),
        )
    if plan.probes > 0:
        body = chat_body(target.model, fixed_prompts()[0], 16)
        first = await stream_chat(target, body, timeout_s=30)
        run.ttft_after_idle_ms = first.ttft * 1000 if first.ttft is not None else None
        ttfts = []
        for _ in range(plan.probes):
            record = await stream_chat(target, body, timeout_s=30)
            if record.ttft is not None:
                ttfts.append(record.ttft * 1000)
        run.ttft_c1_ms = (percentile(ttfts, 50), percentile(ttfts, 90))
        log.info(
            "TTFT after idle %s ms; one at a time p50 / p90 %.0f / %.0f ms",
            f"{run.ttft_after_idle_ms:.0f}" if run.ttft_after_idle_ms else "-",
            *run.ttft_c1_ms,
        )


def idle_cores(idle: cpu.CpuUse) -> str:
    """Cores each process of an idle stack used, and all of them together."""
    each = (f"{name} {idle.cores(sec):.3f}" for name, sec in sorted(idle.by_process.items()))
    return ", ".join(each) + f"; all {idle.cores(idle.tested):.3f}"


def summary(run: CapacityRun) -> str:
    """A compact report of a capacity run (`python -m bench capacity`)."""
    lines = []
    if run.idle is not None:
        idle = run.idle
        lines += [
            f"Idle cores per process (no traffic, {idle.wall_s:.0f} s): "
            f"{idle_cores(idle)}; foreign {idle.cores(idle.foreign):.2f}",
            "",
        ]
    if run.ttft_c1_ms is not None:
        after = run.ttft_after_idle_ms
        lines += [
            f"TTFT of the first request after idle: "
            f"{'-' if after is None else f'{after:.0f}'} ms; then one at a time "
            f"p50 / p90: {run.ttft_c1_ms[0]:.0f} / {run.ttft_c1_ms[1]:.0f} ms",
            "",
        ]
    names = sorted({n for lv in run.levels for n in lv.cpu.by_process})
    lines += [
        "| streams | done | tok/s | TTFT p50/p99 ms | gap p99 ms | p10 tok/s | holds | "
        "foreign cores | " + " | ".join(names) + " | all (CPU s / 1k tokens) |",
        "|---" * (9 + len(names)) + "|",
    ]
    for lv in run.levels:
        per_1k = [f"{lv.cpu_per_1k_tokens(lv.cpu.by_process.get(n, 0.0)):.3f}" for n in names]
        lines.append(
            f"| {lv.streams} | {lv.completed} | {lv.tokens_per_s:.0f} | "
            f"{lv.ttft_ms[0]:.0f}/{lv.ttft_ms[1]:.0f} | {lv.chunk_gap_p99_ms:.0f} | "
            f"{lv.stream_rate_p10:.1f} | {'yes' if lv.holds else 'no'} | "
            f"{lv.cpu.cores(lv.cpu.foreign):.2f} | "
            + " | ".join(per_1k)
            + f" | {lv.cpu_per_1k_tokens(lv.cpu.tested):.3f} |"
        )
    return "\n".join(lines) + "\n"


def _profiled(profiler: list[str] | None, profile_dir: Path | None, stage: str) -> list[str] | None:
    if profiler is None or profile_dir is None:
        return None
    return [part.replace("{out}", str(profile_dir / stage)) for part in profiler]


async def _first_answer(target: Target, gateway: Service, timeout_s: float = 60) -> None:
    """The worker has registered with the scheduler once a request is answered."""
    body = chat_body(target.model, "warm up", 4)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        gateway.check_alive()
        if (await stream_chat(target, body, timeout_s=15)).completed:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError("the sim pipeline answered no request")


async def _level(
    target: Target, plan: CapacityPlan, streams: int, services: list[Service]
) -> CapacityLevel:
    if plan.quiet_wait_s > 0 and time.monotonic() < plan.patient_until:
        await cpu.wait_for_quiet(plan.quiet_wait_s, services)
    before = cpu.snapshot(services)
    run = await held_streams(target, streams, fixed_prompts(), plan.max_tokens, plan.ramp_s)
    use = cpu.between(before, cpu.snapshot(services))
    done = [r for r in run.records if r.completed]
    ttft = [r.ttft for r in done if r.ttft is not None]
    rates = [rate for r in done if (rate := _stream_rate(r)) is not None]
    gaps = [gap for r in done for gap in chunk_gaps(r.times)]
    ttft_ms = (percentile(ttft, 50) * 1000, percentile(ttft, 99) * 1000)
    tokens_per_s, events_per_s = _steady_rates(done)
    rate_p10 = percentile(rates, 10)
    holds = len(done) == streams and rate_p10 >= 0.9 * plan.tokens_per_s and ttft_ms[1] < 1000
    return CapacityLevel(
        streams=streams,
        completed=len(done),
        wall_s=run.wall_s,
        tokens=sum(int(r.usage["completion_tokens"]) for r in done if r.usage),
        chunks=sum(len(r.times) for r in run.records),
        ttft_ms=ttft_ms,
        chunk_gap_p99_ms=percentile(gaps, 99) * 1000,
        stream_rate_p10=rate_p10,
        tokens_per_s=tokens_per_s,
        events_per_s=events_per_s,
        cpu=use,
        holds=holds,
    )


def _steady_rates(records: list[StreamRecord]) -> tuple[float, float]:
    """Tokens/s and SSE events/s delivered while every stream was streaming
    (the sim's words: one token each); NaN when the streams never all overlapped."""
    streaming = [r for r in records if r.times]
    if not streaming:
        return float("nan"), float("nan")
    start = max(r.times[0] for r in streaming)
    end = min(r.times[-1] for r in streaming)
    if end - start < 0.5:
        return float("nan"), float("nan")
    tokens = events = 0
    for record in streaming:
        for at, text in zip(record.times, record.texts, strict=True):
            if start < at <= end:
                events += 1
                tokens += len(text.split())
    return tokens / (end - start), events / (end - start)


def _stream_rate(record: StreamRecord) -> float | None:
    """Tokens per second after the first chunk (the sim's words: one token each)."""
    if len(record.times) < 2 or not record.usage:
        return None
    first = len(record.texts[0].split())
    span = record.times[-1] - record.times[0]
    return (int(record.usage["completion_tokens"]) - first) / span if span > 0 else None

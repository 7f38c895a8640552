"""Bus settings side by side: what the fetch wait, partition count and chunk pacing cost.

    .venv/bin/python -m bench.bus_settings            # ~10 min; prints a Markdown table

For each variant, `chatpipe up` (real vLLM, tiny model) on a fresh Tansu broker:
the CPU it and the broker burn while idle, time to first token at concurrency 1,
and tokens/s with CPU per 1,000 tokens at concurrency 64. One variant at a time,
in one run, so the ratios compare like with like on a noisy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import cpu
from bench.cpu import CpuUse
from bench.load import closed_loop, fixed_prompts
from bench.metrics import percentile
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
)
from bench.sse_client import Target
from chatpipe.tiny_model import TINY_MODEL_DIR

VARIANTS: dict[str, dict[str, object]] = {
    "defaults": {},
    "fetch wait 5 ms": {"kafka_fetch_max_wait_ms": 5},
    "8 partitions (the old default)": {"topic_partitions": 8, "work_partitions": 8},
    "chunk pacing at 500 chunks/s per worker": {"coalesce_max_chunks_per_s": 500},
}


@dataclass
class Measured:
    idle_up: float
    idle_broker: float
    ttft_p50: float
    ttft_p90: float
    tokens_per_s: float
    cpu_up: float
    cpu_broker: float
    cpu_engine: float


def _split(use: CpuUse) -> tuple[float, float, float]:
    """CPU seconds of chatpipe-up's own process, the broker, and the engine's processes."""
    up = use.by_process.get("chatpipe-up", 0.0)
    broker = use.by_process.get("broker", 0.0)
    return up, broker, use.tested - up - broker


async def measure(
    settings: dict[str, object], concurrency: int, seconds: float, log_dir: Path
) -> Measured:
    broker, bootstrap = start_broker(log_dir)
    up: Service | None = None
    try:
        await broker_ready(broker, bootstrap)
        cfg = EngineConfig(model=TINY_MODEL_DIR)
        port = free_port()
        env = chatpipe_env("bench", log_dir, bootstrap, **{**engine_settings(cfg), **settings})
        up = start_chatpipe_up(env, port, log_dir, "vllm")
        await chatpipe_up_ready(up)
        target = Target("chatpipe", port, "bench", cfg.model_name)
        await closed_loop(target, 8, 16, fixed_prompts(), 128)  # warm-up
        await asyncio.sleep(3)
        services = [up, broker]
        before = cpu.snapshot(services)
        await asyncio.sleep(10)
        idle = cpu.between(before, cpu.snapshot(services))
        idle_up, idle_broker, _ = (idle.cores(cpu_s) for cpu_s in _split(idle))

        single = await closed_loop(target, 1, 24, fixed_prompts(), 32)
        ttfts = [r.ttft * 1000 for r in single.records if r.ttft is not None]

        before = cpu.snapshot(services)
        done = 0
        while time.monotonic() - before.at < seconds:
            level = await closed_loop(target, concurrency, concurrency * 2, fixed_prompts(), 128)
            done += sum(1 for r in level.records if r.completed)
        load = cpu.between(before, cpu.snapshot(services))
        kilo = done * 128 / 1000
        return Measured(
            idle_up,
            idle_broker,
            percentile(ttfts, 50),
            percentile(ttfts, 90),
            kilo * 1000 / load.wall_s,
            *(cpu_s / kilo for cpu_s in _split(load)),
        )
    finally:
        if up is not None:
            up.stop()
        broker.stop()


def table(results: dict[str, Measured], concurrency: int) -> str:
    lines = [
        f"| variant | idle cores: chatpipe-up / broker | TTFT c=1 p50 / p90 ms | "
        f"tokens/s c={concurrency} | CPU s per 1k tokens: chatpipe-up / broker / engine |",
        "|---|---|---|---|---|",
    ]
    for name, m in results.items():
        lines.append(
            f"| {name} | {m.idle_up:.2f} / {m.idle_broker:.2f} | "
            f"{m.ttft_p50:.0f} / {m.ttft_p90:.0f} | {m.tokens_per_s:.0f} | "
            f"{m.cpu_up:.2f} / {m.cpu_broker:.2f} / {m.cpu_engine:.2f} |"
        )
    return "\n".join(lines)


async def run(concurrency: int, seconds: float) -> dict[str, Measured]:
    work = Path(tempfile.mkdtemp(prefix="chatpipe-bus-"))
    results = {}
    for i, (name, settings) in enumerate(VARIANTS.items()):
        log_dir = work / str(i)
        log_dir.mkdir()
        results[name] = await measure(settings, concurrency, seconds, log_dir)
        print(f"{name}: {results[name]}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bus_settings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    results = asyncio.run(run(args.concurrency, args.seconds))
    print(table(results, args.concurrency))


if __name__ == "__main__":
    main()

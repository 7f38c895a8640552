"""`python -m bench differentiators`: what chatpipe promises beyond an engine's own
server, measured on a pipeline of processes (sim engine, embedded broker), recorded in
bench/RESULTS.md.

    .venv/bin/python -m bench differentiators [--kills 100] [--no-write]   # minutes

- queue-position ETA error under a backlog (`eta`),
- retraction latency and what the client saw before it (`retraction`),
- cancel latency and the tokens generated after a hang-up (`cancel_latency`),
- resume success over gateway kills (`resume`, when that module is there).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import shlex
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import fault_scenarios
from bench.differentiators import cancel_latency, eta, retraction
from bench.differentiators.report import BEGIN, END, DifferentiatorsRun, markdown
from bench.faults import write
from bench.report import machine

SLOTS_PER_WORKER = 2
"""Few slots, so the ETA phase's streams queue."""

log = logging.getLogger("bench.differentiators")


def resume_measure() -> tuple[Callable[[int], Awaitable[Any]] | None, str]:
    """`bench.differentiators.resume.measure`, or None and why not."""
    try:
        module = importlib.import_module("bench.differentiators.resume")
    except ImportError as exc:
        return None, f"not measured: bench.differentiators.resume is missing ({exc})."
    measure = getattr(module, "measure", None)
    if not inspect.iscoroutinefunction(measure):
        return None, "not measured: bench.differentiators.resume has no `async def measure`."
    return measure, ""


async def resume_lines(kills: int) -> list[str]:
    measure, why = resume_measure()
    if measure is None:
        return [why]
    stats = await measure(kills)
    return list(stats.lines())


async def run(kills: int, command: str) -> DifferentiatorsRun:
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="differentiators-"))
    slots = SLOTS_PER_WORKER * len(fault_scenarios.WORKERS)
    async with fault_scenarios.stream_pipeline(tmp, max_slots=SLOTS_PER_WORKER) as pipe:
        log.info("queue ETA under a backlog")
        queue_eta = await eta.measure(pipe, slots)
        log.info("retraction latency")
        retracted = await retraction.measure(pipe)
        log.info("cancel latency")
        cancelled = await cancel_latency.measure(pipe)
    log.info("resume over %d gateway kills", kills)
    resumed = await resume_lines(kills)
    return DifferentiatorsRun(
        command,
        machine(),
        queue_eta,
        retracted,
        cancelled,
        resumed,
        duration_s=time.monotonic() - started,
    )


def main(argv: list[str], out: Path) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    parser = argparse.ArgumentParser(prog="python -m bench differentiators")
    parser.add_argument("--kills", type=int, default=100, help="gateway kills for resume")
    parser.add_argument("--out", type=Path, default=out, help="where RESULTS.md is")
    parser.add_argument("--no-write", action="store_true", help="print the section only")
    args = parser.parse_args(argv)
    command = shlex.join([".venv/bin/python", "-m", "bench", "differentiators", *argv])
    report = markdown(asyncio.run(run(args.kills, command)))
    if not args.no_write:
        write(report, args.out / "RESULTS.md", BEGIN, END)
    print(report)

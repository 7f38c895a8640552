"""The differentiators' run: one pipeline for ETA, retraction and cancel, then the resume
bench on its own; `python -m bench differentiators` calls `main`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import tempfile
import time
from pathlib import Path

from bench import fault_scenarios
from bench.differentiators import cancel_latency, eta, resume, retraction
from bench.differentiators.report import BEGIN, END, DifferentiatorsRun, markdown
from bench.faults import write
from bench.report import machine

SLOTS_PER_WORKER = 2
"""Few slots, so the ETA phase's streams queue."""

log = logging.getLogger("bench.differentiators")


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
    resumed = await resume.measure(kills)
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

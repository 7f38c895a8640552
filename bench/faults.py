"""`python -m bench faults`: the fault scenarios (`bench/fault_scenarios.py`, which
`tests/faults/` asserts on) run once each on a
pipeline of processes (sim engine, embedded broker), recorded in `bench/RESULTS.md`.

    .venv/bin/python -m bench faults          # ~2 min

Per scenario: answers streamed, answers finished, tokens missing and tokens repeated
against an uninterrupted run of the same requests, and the longest pause any user saw.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from bench import fault_scenarios as scenarios
from bench.fault_scenarios import FaultResult
from workers.config import WorkerSettings

BEGIN = "<!-- written by python -m bench faults: begin -->"
END = "<!-- written by python -m bench faults: end -->"
COMMAND = ".venv/bin/python -m bench faults"


async def run_all() -> list[FaultResult]:
    tmp = Path(tempfile.mkdtemp(prefix="faults-"))
    async with scenarios.stream_pipeline(tmp) as pipe:
        return [
            await scenarios.worker_crash(pipe, streams=64),
            await scenarios.worker_drain(pipe, streams=16),
            await scenarios.gateway_death(pipe, streams=16),
            await scenarios.scheduler_restart(pipe, running=16, queued=8),
            await scenarios.broker_cut(pipe, streams=16, cut_s=3.0),
        ]


async def at_default_timing() -> FaultResult:
    """The worker crash again, on a pipeline at the product's own lost-worker timing
    (`CHATPIPE_WORKER_LOST_AFTER_S`, `CHATPIPE_HEARTBEAT_INTERVAL_S` at their defaults):
    the pause a deployment that keeps them sees."""
    defaults = WorkerSettings.model_fields
    lost_after_s = defaults["worker_lost_after_s"].default
    timing = {"worker_lost_after_s": lost_after_s,
              "heartbeat_interval_s": defaults["heartbeat_interval_s"].default}  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="faults-defaults-"))
    async with scenarios.stream_pipeline(tmp, **timing) as pipe:
        return await scenarios.worker_crash(
            pipe, 64, lost_after_s, f" (lost after {lost_after_s:g} s, the default)"
        )


def markdown(results: list[FaultResult], when: str) -> str:
    lines = [
        BEGIN,
        "## Faults: every stream finishes",
        "",
        "```sh",
        COMMAND,
        "```",
        "",
        f"Run on {when}: every stage its own process on the embedded broker, sim engine "
        f"({scenarios.TOKENS_PER_S:g} tokens/s per answer), two workers, two gateways, "
        f"worker lost after {scenarios.LOST_AFTER_S:g} s, drain timeout "
        f"{scenarios.DRAIN_S:g} s. Tokens missing or repeated compare each answer the "
        "user saw with the sim engine's plan for its request (what an uninterrupted run "
        "streams); the longest pause is from the request to the first piece, between "
        "pieces, or from the last piece to the end.",
        "",
        "| scenario | streams | finished | tokens missing | tokens repeated | max stall ms "
        "| also measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        extra = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in r.details.items())
        lines.append(
            f"| {r.scenario} | {r.streams} | {r.finished} | {r.tokens_missing} | "
            f"{r.tokens_repeated} | {r.max_stall_ms:.0f} | {extra} |"
        )
    lines += ["", END]
    return "\n".join(lines)


def write(report: str, path: Path, begin: str = BEGIN, end: str = END) -> None:
    """Replace the section between `begin` and `end` (this benchmark's markers unless
    told) of `path`, or add it at the end, keeping the rest."""
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        before, _, rest = text.partition(begin)
        _, _, after = rest.partition(end)
        text = before + report + after
    else:
        text = text.rstrip("\n") + "\n\n" + report + "\n"
    path.write_text(text)


async def every_scenario() -> list[FaultResult]:
    return [*await run_all(), await at_default_timing()]


def main(out: Path) -> None:
    results = asyncio.run(every_scenario())
    report = markdown(results, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    write(report, out / "RESULTS.md")
    print(report)

"""`python -m bench soak`: `chatpipe up` (sim engine, its own process and directory)
under mixed load for tens of minutes, watched for what only time shows: a process that
keeps spinning once the load has gone, or answers that slow down.

    .venv/bin/python -m bench soak --minutes 20

Each cycle is `--load-s` of mixed load, then `--idle-s` idle. The load, from one key
with its limits lifted: native streams (some dropped by their client mid-answer and
never resumed), streamed and whole chat completions, Responses API calls and
embeddings, `--concurrency` at a time. In each idle window, after a few seconds to
settle, the CPU of the embedded broker and of the `chatpipe up` process (with its
embedding process, without the broker) is sampled,
and one 60-token answer is timed. A cycle is flagged when either process uses more
than `SPIN_CPU` of a core while idle, or the timed answer takes over `SLOW_ANSWER_S`.
The table goes to `bench/RESULTS.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.faults import write
from bus.broker import free_port

BEGIN = "<!-- written by python -m bench soak: begin -->"
END = "<!-- written by python -m bench soak: end -->"
UP_LINE = re.compile(r"chatpipe is up: (?P<url>http://\S+?)/?\s+API key: (?P<key>\S+)")
SPIN_CPU = 0.2
"""Share of one core an idle process may use before its cycle is flagged."""
SLOW_ANSWER_S = 5.0
SETTLE_S = 3.0


@dataclass
class Cycle:
    index: int
    requests: int = 0
    failed: int = 0
    broker_idle_cpu: float = 0.0
    chatpipe_idle_cpu: float = 0.0
    broker_restarted: bool = False
    """`chatpipe up` restarted its broker during the cycle (it spun while idle)."""
    answer_s: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def flagged(self) -> bool:
        return (
            self.broker_idle_cpu > SPIN_CPU
            or self.chatpipe_idle_cpu > SPIN_CPU
            or self.answer_s > SLOW_ANSWER_S
        )


async def one_request(client: httpx.AsyncClient, rng: random.Random, model: str) -> str:
    """One request of the mix; '' when it went as it should, else what went wrong."""
    kind = rng.choice(["native", "native", "native_drop", "chat_stream", "chat", "responses",
                       "embeddings"])  # fmt: skip
    tokens = rng.randint(20, 300)
    if kind.startswith("native"):
        cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        body = {"content": f"[[sim:length={tokens}]] soak", "max_tokens": tokens}
        async with client.stream("POST", f"/v1/conversations/{cid}/messages", json=body) as r:
            if r.status_code != 200:
                return f"native {r.status_code}"
            lines = 0
            async for line in r.aiter_lines():
                lines += 1
                if kind == "native_drop" and lines > 20:
                    return ""  # the client goes; the generation is held, then cancelled
                if line == "event: error":
                    return "native error"
        return ""
    if kind == "embeddings":
        r = await client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2",
                                                      "input": ["soak text"] * 8})  # fmt: skip
        return "" if r.status_code == 200 else f"embeddings {r.status_code}"
    messages = [{"role": "user", "content": f"[[sim:length={tokens}]] soak"}]
    if kind == "responses":
        r = await client.post("/v1/responses", json={
            "model": model, "input": f"[[sim:length={tokens}]] soak",
            "max_output_tokens": tokens})  # fmt: skip
        return "" if r.status_code == 200 else f"responses {r.status_code}"
    body2 = {"model": model, "messages": messages, "max_tokens": tokens,
             "stream": kind == "chat_stream"}  # fmt: skip
    if kind == "chat":
        r = await client.post("/v1/chat/completions", json=body2)
        return "" if r.status_code == 200 else f"chat {r.status_code}"
    async with client.stream("POST", "/v1/chat/completions", json=body2) as r:
        if r.status_code != 200:
            return f"chat_stream {r.status_code}"
        async for line in r.aiter_lines():
            if line.startswith('data: {"error"'):
                return "chat_stream error"
    return ""


async def load(client: httpx.AsyncClient, cycle: Cycle, seconds: float, concurrency: int,
               model: str, rng: random.Random) -> None:  # fmt: skip
    until = time.monotonic() + seconds

    async def user() -> None:
        while time.monotonic() < until:
            try:
                failure = await one_request(client, rng, model)
            except httpx.HTTPError as exc:
                failure = type(exc).__name__
            cycle.requests += 1
            if failure:
                cycle.failed += 1
                cycle.failures[failure] = cycle.failures.get(failure, 0) + 1

    await asyncio.gather(*(user() for _ in range(concurrency)))


def idle_cpu(processes: list[psutil.Process], seconds: float) -> list[float]:
    """Each process's CPU (share of one core, its children but the others of
    `processes` included: the embedding process, not the broker) over `seconds`."""
    apart = {p.pid for p in processes}

    def total(process: psutil.Process) -> float:
        times = [process.cpu_times()]
        for child in process.children(recursive=True):
            if child.pid in apart:
                continue
            with contextlib.suppress(psutil.Error):
                times.append(child.cpu_times())
        return sum(t.user + t.system for t in times)

    before = [total(p) for p in processes]
    time.sleep(seconds)
    used = []
    for process, start in zip(processes, before, strict=True):
        try:
            used.append(round((total(process) - start) / seconds, 3))
        except psutil.NoSuchProcess:  # the broker, restarted meanwhile: its end unknown
            used.append(float("nan"))
    return used


async def timed_answer(client: httpx.AsyncClient) -> float:
    started = time.monotonic()
    cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
    body = {"content": "[[sim:length=60]] timed", "max_tokens": 60}
    async with client.stream("POST", f"/v1/conversations/{cid}/messages", json=body) as r:
        async for _ in r.aiter_lines():
            pass
    return round(time.monotonic() - started, 2)


async def soak(minutes: float, load_s: float, idle_s: float, concurrency: int) -> list[Cycle]:
    cwd = Path(tempfile.mkdtemp(prefix="soak-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATPIPE_")}
    env |= {"CHATPIPE_MAX_CONCURRENT_REQUESTS": "{}", "CHATPIPE_USER_REQUESTS_PER_MINUTE":
            "100000", "CHATPIPE_ORG_REQUESTS_PER_MINUTE": "100000",
            "CHATPIPE_USER_TOKENS_PER_MINUTE": "1000000000",
            "CHATPIPE_ORG_TOKENS_PER_MINUTE": "1000000000"}  # fmt: skip
    chatpipe = Path(sys.executable).parent / "chatpipe"
    with (cwd / "chatpipe-up.log").open("wb") as log:
        up = await asyncio.create_subprocess_exec(
            str(chatpipe), "up", "--engine", "sim", "--port", str(free_port()), cwd=cwd,
            env=env, stdout=asyncio.subprocess.PIPE, stderr=log, start_new_session=True,
        )  # fmt: skip
    try:
        assert up.stdout is not None
        started = UP_LINE.search((await asyncio.wait_for(up.stdout.readline(), 180)).decode())
        assert started, "chatpipe up did not start"
        main = psutil.Process(up.pid)

        def broker() -> psutil.Process:  # a new one after a restart
            return next(c for c in main.children(recursive=True)
                        if "--storage-engine" in c.cmdline())  # fmt: skip

        headers = {"Authorization": f"Bearer {started['key']}"}
        cycles: list[Cycle] = []
        rng = random.Random(7)
        async with httpx.AsyncClient(base_url=started["url"], headers=headers,
                                     timeout=120) as client:  # fmt: skip
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            deadline = time.monotonic() + minutes * 60
            while time.monotonic() < deadline:
                cycle = Cycle(len(cycles))
                broker_before = broker().pid
                await load(client, cycle, load_s, concurrency, model, rng)
                await asyncio.sleep(SETTLE_S)
                broker_cpu, main_cpu = await asyncio.to_thread(
                    idle_cpu, [broker(), main], max(1.0, idle_s - SETTLE_S - 3)
                )
                cycle.broker_idle_cpu, cycle.chatpipe_idle_cpu = broker_cpu, main_cpu
                cycle.answer_s = await timed_answer(client)
                cycle.broker_restarted = broker().pid != broker_before
                cycles.append(cycle)
                print(cycle, flush=True)
        return cycles
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(up.pid, signal.SIGTERM)
        await asyncio.wait_for(up.wait(), 60)


def markdown(cycles: list[Cycle], args: argparse.Namespace, when: str) -> str:
    command = (
        f".venv/bin/python -m bench soak --minutes {args.minutes:g} --load-s "
        f"{args.load_s:g} --idle-s {args.idle_s:g} --concurrency {args.concurrency}"
    )
    lines = [
        BEGIN, "## Soak: mixed load for tens of minutes", "", "```sh", command, "```", "",
        f"Run on {when}: `chatpipe up --engine sim`, {len(cycles)} cycles of "
        f"{args.load_s:g} s of mixed load ({args.concurrency} users at once) then "
        f"{args.idle_s:g} s idle. Idle CPU is a share of one core, sampled in the idle "
        "window; the answer is one 60-token native answer timed in it. A cycle is "
        f"flagged above {SPIN_CPU:g} of a core idle or {SLOW_ANSWER_S:g} s for the answer.",
        "",
        "| cycle | requests | failed | broker idle CPU | chatpipe idle CPU | 60-token answer s "
        "| broker restarted | flagged |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for c in cycles:
        failed = f"{c.failed} {c.failures}" if c.failures else "0"
        lines.append(f"| {c.index} | {c.requests} | {failed} | {c.broker_idle_cpu:.3f} | "
                     f"{c.chatpipe_idle_cpu:.3f} | {c.answer_s:.2f} | "
                     f"{'yes' if c.broker_restarted else ''} | "
                     f"{'yes' if c.flagged else ''} |")  # fmt: skip
    answers = [c.answer_s for c in cycles]
    flagged = sum(c.flagged for c in cycles)
    lines += [
        "",
        f"Answers: median {statistics.median(answers):.2f} s, max {max(answers):.2f} s; "
        f"flagged cycles: {flagged} of {len(cycles)}.",
        "",
        END,
    ]
    return "\n".join(lines)


def cli(argv: list[str], out: Path) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench soak")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--load-s", type=float, default=50.0)
    parser.add_argument("--idle-s", type=float, default=40.0)
    parser.add_argument("--concurrency", type=int, default=12)
    args = parser.parse_args(argv)
    cycles = asyncio.run(soak(args.minutes, args.load_s, args.idle_s, args.concurrency))
    report = markdown(cycles, args, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    write(report, out / "RESULTS.md", BEGIN, END)
    print(report)

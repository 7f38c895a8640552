"""What retrieval adds to time to first token: the same native turn with and
without `file_ids`, through the whole pipeline (sim engine, the bundled
all-MiniLM-L6-v2), one request at a time, the two kinds interleaved.

    .venv/bin/python -m bench retrieval [--corpora 40,400] [--requests 20] [--no-write]

For each corpus (about that many chunks, in 4 files) it records the upload (embedding
throughput), the gateway's search alone (`Documents.search`: the query's embedding,
the chunk read and the ranking), TTFT and prompt tokens of both kinds of turn, and
the TTFT of turns without files while another file of that size is being embedded.
The sim engine prefills at `sim_prompt_tokens_per_s` (5,000 tokens/s by default), so
the longer prompt's prefill is in the TTFT too, as it would be on a real engine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.faults import write
from bench.overload import percentile
from bench.report import machine
from chatpipe.dev_stack import API_KEY, running_sim_stack, stack_settings
from chatpipe.wiring import Stack
from schemas.sse import read_messages
from workers.sim_engine import WORDS

BEGIN = "<!-- written by python -m bench retrieval: begin -->"
END = "<!-- written by python -m bench retrieval: end -->"
FILES = 4
PARAGRAPH_WORDS = 60  # ~330 characters: two paragraphs to an 800-character chunk


@dataclass
class Corpus:
    chunks: int
    upload_s: float
    search_ms: list[float]
    ttft_plain: list[float]
    ttft_grounded: list[float]
    prompt_plain: int
    prompt_grounded: int
    ttft_during_upload: list[float]


def documents(chunks: int, rng: random.Random) -> list[bytes]:
    """`FILES` texts of random paragraphs, about `chunks` chunks in all."""
    per_file = max(1, chunks * 2 // FILES)
    return [
        "\n\n".join(
            " ".join(rng.choice(WORDS) for _ in range(PARAGRAPH_WORDS)) + "."
            for _ in range(per_file)
        ).encode()
        for _ in range(FILES)
    ]


async def turn(client: httpx.AsyncClient, question: str, file_ids: list[str]) -> tuple[float, int]:
    """(TTFT in seconds, prompt tokens) of one turn in a new conversation."""
    cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
    body = {"content": f"[[sim:length=8]] {question}", "max_tokens": 16, "file_ids": file_ids}
    started = time.monotonic()
    async with client.stream("POST", f"/v1/conversations/{cid}/messages", json=body) as response:
        events = await read_messages(response.aiter_lines())
    first = next((e.at for e in events if e.event == "delta"), None)
    done = next((e.json() for e in events if e.event == "done"), None)
    if first is None or done is None:
        raise RuntimeError(f"a turn did not answer: {[(e.event, e.data) for e in events]}")
    return first - started, done["usage"]["prompt_tokens"]


async def measure(stack: Stack, client: httpx.AsyncClient, chunks: int, requests: int,
                  rng: random.Random) -> Corpus:  # fmt: skip
    started = time.monotonic()
    ids = [
        await upload(client, f"doc{i}.txt", data) for i, data in enumerate(documents(chunks, rng))
    ]
    upload_s = time.monotonic() - started
    files = [await stack.store.get_file(f["id"]) for f in ids]
    search = stack.gateway.state.deps.documents.search
    result = Corpus(sum(f["chunks"] for f in ids), upload_s, [], [], [], 0, 0, [])
    await turn(client, "warm up", [f["id"] for f in ids])
    for _ in range(requests):
        question = " ".join(rng.choice(WORDS) for _ in range(12)) + "?"
        t0 = time.perf_counter()
        await search(files, question)
        result.search_ms.append((time.perf_counter() - t0) * 1000)
        ttft, result.prompt_plain = await turn(client, question, [])
        result.ttft_plain.append(ttft)
        ttft, result.prompt_grounded = await turn(client, question, [f["id"] for f in ids])
        result.ttft_grounded.append(ttft)
    result.ttft_during_upload = await turns_during_upload(client, chunks, requests, rng)
    return result


async def upload(client: httpx.AsyncClient, name: str, data: bytes) -> dict:
    response = await client.post(
        "/v1/files", data={"purpose": "assistants"}, files={"file": (name, data, "text/plain")}
    )
    response.raise_for_status()
    return response.json()


async def turns_during_upload(client: httpx.AsyncClient, chunks: int, requests: int,
                              rng: random.Random) -> list[float]:  # fmt: skip
    """TTFTs of turns without files while a file of `chunks` chunks is embedded."""
    data = b"\n\n".join(documents(chunks, rng))
    uploading = asyncio.create_task(upload(client, "big.txt", data))
    ttfts: list[float] = []
    while not uploading.done() and len(ttfts) < requests:
        ttfts.append((await turn(client, "while a file is embedded", []))[0])
    await uploading
    return ttfts


async def run(corpora: list[int], requests: int) -> list[Corpus]:
    settings = stack_settings(
        Path(tempfile.mkdtemp(prefix="retrieval-bench-")),
        engine="sim",
        sim_tokens_per_s=200.0,
        max_slots=4,
        auto_titles=False,
        user_requests_per_minute=1_000_000,
        org_requests_per_minute=1_000_000,
        user_tokens_per_minute=1_000_000_000,
        org_tokens_per_minute=1_000_000_000,
    )
    rng = random.Random(16)
    async with running_sim_stack(settings) as stack, httpx.AsyncClient(
            base_url=stack.base_url, headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=300) as client:  # fmt: skip
        await turn(client, "warm up", [])
        return [await measure(stack, client, chunks, requests, rng) for chunks in corpora]


def ms(values: list[float], q: float, scale: float = 1000.0) -> str:
    return f"{percentile(values, q) * scale:.0f}"


def markdown(results: list[Corpus], command: str, host: dict[str, str], requests: int) -> str:
    lines = [
        BEGIN,
        "## What retrieval adds to time to first token",
        "",
        f"Command: `{command}` (bench/retrieval.py). Run {host['date']}, {host['nproc']} "
        f"cores ({host['cpu']}), load average {host['loadavg']} at the end, commit "
        f"{host['commit']}. Sim engine (200 tokens/s, prefill 5,000 prompt tokens/s), "
        f"{requests} turns of each kind per corpus, one at a time, interleaved; each "
        "in a new conversation; top 4 chunks of 800 characters.",
        "",
        "| chunks searched | upload (s, chunks/s) | search p50 / p90 ms | TTFT p50 / p90 ms "
        "without files | with files | added at p50 | prompt tokens without / with | "
        "TTFT p50 / p90 ms without files, during an upload (turns) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        added = (percentile(r.ttft_grounded, 0.5) - percentile(r.ttft_plain, 0.5)) * 1000
        lines.append(
            f"| {r.chunks} | {r.upload_s:.1f} ({r.chunks / r.upload_s:.0f}/s) | "
            f"{ms(r.search_ms, 0.5, 1)} / {ms(r.search_ms, 0.9, 1)} | "
            f"{ms(r.ttft_plain, 0.5)} / {ms(r.ttft_plain, 0.9)} | "
            f"{ms(r.ttft_grounded, 0.5)} / {ms(r.ttft_grounded, 0.9)} | {added:+.0f} | "
            f"{r.prompt_plain} / {r.prompt_grounded} | {ms(r.ttft_during_upload, 0.5)} / "
            f"{ms(r.ttft_during_upload, 0.9)} ({len(r.ttft_during_upload)}) |"
        )
    return "\n".join([*lines, "", END])


def cli(argv: list[str], out: Path) -> None:
    """`python -m bench retrieval [options]`: measure, write RESULTS.md's section."""
    parser = argparse.ArgumentParser(prog="python -m bench retrieval")
    parser.add_argument("--corpora", default="40,400", help="chunks per corpus, comma-separated")
    parser.add_argument("--requests", type=int, default=20, help="turns of each kind per corpus")
    parser.add_argument("--out", type=Path, default=out, help="where RESULTS.md is")
    parser.add_argument("--no-write", action="store_true", help="print the section only")
    args = parser.parse_args(argv)
    corpora = [int(n) for n in args.corpora.split(",") if n]
    results = asyncio.run(run(corpora, args.requests))
    command = shlex.join([".venv/bin/python", "-m", "bench", "retrieval", *argv])
    report = markdown(results, command, machine(), args.requests)
    if not args.no_write:
        write(report, args.out / "RESULTS.md", BEGIN, END)
    print(report)

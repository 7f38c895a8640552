"""What output safety costs: classifier time per chunk, and the time to
first token that a hold-back window adds.

    .venv/bin/python -m bench.safety_cost
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path

import httpx

from bench.overload import percentile
from chatpipe.dev_stack import API_KEY, running_sim_stack, stack_settings
from chatpipe.settings import Settings
from moderation.classifiers import Classifier, EmbeddingClassifier, RuleClassifier
from schemas.sse import read_messages
from workers.sim_engine import WORDS

CHUNKS = 300
REQUESTS = 20


def chunk_texts() -> list[str]:
    """What the stage classifies per chunk: 64 characters of overlap + a ~50 ms chunk."""
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(25)) for _ in range(CHUNKS)]


async def classifier_latency() -> list[str]:
    settings = Settings()
    from common.embeddings import SentenceEmbedder

    classifiers: dict[str, Classifier] = {
        "rules (3 categories + PII)": RuleClassifier(
            settings.safety.rule_categories, settings.safety.output_pii
        ),
        "embedding (all-MiniLM-L6-v2)": EmbeddingClassifier(
            SentenceEmbedder(),
            settings.safety.embedding_exemplars,
            settings.safety.embedding_threshold,
        ),
    }
    rows = []
    for name, classifier in classifiers.items():
        times = []
        for text in chunk_texts():
            started = time.perf_counter()
            await classifier.classify(text)
            times.append(time.perf_counter() - started)
        rows.append(
            f"| {name} | {percentile(times, 0.5) * 1000:.3f} | "
            f"{percentile(times, 0.99) * 1000:.3f} |"
        )
    return rows


async def ttft_with_window(window_chars: int) -> float:
    tmp = Path(tempfile.mkdtemp(prefix="safety-"))
    settings = stack_settings(
        tmp,
        engine="sim",
        sim_tokens_per_s=50.0,
        auto_titles=False,
        safety_window_chars=window_chars,
        max_slots=4,
        sim_prompt_tokens_per_s=1e6,
    )
    ttfts = []
    async with (
        running_sim_stack(settings) as stack,
        httpx.AsyncClient(
            base_url=stack.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60
        ) as client,
    ):
        for _ in range(REQUESTS):
            cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
            started = time.monotonic()
            async with client.stream(
                "POST",
                f"/v1/conversations/{cid}/messages",
                json={"content": "hi", "max_tokens": 40, "ignore_eos": True},
            ) as response:
                events = await read_messages(response.aiter_lines())
            ttfts.append(next(e.at for e in events if e.event == "delta") - started)
    return percentile(ttfts, 0.5)


async def run() -> str:
    lines = ["| classifier | ms per chunk p50 | p99 |", "|---|---|---|"]
    lines += await classifier_latency()
    base = await ttft_with_window(0)
    windowed = await ttft_with_window(64)
    lines += [
        "",
        "| window | TTFT p50 ms (sim engine, 50 tokens/s, ~5 characters a token) |",
        "|---|---|",
        f"| 0 characters | {base * 1000:.0f} |",
        f"| 64 characters | {windowed * 1000:.0f} |",
        "",
        f"- the 64-character window added {(windowed - base) * 1000:.0f} ms to TTFT p50",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(asyncio.run(run()))

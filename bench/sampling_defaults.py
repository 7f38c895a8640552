"""`python -m bench sampling_defaults`: how the default model answers under a few sampling
settings, to choose the defaults its `generation_config.json` carries.

Each setting answers a fixed set of short chat prompts (twice, with two seeds) in vLLM's
engine in this process, the model's own sampling defaults switched off
(`generation_config="vllm"`): how many answers end by themselves within `--max-tokens`
(greedy decoding loops on a model this small), the mean log probability of their
tokens, and how often "What is the capital of France?" is answered with Paris.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from workers.config import DEFAULT_MODEL_DIR

PROMPTS = (
    "Say hello in one short sentence.", "What is the capital of France?",
    "Write a haiku about the sea.", "Explain what a Kafka topic is in two sentences.",
    "Give me three tips for sleeping better.", "hello", "What is 12 times 7?",
    "Translate 'good morning' into Spanish.", "Write a short poem about autumn.",
    "What are the benefits of drinking water?", "Summarize the plot of Romeo and Juliet.",
    "How do I boil an egg?", "Tell me a joke.", "What is photosynthesis?",
    "Suggest a name for a pet cat.", "Why is the sky blue?",
    "Write a Python function that adds two numbers.", "What should I pack for a weekend trip?",
    "Describe a sunset in one paragraph.", "What is machine learning?",
    "List the days of the week.", "How can I be more productive?", "Who wrote Hamlet?",
    "Give me a recipe for pancakes.",
)  # fmt: skip
SETTINGS: tuple[dict[str, Any], ...] = (
    {"temperature": 0.0},
    {"temperature": 0.2, "top_p": 0.9},
    {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1},
    {"temperature": 0.2, "top_p": 0.9, "frequency_penalty": 0.5},
    {"temperature": 0.7, "top_p": 0.9, "frequency_penalty": 0.5},
)
SEEDS = (1, 2)
CAPITAL_ASKED = 24


def measure(model: Path, max_tokens: int) -> list[dict[str, Any]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model), kv_cache_memory_bytes=1 << 30, generation_config="vllm")
    chats: list[Any] = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    capital: list[Any] = [[{"role": "user", "content": "What is the capital of France?"}]]
    capital *= CAPITAL_ASKED
    rows = []
    for setting in SETTINGS:
        ended, means = 0, []
        for seed in SEEDS:
            params = SamplingParams(max_tokens=max_tokens, logprobs=0, seed=seed, **setting)
            for out in llm.chat(chats, params, use_tqdm=False):
                answer = out.outputs[0]
                ended += answer.finish_reason == "stop"
                chosen = [next(iter(step.values())).logprob for step in answer.logprobs or ()]
                means.append(sum(chosen) / max(1, len(chosen)))
        asked = llm.chat(capital, SamplingParams(max_tokens=60, **setting), use_tqdm=False)
        rows.append({
            "setting": setting,
            "ended": ended,
            "answers": len(chats) * len(SEEDS),
            "mean_logprob": statistics.mean(means),
            "paris": sum("Paris" in out.outputs[0].text for out in asked),
        })  # fmt: skip
    return rows


def markdown(rows: list[dict[str, Any]], command: str, max_tokens: int) -> str:
    lines = [
        f"```sh\n{command}\n```\n",
        f"| setting | ended by itself (of {rows[0]['answers']}, {max_tokens} tokens at most) "
        f"| mean token log probability | Paris (of {CAPITAL_ASKED}) |",
        "|---|---|---|---|",
    ]
    for row in rows:
        setting = ", ".join(f"{k} {v:g}" for k, v in row["setting"].items())
        lines.append(f"| {setting} | {row['ended']} | {row['mean_logprob']:.2f} | {row['paris']} |")
    return "\n".join(lines) + "\n"


def cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench sampling_defaults", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--max-tokens", type=int, default=400)
    args = parser.parse_args(argv)
    command = " ".join([".venv/bin/python", "-m", "bench", "sampling_defaults", *argv])
    print(markdown(measure(args.model, args.max_tokens), command, args.max_tokens))

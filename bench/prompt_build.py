"""`python -m bench prompt_build`: what building a growing conversation's prompt costs a
process, turn by turn.

The gateway counts each turn's prompt and the worker builds it (`common.prompt`), and
every turn carries the whole history. A process keeps the tokens of the texts it
encoded last, so a turn it sees after the one before encodes only the answer before it
and the new message. This times, per turn of a 10-turn conversation (500-token answers,
as `bench seed` holds): the prompt built with every text new to the process, the same
with the turns before seen (a worker that ran them, a gateway that counted them), and
one chat-template render and encode of the whole history (what vLLM's server does for
each request). Median of `--repeat` builds, one core, in this process.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.seed import follow_up, opening
from common.prompt import prompt_token_ids, text_ids
from workers.config import DEFAULT_MODEL_DIR


def conversation(tokenizer: Any, turns: int, answer_tokens: int) -> list[dict[str, str]]:
    """A conversation of `turns` user turns, each but the last answered by text of about
    `answer_tokens` tokens (random ids of the vocabulary, decoded: a random-weight
    model's answers look alike)."""
    rng = random.Random(0)
    messages = [{"role": "user", "content": opening(0)}]
    for turn in range(turns - 1):
        ids = [rng.randrange(300, tokenizer.vocab_size) for _ in range(answer_tokens)]
        messages.append({"role": "assistant", "content": tokenizer.decode(ids)})
        messages.append({"role": "user", "content": follow_up(turn)})
    return messages


def timed_ms(build: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    started = time.perf_counter()
    build(*args, **kwargs)
    return (time.perf_counter() - started) * 1000


def renewed(history: list[dict[str, str]], mark: int) -> list[dict[str, str]]:
    """`history` with its newest two messages (the answer before, the new question) made
    texts no process has encoded yet."""
    fresh = [{**m, "content": f"{m['content']} ({mark})"} for m in history[-2:]]
    return [*history[:-2], *fresh]


def run(model: Path, turns: int, answer_tokens: int, repeat: int) -> list[dict[str, float]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    messages = conversation(tokenizer, turns, answer_tokens)
    seen = copy.deepcopy(tokenizer)  # the process that built every turn before
    rows = []
    for turn in range(1, turns + 1):
        history = messages[: 2 * turn - 1]
        new, warm, render = [], [], []
        for mark in range(repeat):
            fresh = copy.deepcopy(tokenizer)
            text_ids(fresh, " ")  # its added-token guard, made once per tokenizer
            new.append(timed_ms(prompt_token_ids, fresh, history))
            if turn > 1:
                prompt_token_ids(seen, history[:-2])  # the turn before, as it ran
            warm.append(timed_ms(prompt_token_ids, seen, renewed(history, mark)))
            render.append(
                timed_ms(
                    tokenizer.apply_chat_template,
                    history,
                    tokenize=True,
                    add_generation_prompt=True,
                )
            )
        rows.append(
            {
                "turn": turn,
                "prompt tokens": len(prompt_token_ids(tokenizer, history)),
                "every text new": statistics.median(new),
                "turns before seen": statistics.median(warm),
                "one render and encode": statistics.median(render),
            }
        )
    return rows


def markdown(rows: list[dict[str, float]], command: str) -> str:
    columns = [
        "turn",
        "prompt tokens",
        "every text new",
        "turns before seen",
        "one render and encode",
    ]
    lines = [
        f"```sh\n{command}\n```\n",
        "Milliseconds to build one turn's prompt (median):\n",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for row in rows:
        cells = [f"{row['turn']:.0f}", f"{row['prompt tokens']:.0f}"]
        cells += [f"{row[c]:.1f}" for c in columns[2:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench prompt_build", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--answer-tokens", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    if args.model == DEFAULT_MODEL_DIR:
        from chatpipe.default_model import build_default_model

        build_default_model(args.model)
    rows = run(args.model, args.turns, args.answer_tokens, args.repeat)
    command = " ".join([".venv/bin/python", "-m", "bench", "prompt_build", *argv])
    print(markdown(rows, command))

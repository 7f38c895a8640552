"""The seed benchmark's pure parts: its conversations, its verdicts and its report block."""

from __future__ import annotations

import orjson
import pytest

from bench.metrics import LevelStats
from bench.processes import Placement
from bench.seed import BEGIN, END, Conversations, merged, met, ratios, turn_body


def stats(tokens_per_s: float, ttft_ms: float, itl_ms: float) -> LevelStats:
    return LevelStats(
        side="x",
        concurrency=1,
        requests=1,
        completed=1,
        wall_s=1.0,
        tokens=int(tokens_per_s),
        ttft_ms=(ttft_ms, ttft_ms),
        itl_ms=(itl_ms, itl_ms),
        tpot_ms=(itl_ms, itl_ms),
        chunk_gap_ms=(itl_ms, itl_ms),
        tokens_per_chunk=1.0,
        unmatched=0,
        errors={},
    )


def test_a_turn_carries_the_whole_history_and_a_fixed_length():
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "more"},
    ]
    body = orjson.loads(turn_body("tiny-random", history, 500))
    assert body["messages"] == history
    assert (body["max_tokens"], body["ignore_eos"], body["stream"]) == (500, True, True)


def test_the_workload_names_turns_for_every_level():
    with pytest.raises(ValueError, match="one number of turns per level"):
        Conversations(levels=(1, 8), turns=(10,))


def test_verdicts_hold_chatpipe_to_each_target():
    theirs = stats(100.0, ttft_ms=50.0, itl_ms=10.0)
    good = ratios(stats(98.0, ttft_ms=74.0, itl_ms=10.4), theirs)
    assert good == pytest.approx({"tokens/s": 0.98, "ITL p50": 1.04, "TTFT p50 (ms)": 24.0})
    assert all(met(k, v) for k, v in good.items())
    bad = ratios(stats(96.0, ttft_ms=76.0, itl_ms=10.6), theirs)
    assert [k for k, v in bad.items() if not met(k, v)] == ["tokens/s", "ITL p50", "TTFT p50 (ms)"]


def test_the_report_block_replaces_the_last_and_keeps_the_rest():
    first = merged("# Results\n\nother section\n", "run one")
    assert first.startswith("# Results\n\nother section\n\n" + BEGIN)
    again = merged(first + "\n## later section\n", "run two")
    assert "run one" not in again and "run two" in again
    assert again.count(BEGIN) == again.count(END) == 1
    assert again.endswith("## later section\n")


def test_pinning_runs_the_front_end_under_taskset_and_binds_the_engines_threads():
    pinned = Placement(engine_cpus=frozenset({0}), front_cpus=frozenset({1}))
    assert pinned.front_argv(["chatpipe", "up"]) == ["taskset", "--cpu-list", "1", "chatpipe", "up"]
    assert pinned.env() == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    unpinned = Placement()
    assert (unpinned.front_argv(["x"]), unpinned.env(), unpinned.pinned) == (["x"], {}, False)

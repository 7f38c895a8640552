"""`python -m bench` rewrites its own part of bench/RESULTS.md and keeps the rest; its
hop table shows the answer's end and what the broker's floor leaves of vLLM's tokens/s."""

from pathlib import Path

from bench.compare import CHATPIPE, VLLM, Level, SideRun, Workload
from bench.cpu import CpuUse
from bench.hops import END_HOPS, HOPS
from bench.metrics import LevelStats
from bench.processes import EngineConfig
from bench.report import BEGIN, END, BenchRun, _hops, _merged


def test_a_new_file_holds_only_the_run(tmp_path):
    path = tmp_path / "RESULTS.md"
    assert _merged(path, "# run 1\n") == f"{BEGIN}\n# run 1\n{END}\n"


def test_sections_other_benchmarks_recorded_survive_a_new_run(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(_merged(path, "# run 1\nold numbers\n") + "\n## Overload\nkept\n")
    merged = _merged(path, "# run 2\nnew numbers\n")
    assert "old numbers" not in merged and "new numbers" in merged
    assert merged.endswith(f"{END}\n\n## Overload\nkept\n")


def test_a_file_without_markers_is_replaced(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# hand-written\n")
    assert _merged(path, "# run\n") == f"{BEGIN}\n# run\n{END}\n"


def _level(side, concurrency, completed, wall_s, tokens, hops=None):
    nan2 = (float("nan"), float("nan"))
    stats = LevelStats(
        side,
        concurrency,
        completed,
        completed,
        wall_s,
        tokens,
        (5.0, 6.0),
        nan2,
        nan2,
        nan2,
        1.0,
        0,
        {},
    )
    return Level(stats, {}, CpuUse(wall_s, {}, 0.0, 0.0), hops)


def _run(hop_ms):
    hops = {hop: (3.0, 4.0) for hop in (*HOPS, *END_HOPS)}
    vllm = SideRun(VLLM, 1.0, [_level(VLLM, 1, 8, 0.8, 1024), _level(VLLM, 8, 32, 1.6, 4096)])
    chatpipe = SideRun(
        CHATPIPE,
        1.0,
        [_level(CHATPIPE, 1, 8, 1.2, 1024, hops), _level(CHATPIPE, 8, 32, 2.0, 4096, hops)],
        fetch_delay_ms=(hop_ms, hop_ms * 2),
    )
    return BenchRun(
        "python -m bench",
        "today",
        {},
        EngineConfig(model=Path("tiny-random")),
        Workload(),
        [vllm, chatpipe],
    )


def test_the_broker_floor_caps_a_closed_loop_by_six_fetches_per_request():
    """A request of 100 ms on vLLM (8 in 0.8 s, one at a time) takes at least 100 + 6 × 5 ms
    through chatpipe: at most 100 / 130 of vLLM's tokens/s, whatever the stages cost."""
    text = _hops(_run(5.0))
    assert "| 1 | 100 | 30 | 0.77× | 0.67× |" in text
    assert "| 8 | 400 | 30 | 0.93× | 0.80× |" in text  # 8 clients × 1.6 s / 32 requests


def test_the_hop_table_shows_the_answers_end():
    text = _hops(_run(5.0))
    assert "| safety, done | gateway out, done |" in text
    assert text.count("| 3 / 4 ") == 2 * 7

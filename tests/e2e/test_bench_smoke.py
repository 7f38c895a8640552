"""The benchmark harness, in miniature, so it cannot rot: `python -m bench smoke`.

Sim engine, two small closed-loop levels, a few hang-ups and one capacity level,
through real processes (broker, `chatpipe up`, single stages). No thresholds:
the numbers must only be sane and complete.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_smoke_produces_sane_numbers(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "smoke", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    max_tokens = results["workload"]["max_tokens"]

    [side] = results["sides"]
    assert side["name"] == "chatpipe"
    assert [lv["stats"]["concurrency"] for lv in side["levels"]] == [1, 4]
    for level in side["levels"]:
        stats = level["stats"]
        assert stats["requests"] >= 8
        assert stats["completed"] == stats["requests"], stats
        assert stats["tokens"] == stats["requests"] * max_tokens
        assert stats["unmatched"] == 0, "per-chunk token counts missing from chat.tokens"
        assert 0 < stats["ttft_ms"][0] <= stats["ttft_ms"][1] < 5000
        assert 0 < stats["itl_ms"][0] <= stats["itl_ms"][1]
        assert 0 < stats["tpot_ms"][0] <= stats["tpot_ms"][1]
        assert stats["tokens_per_chunk"] >= 1
        assert level["cpu"]["by_process"]["chatpipe-up"] > 0

    cancel = side["cancel"]
    assert cancel["disconnects"] == cancel["measured"] == cancel["aborted"] == 6
    assert cancel["cancels_sent"] == 6 and cancel["cancel_ms_median"] is not None
    assert 0 <= cancel["generated_after_median"] <= cancel["generated_after_max"] < 512
    assert 0 <= cancel["waste_median"] <= cancel["waste_max"] < 512

    [level] = results["capacity"]["levels"]
    assert level["completed"] == level["streams"] == 20
    assert level["tokens"] > 0 and level["chunks"] >= level["streams"]
    stages = {"gateway", "scheduler", "worker", "safety", "recorder", "broker"}
    assert stages <= set(level["cpu"]["by_process"])
    # The recorder, which nobody waits on, may store the level's answers after it.
    on_the_path = stages - {"recorder"}
    assert all(level["cpu"]["by_process"][stage] > 0 for stage in on_the_path)

    report = (tmp_path / "RESULTS.md").read_text()
    assert "python -m bench smoke" in report and "| 4 | chatpipe | 8/8 |" in report
    for plot in ("throughput.png", "latency.png", "capacity.png"):
        assert (tmp_path / plot).stat().st_size > 1000

"""The engine's own view of a level: vLLM's histograms read from a /metrics text."""

from __future__ import annotations

import pytest

from bench.engine_view import means_ms, totals


def exposition(ttft: tuple[float, float], queue: tuple[float, float]) -> str:
    """vLLM's histograms as its server writes them, split over two label sets."""
    lines = []
    for name, (total, count) in (
        ("vllm:time_to_first_token_seconds", ttft),
        ("vllm:request_queue_time_seconds", queue),
    ):
        lines += [f"# HELP {name} x", f"# TYPE {name} histogram"]
        for engine, share in (("0", 0.25), ("1", 0.75)):
            labels = f'engine="{engine}",model_name="tiny-random"'
            lines += [
                f'{name}_bucket{{{labels},le="+Inf"}} {count * share}',
                f"{name}_count{{{labels}}} {count * share}",
                f"{name}_sum{{{labels}}} {total * share}",
            ]
    lines += ["# TYPE chatpipe:other_seconds histogram", "chatpipe:other_seconds_sum 99"]
    return "\n".join(lines) + "\n"


def test_the_histograms_sum_over_every_label_set():
    read = totals(exposition(ttft=(3.0, 4), queue=(1.0, 4)))
    assert read.sums["ttft"] == pytest.approx(3.0)
    assert read.counts["ttft"] == pytest.approx(4)
    assert read.sums["prefill"] == 0.0  # not served: counts zero


def test_the_means_are_over_the_requests_between_two_reads():
    before = totals(exposition(ttft=(3.0, 4), queue=(1.0, 4)))
    after = totals(exposition(ttft=(5.0, 8), queue=(1.2, 8)))
    means = means_ms(before, after)
    assert means["ttft"] == pytest.approx(500.0)  # 2 s over 4 requests
    assert means["queue"] == pytest.approx(50.0)
    assert "prefill" not in means  # no request observed

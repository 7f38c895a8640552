"""The capacity model (bench/capacity_model.py): docs/CAPACITY.md is what it renders now,
its formulas give what a hand computation gives, and what it cites says what it claims."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from pathlib import Path

import pytest

from bench.capacity_inputs import Inputs
from bench.capacity_model import DOC, compute, main, render
from bench.capacity_sizes import record_bytes, request_event
from schemas.codec import decode
from schemas.events import GenerationRequest

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "RESULTS.md"


def test_the_doc_is_what_the_script_renders_now() -> None:
    assert DOC.read_text() == render(compute()), (
        "docs/CAPACITY.md is stale: run .venv/bin/python -m bench capacity_model --write"
    )


def _sections(markdown: str) -> dict[str, str]:
    """Each heading's title -> its text, up to the next heading of any level."""
    sections: dict[str, list[str]] = {}
    body: list[str] = []
    for line in markdown.splitlines():
        if line.startswith("#"):
            body = sections.setdefault(line.lstrip("#").strip(), [])
        else:
            body.append(line)
    return {title: "\n".join(lines) for title, lines in sections.items()}


def test_every_cited_results_section_says_what_the_input_quotes_once() -> None:
    sections = _sections(RESULTS.read_text())
    cited = [f for f in fields(Inputs) if f.metadata["quote"]]
    assert len(cited) >= 8
    for f in cited:
        section, quote = f.metadata["quote"]
        assert section in sections, f"bench/RESULTS.md has no section {section!r} ({f.name})"
        assert sections[section].count(quote) == 1, (
            f"bench/RESULTS.md's section {section!r} no longer says {quote!r} once ({f.name}): "
            "update bench/capacity_inputs.py, then python -m bench capacity_model --write"
        )


def test_a_citation_follows_its_section_not_its_line() -> None:
    text = "# A\n| 1 |\n## B (x)\nsaid here\n"
    assert _sections("intro\n\n" + text) == _sections(text) == {"A": "| 1 |", "B (x)": "said here"}


def test_the_seed_gives_about_1160_turns_and_580k_tokens_a_second() -> None:
    m = compute()
    assert m.line("turns/s").average == pytest.approx(1160, rel=0.01)
    assert m.line("output tokens/s").average == pytest.approx(580_000, rel=0.01)
    assert m.line("concurrent streams").average == pytest.approx(12_000, rel=0.05)
    assert m.line("turns/s").peak == pytest.approx(3 * 1157.407, rel=1e-6)


def test_gpus_at_peak_by_hand() -> None:
    i = Inputs()
    m = compute(i)
    peak_output = 10e6 * 10 / 86400 * 3 * 500  # 1,736,111 tokens/s
    peak_prompt = 10e6 * 10 / 86400 * 3 * (500 + 100 * 5.5 + 500 * 4.5)  # 3,300 per turn
    prefill = 0.4 * 1979e12 / (2 * 70.6e9)
    decode = 2242.99 / 4
    no_cache = math.ceil((peak_output / decode + peak_prompt / prefill) / 0.8 / 4) * 4
    cached = math.ceil((peak_output / decode + peak_prompt * 0.25 / prefill) / 0.8 / 4) * 4
    label = "Llama-3.1-70B FP8, TP 4"
    assert m.line(f"{label}: GPUs without prefix-cache hits").peak == no_cache == 6428
    assert m.line(f"{label}: GPUs with prefix-cache hits").peak == cached == 4512
    assert m.line(f"{label}: engine replicas = chatpipe workers").peak == no_cache / 4


def test_a_decode_only_load_needs_output_over_tokens_per_gpu_rounded_up() -> None:
    """No prompt tokens and no headroom: GPUs = ⌈tokens/s ÷ tokens/s per GPU⌉ (TP 1)."""
    i = replace(
        Inputs(),
        system_prompt_tokens=0,
        user_message_tokens=0,
        turns_per_conversation=1,
        gpu_target_load=1.0,
    )
    m = compute(i)
    peak_output = 10e6 / 86400 * 3 * 500
    assert m.line("Llama-3.1-8B FP8, TP 1: GPUs without prefix-cache hits").peak == (
        math.ceil(peak_output / 3400.4)
    )


def test_gateways_cassandra_and_kafka_by_hand() -> None:
    m = compute()
    peak_output, peak_streams = 1_736_111.1, 34_722.2
    assert (
        m.line("gateway replicas").peak
        == max(math.ceil(peak_streams / (2000 * 0.7)), math.ceil(peak_output / (40010 * 0.7)))
        == 62
    )
    writes = 3472.22 * (7 * 4 + 5) * 3
    assert m.line("replica writes/s").peak == pytest.approx(writes, rel=1e-4)
    per_turn = m.line("raw bytes stored per turn").average
    day_tb = 100e6 * per_turn * 0.5 * 3 / 1e12
    assert m.line("Cassandra storage per day").average == pytest.approx(day_tb)
    assert m.line("Cassandra nodes").average == math.ceil(day_tb * 365 / 2)
    produced = sum(t.peak_mb_s for t in m.topics)
    consumed = sum(t.peak_mb_s * t.readers_per_record for t in m.topics)
    partitions = sum(t.partitions * t.count for t in m.topics)
    assert (
        m.line("Kafka brokers").peak
        == max(
            3,
            math.ceil(max(produced * 3, consumed + produced * 2) / 250),
            math.ceil(partitions * 3 / 4000),
        )
        == 11
    )


def test_work_partitions_are_one_per_worker_and_tokens_carry_the_stream() -> None:
    m = compute()
    topics = {t.topic: t for t in m.topics}
    workers = m.line("Llama-3.1-70B FP8, TP 4: engine replicas = chatpipe workers").peak
    assert topics["chat.work"].partitions == workers
    assert topics["chat.tokens"].events_per_turn == 500 / 2.5 + 2  # chunks, attempt, done
    assert topics["chat.tokens"].partitions >= m.line("safety replicas").peak
    assert topics["chat.requests.<tier>"].count == 3


def test_request_sizes_are_real_encoded_events_that_grow_with_history() -> None:
    i = Inputs()
    first, tenth = request_event(1, i), request_event(10, i)
    assert isinstance(
        decode(GenerationRequest, tenth.model_dump_json().encode()), GenerationRequest
    )
    assert len(tenth.messages) == 1 + 9 * 2 + 1
    assert record_bytes(tenth, "k", i) - record_bytes(first, "k", i) >= 9 * (100 + 500) * 4


def test_write_regenerates_the_doc(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    doc = tmp_path / "docs" / "CAPACITY.md"
    main(["--write"], doc)
    assert doc.read_text() == render(compute())
    assert "## GPUs" in capsys.readouterr().out

"""The analytics queries over real Parquet files and DuckDB: a small day of events, some
of them read twice, and the answers they must give."""

from __future__ import annotations

from pathlib import Path

import pytest

from analytics.report import Period, plot_tokens_per_minute, render, report
from analytics.warehouse import Warehouse
from schemas import topics
from schemas.events import (
    GenerationDone,
    GenerationRequest,
    ModerationEvent,
    Usage,
    stream_fields,
)
from schemas.lifecycle import RequestStatus
from tests.support.analytics import T0, at, chunk, ingest, request, usage


def done(
    req: GenerationRequest,
    seq: int,
    status: RequestStatus,
    attempt: int = 0,
) -> GenerationDone:
    fields = stream_fields(req.model_copy(update={"attempt": attempt}), seq)
    return GenerationDone(**fields, status=status, usage=Usage())


A = request("a", "pro", "acme", T0)  # answered; TTFT 200 ms
B = request("b", "free", "globex", T0 + 10)  # worker died; attempt 1 finished; TTFT 500 ms
C = request("c", "free", "globex", T0 + 20)  # cancelled while queued: no usage, no chunk
D = request("d", "pro", "acme", T0 + 30)  # retracted by safety
OLD = request("old", "pro", "acme", T0 - 7200)  # before the period

DUPLICATED_USAGE = at(topics.USAGE, usage(A, 10, 20, T0 + 1), T0 + 1)
RECORDS = [
    at(topics.requests_topic("pro"), A, T0),
    at(topics.TOKENS, chunk(A, 0), T0 + 0.2),
    at(topics.TOKENS, chunk(A, 1), T0 + 0.4),
    at(topics.TOKENS, done(A, 2, RequestStatus.FINISHED_STOPPED), T0 + 1),
    DUPLICATED_USAGE,
    at(topics.requests_topic("free"), B, T0 + 10),
    at(topics.TOKENS, chunk(B, 0), T0 + 10.5),
    at(topics.USAGE, usage(B, 5, 3, T0 + 12, status=RequestStatus.FINISHED_ABORTED), T0 + 12),
    at(topics.TOKENS, chunk(B, 3, attempt=1), T0 + 13),
    at(topics.TOKENS, done(B, 4, RequestStatus.FINISHED_STOPPED, attempt=1), T0 + 14),
    at(topics.USAGE, usage(B, 8, 7, T0 + 14, attempt=1), T0 + 14),
    at(topics.requests_topic("free"), C, T0 + 20),
    at(topics.TOKENS, done(C, 0, RequestStatus.FINISHED_ABORTED), T0 + 21),
    at(topics.requests_topic("pro"), D, T0 + 30),
    at(topics.TOKENS, chunk(D, 0), T0 + 30.1),
    at(
        topics.MODERATION,
        ModerationEvent(
            request_id="d",
            conversation_id="c-d",
            action="retract",
            category="pii",
            reason="r",
            created_at=T0 + 31,
        ),
        T0 + 31,
    ),
    at(topics.TOKENS, done(D, 1, RequestStatus.FINISHED_FILTERED), T0 + 31),
    at(topics.USAGE, usage(D, 4, 6, T0 + 90), T0 + 90),
    at(
        topics.MODERATION,
        ModerationEvent(
            user_id="u-acme", action="block_input", category="pii", reason="r", created_at=T0 + 40
        ),
        T0 + 40,
    ),
    at(topics.requests_topic("pro"), OLD, T0 - 7200),
    at(topics.USAGE, usage(OLD, 1000, 1000, T0 - 7000), T0 - 7000),
]
PERIOD = Period(T0 - 60, T0 + 3600)


@pytest.fixture
def warehouse(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "parquet")


def test_the_answers_for_a_period(warehouse: Warehouse, tmp_path: Path) -> None:
    ingest(warehouse, RECORDS)
    with warehouse.connect(tmp_path / "analytics.duckdb") as con:
        answer = report(con, PERIOD)

    assert answer["totals"] == {
        "requests_served": 3,
        "usage_events": 4,
        "prompt_tokens": 10 + 5 + 8 + 4,
        "completion_tokens": 20 + 3 + 7 + 6,
        "cached_tokens": 4,
        "gpu_ms": 40.0,
        "requests": 4,
        "cancellations": 1,
        "retractions": 1,
        "blocked_inputs": 1,
    }
    assert answer["tokens"] == [
        {
            "tier": "free",
            "model": "tiny-random",
            "org_id": "globex",
            "requests": 1,
            "attempts": 2,
            "prompt_tokens": 13,
            "completion_tokens": 10,
            "cached_tokens": 2,
            "gpu_ms": 20.0,
        },
        {
            "tier": "pro",
            "model": "tiny-random",
            "org_id": "acme",
            "requests": 2,
            "attempts": 2,
            "prompt_tokens": 14,
            "completion_tokens": 26,
            "cached_tokens": 2,
            "gpu_ms": 20.0,
        },
    ]
    assert answer["requests"] == [
        {"tier": "free", "requests": 2, "cancellations": 1, "retractions": 0, "blocked_inputs": 0},
        {"tier": "pro", "requests": 2, "cancellations": 0, "retractions": 1, "blocked_inputs": 0},
        {
            "tier": "unknown",
            "requests": 0,
            "cancellations": 0,
            "retractions": 0,
            "blocked_inputs": 1,
        },
    ]
    ttft = {row["tier"]: row for row in answer["ttft_ms"]}
    assert (ttft["free"]["requests"], ttft["free"]["p50_ms"]) == (1, 500.0)
    assert (ttft["pro"]["requests"], ttft["pro"]["p50_ms"], ttft["pro"]["max_ms"]) == (
        2,
        150.0,
        200.0,
    )
    assert ttft["all"]["requests"] == 3 and ttft["all"]["p50_ms"] == 200.0
    minutes = {
        (row["minute"], row["tier"]): row["completion_tokens"]
        for row in answer["tokens_per_minute"]
    }
    assert sum(minutes.values()) == 36 and len({minute for minute, _ in minutes}) == 2
    text = render(answer)
    assert "tokens by tier, model and org" in text and "globex" in text


def test_records_read_again_count_once(warehouse: Warehouse) -> None:
    ingest(warehouse, RECORDS)
    with warehouse.connect() as con:
        first = report(con, PERIOD)
    ingest(warehouse, RECORDS)  # a redelivery: the same records, in a second flush
    sent_twice = [at(topics.USAGE, usage(A, 10, 20, T0 + 1), T0 + 1)]  # a new offset
    ingest(warehouse, sent_twice)
    with warehouse.connect() as con:
        again = report(con, PERIOD)
        assert con.execute(
            "SELECT count(*) FROM read_parquet(?)",
            [str(warehouse.data_dir / "usage" / "*.parquet")],
        ).fetchone() == (11,)
    assert again == first


def test_an_empty_warehouse_answers_zeros(warehouse: Warehouse, tmp_path: Path) -> None:
    with warehouse.connect() as con:
        answer = report(con, PERIOD)
    assert answer["totals"]["prompt_tokens"] == 0 and answer["totals"]["requests"] == 0
    assert answer["tokens"] == [] and answer["ttft_ms"] == []
    path = tmp_path / "empty.png"
    plot_tokens_per_minute(answer, path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_plot_is_a_png(warehouse: Warehouse, tmp_path: Path) -> None:
    ingest(warehouse, RECORDS)
    with warehouse.connect() as con:
        answer = report(con, PERIOD)
    path = tmp_path / "plots" / "tokens.png"
    plot_tokens_per_minute(answer, path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and path.stat().st_size > 5000


@pytest.mark.timeout(60)
def test_one_minute_of_usage_plots_at_once(warehouse: Warehouse, tmp_path: Path) -> None:
    ingest(warehouse, RECORDS[:5])  # request A only: one point per tier
    with warehouse.connect() as con:
        answer = report(con, PERIOD)
    assert len(answer["tokens_per_minute"]) == 1
    path = tmp_path / "one.png"
    plot_tokens_per_minute(answer, path)  # a lone point once asked for years of minute ticks
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

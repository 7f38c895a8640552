"""`chatpipe rollout report` over real Parquet files and DuckDB: two versions of an alias,
each with its own speed, regenerations, retractions and ratings."""

from __future__ import annotations

from pathlib import Path

from analytics.report import Period
from analytics.rollout_report import render, rollout_report
from analytics.warehouse import Warehouse
from schemas import topics
from schemas.events import FeedbackEvent, ModerationEvent
from schemas.lifecycle import RequestStatus
from tests.support.analytics import T0, at, chunk, ingest, request, usage


def aliased(
    request_id: str, version: str, when: float, conversation: str, parent: str, alias: str = "chat"
):
    return request(request_id, "pro", "acme", when).model_copy(
        update={
            "model": version,
            "alias": alias,
            "conversation_id": conversation,
            "parent_id": parent,
        }
    )


def rated(answer, rating: str, when: float) -> FeedbackEvent:
    return FeedbackEvent(
        message_id=answer.message_id,
        conversation_id=answer.conversation_id,
        request_id=answer.request_id,
        user_id="u",
        org_id="acme",
        model=answer.model,
        alias=answer.alias,
        rating=rating,
        created_at=when,
    )


A1 = aliased("a1", "v1", T0, "c1", "q1")  # TTFT 100 ms
A2 = aliased("a2", "v1", T0 + 5, "c1", "q1")  # a regeneration of q1: TTFT 300 ms
B1 = aliased("b1", "v2", T0 + 1, "c2", "q2")  # TTFT 50 ms, retracted
PLAIN = request("p", "pro", "acme", T0 + 2)  # no alias: not in the comparison
OTHER = aliased("o1", "v1", T0 + 3, "c3", "q3", alias="code")

RECORDS = [
    *(at(topics.requests_topic("pro"), r, r.created_at) for r in (A1, A2, B1, PLAIN, OTHER)),
    at(topics.TOKENS, chunk(A1, 0), T0 + 0.1),
    at(topics.TOKENS, chunk(A2, 0), T0 + 5.3),
    at(topics.TOKENS, chunk(B1, 0), T0 + 1.05),
    at(topics.USAGE, usage(A1, 5, 20, T0 + 1), T0 + 1),  # gpu_ms 10 each
    at(topics.USAGE, usage(A2, 5, 40, T0 + 6), T0 + 6),
    at(topics.USAGE, usage(B1, 5, 5, T0 + 2, status=RequestStatus.FINISHED_FILTERED), T0 + 2),
    at(
        topics.MODERATION,
        ModerationEvent(
            request_id="b1",
            conversation_id="c2",
            action="retract",
            category="pii",
            reason="r",
            created_at=T0 + 2,
        ),
        T0 + 2,
    ),
    at(topics.FEEDBACK, rated(A2, "up", T0 + 7), T0 + 7),
    at(topics.FEEDBACK, rated(A2, "up", T0 + 8), T0 + 8),
    at(topics.FEEDBACK, rated(B1, "down", T0 + 9), T0 + 9),
]
PERIOD = Period(T0 - 60, T0 + 3600)


def test_versions_side_by_side(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "parquet")
    ingest(warehouse, RECORDS)
    with warehouse.connect() as con:
        answer = rollout_report(con, PERIOD, "chat")

    assert answer["versions"] == [
        {
            "alias": "chat",
            "version": "v1",
            "requests": 2,
            "ttft_p50_ms": 200.0,
            "ttft_p90_ms": 280.0,
            "tokens_per_s": 3000.0,
            "retractions": 0,
            "regenerations": 1,
            "feedback_up": 2,
            "feedback_down": 0,
        },
        {
            "alias": "chat",
            "version": "v2",
            "requests": 1,
            "ttft_p50_ms": 50.0,
            "ttft_p90_ms": 50.0,
            "tokens_per_s": 500.0,
            "retractions": 1,
            "regenerations": 0,
            "feedback_up": 0,
            "feedback_down": 1,
        },
    ]
    text = render(answer)
    assert text.splitlines()[0].startswith("chatpipe rollout chat ")
    assert "ttft_p50_ms" in text and "feedback_down" in text


def test_every_alias_and_an_empty_period(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "parquet")
    ingest(warehouse, RECORDS)
    with warehouse.connect() as con:
        every = rollout_report(con, PERIOD)
        empty = rollout_report(con, Period(T0 + 7200, T0 + 9000), "chat")

    assert [(row["alias"], row["version"]) for row in every["versions"]] == [
        ("chat", "v1"),
        ("chat", "v2"),
        ("code", "v1"),
    ]
    assert empty["versions"] == [] and "(none)" in render(empty)

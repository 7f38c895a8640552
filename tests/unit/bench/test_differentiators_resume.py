"""The resume bench's pure parts: the gap across a gateway's death, the judgement of one
answer, and the figures."""

import asyncio

import httpx
import pytest

from bench.differentiators.resume import (
    Outcome,
    ResumeRequests,
    ResumeStats,
    first_difference,
    judged,
    resume_gap_s,
    summary,
)
from bench.watched_streams import Watched


@pytest.mark.parametrize(
    ("times", "resumed_at", "gap"),
    [
        ([1.0, 1.05, 1.1, 1.6, 1.65], 1.3, 0.5),  # the events straddle the resume request
        ([1.0, 1.1, 1.12, 1.6], 1.3, 0.48),  # a late event of the dead gateway still counts
        ([1.0, 1.1], None, None),  # never resumed
        ([1.0, 1.1], 1.3, None),  # nothing came after resuming
        ([1.6, 1.7], 1.3, None),  # nothing came before
        ([], 1.3, None),
    ],
)
def test_the_gap_runs_from_the_last_event_before_resuming_to_the_first_after(
    times, resumed_at, gap
):
    assert resume_gap_s(times, resumed_at) == pytest.approx(gap)


def resumed_answer(pieces: list[str], resumed_after: int, end_at: float = 9.0) -> Watched:
    """An answer whose first `resumed_after` pieces came at 1.0, 1.1, ... before the
    resume request at 2.0, the rest at 3.0, 3.1, ..."""
    deltas = [
        (i, text, 1.0 + i / 10 if i < resumed_after else 3.0 + (i - resumed_after) / 10)
        for i, text in enumerate(pieces)
    ]
    return Watched(
        conversation_id="c",
        ids={"request_id": "r1", "message_id": "m1"},
        deltas=deltas,
        end={"status": "finished_length"},
        end_event="done",
        connections=2,
        ended_at=end_at,
    )


def test_an_answer_resumed_whole_is_byte_exact_with_its_gap():
    seen = resumed_answer(["Hel", "lo", " wor", "ld"], resumed_after=2)
    outcome = judged(seen, 2.0, "Hello world", "Hello world")
    assert outcome.byte_exact and outcome.mismatch is None
    assert outcome.gap_s == pytest.approx(1.9)


@pytest.mark.parametrize(
    ("stored", "planned", "says"),
    [
        ("Hello  world", "Hello world", "stored answer"),
        ("Hello world", "Hello there world", "planned answer"),
        (None, "Hello world", "no stored answer"),
    ],
)
def test_an_answer_that_differs_says_where(stored, planned, says):
    seen = resumed_answer(["Hel", "lo", " wor", "ld"], resumed_after=2)
    outcome = judged(seen, 2.0, stored, planned)
    assert not outcome.byte_exact
    assert outcome.mismatch is not None and says in outcome.mismatch
    if stored is not None:
        assert "resumed at byte 5" in outcome.mismatch


def test_an_answer_that_never_resumed_or_never_ended_is_not_byte_exact():
    unresumed = resumed_answer(["Hello world"], resumed_after=1)
    unresumed.connections = 1
    assert not judged(unresumed, None, "Hello world", "Hello world").byte_exact
    cut = resumed_answer(["Hello", " world"], resumed_after=1)
    cut.end, cut.end_event = {"code": "stream_stalled"}, "error"
    outcome = judged(cut, 2.0, "Hello world", "Hello world")
    assert not outcome.byte_exact and "did not finish" in (outcome.mismatch or "")


def test_an_answer_that_ended_before_its_gateway_died_was_not_cut_and_is_not_counted():
    """An answer that ended on its only connection before the kill was never put to the
    test (a round's answer that started late, say); one the kill cut and that never
    resumed is counted, as a failure."""
    whole = resumed_answer(["Hello", " world"], resumed_after=2, end_at=1.5)
    whole.connections, whole.started_at = 1, 0.5
    outcome = judged(whole, None, "Hello world", "Hello world", killed_at=4.0)
    assert not outcome.cut and outcome.mismatch is not None
    assert "2.5 s before its gateway died" in outcome.mismatch
    assert "first piece came after 0.5 s" in outcome.mismatch
    killed_first = resumed_answer(["Hello"], resumed_after=1, end_at=1.5)
    killed_first.connections = 1
    assert judged(killed_first, None, "Hello", "Hello", killed_at=1.2).cut, "cut, unresumed"
    stats = summary(1, [Outcome(True, 0.3), outcome])
    assert (stats.streams, stats.byte_exact, len(stats.not_cut)) == (1, 1, 1)


def test_the_first_difference_names_the_byte_even_past_a_multibyte_character():
    assert first_difference("même", "même") is None
    assert str(first_difference("même texte", "même teste")).startswith("byte 8 of 11")
    assert str(first_difference("abc", "abcdef")).startswith("byte 3 of 3 expected / 6 got")


def test_the_figures_count_byte_exact_answers_and_take_percentiles_of_the_gaps():
    outcomes = [Outcome(True, 0.3), Outcome(True, 0.5), Outcome(False, None, "r9: no stored")]
    stats = summary(2, outcomes)
    assert (stats.kills, stats.streams, stats.byte_exact) == (2, 3, 2)
    assert stats.gap_ms_p50 == pytest.approx(400)
    assert stats.gap_ms_p99 == pytest.approx(498)
    assert stats.mismatches == ("r9: no stored",)


def test_the_lines_say_whether_every_answer_was_byte_exact():
    every = ResumeStats(kills=100, streams=400, byte_exact=400, gap_ms_p50=410, gap_ms_p99=790)
    [exact, kills, not_cut, gap] = every.lines()
    assert exact.endswith("| 400 / 400 (100 %) | 100 % | yes |")
    assert "| 100 |" in kills and "not counted) | 0 |" in not_cut
    assert "| 410 / 790 ms |" in gap
    short = ResumeStats(kills=1, streams=4, byte_exact=3, gap_ms_p50=None, gap_ms_p99=None)
    assert short.lines()[0].endswith("| 3 / 4 (75 %) | 100 % | no |")
    assert "| – / – ms |" in short.lines()[3]
    assert ResumeStats(0, 0, 0, None, None).lines()[0].endswith("| no |")


def test_only_a_request_to_resume_an_answer_is_noted_and_only_the_first():
    noted = ResumeRequests()

    async def send() -> None:
        await noted(httpx.Request("POST", "http://g/v1/conversations/c/messages"))
        await noted(httpx.Request("GET", "http://g/v1/conversations/c"))
        await noted(httpx.Request("GET", "http://g/v1/requests/r1/events"))
        first = noted.first_at["r1"]
        await noted(httpx.Request("GET", "http://g/v1/requests/r1/events"))
        assert noted.first_at["r1"] == first

    asyncio.run(send())
    assert list(noted.first_at) == ["r1"]

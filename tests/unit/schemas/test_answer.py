"""The one answer rule (schemas/answer.py): which stream events make up the answer."""

from __future__ import annotations

import pytest

from schemas.answer import AnswerLog, AnswerText
from schemas.events import (
    AttemptStarted,
    DeliveryDone,
    Delta,
    GenerationDone,
    GenerationError,
    Queued,
    Retract,
    TokenChunk,
    Usage,
)
from schemas.lifecycle import RequestStatus

BASE = dict(
    request_id="r",
    conversation_id="c",
    message_id="m",
    model="tiny-random",
    reply_to="chat.deliver.g",
)


def chunk(seq: int, text: str, attempt: int = 0) -> TokenChunk:
    return TokenChunk(
        **BASE, attempt=attempt, seq=seq, text=text, token_count=1, completion_tokens=seq + 1
    )


def done(seq: int, attempt: int = 0) -> GenerationDone:
    return GenerationDone(
        **BASE, attempt=attempt, seq=seq, status=RequestStatus.FINISHED_STOPPED, usage=Usage()
    )


def error(seq: int, attempt: int = 0) -> GenerationError:
    return GenerationError(**BASE, attempt=attempt, seq=seq, code="x", message="y")


def marker(attempt: int) -> AttemptStarted:
    return AttemptStarted(request_id="r", attempt=attempt, conversation_id="c", worker_id="w")


def text_of(events: list[object]) -> tuple[str, bool]:
    log = AnswerLog()
    kept = [e.text for e in events if log.take(e) and isinstance(e, TokenChunk)]
    return "".join(kept), log.ended


CASES = {
    "in order": ([chunk(0, "a"), chunk(1, "b"), done(2)], "ab", True),
    "redelivered chunks and end": (
        [chunk(0, "a"), chunk(0, "a"), chunk(1, "b"), chunk(0, "a"), done(2), done(2)],
        "ab",
        True,
    ),
    "continuation after a marker": (
        [marker(0), chunk(0, "a"), chunk(1, "b"), marker(1), chunk(2, "C", 1), done(3, 1)],
        "abC",
        True,
    ),
    "a fenced attempt adds nothing after its successor's marker": (
        [
            marker(0),
            chunk(0, "a"),
            marker(1),
            chunk(1, "zombie"),
            chunk(1, "B", 1),
            chunk(2, "zombie"),
            done(3),
            done(2, 1),
        ],
        "aB",
        True,
    ),
    "a newer attempt's chunk supersedes without a marker": (
        [chunk(0, "a"), chunk(1, "B", 1), chunk(2, "old")],
        "aB",
        False,
    ),
    "nothing after the end": ([chunk(0, "a"), error(1), chunk(1, "late"), done(2)], "a", True),
    "an end past a position nobody knew still ends it": (
        [chunk(0, "a"), error(1 << 30)],
        "a",
        True,
    ),
    "an empty answer": ([marker(0), done(0)], "", True),
    "open": ([chunk(0, "a")], "a", False),
}


@pytest.mark.parametrize("events,text,ended", CASES.values(), ids=CASES.keys())
def test_one_rule(events, text, ended):
    assert text_of(events) == (text, ended)


def test_positions_are_taken_in_increasing_order_only():
    log = AnswerLog()
    assert log.take(Delta(request_id="r", seq=3, text="x"))
    assert not log.take(Delta(request_id="r", seq=2, text="late"))
    assert log.take(Delta(request_id="r", seq=7, text="y")) and log.next_seq == 8


def test_events_without_a_position_never_move_it():
    log = AnswerLog()
    assert log.take(Queued(request_id="r", position=3)) and log.next_seq == 0
    assert log.take(
        DeliveryDone(request_id="r", seq=0, status=RequestStatus.FINISHED_STOPPED, usage=Usage())
    )
    assert not log.take(Queued(request_id="r", position=1)), "nothing after the end"


def test_answer_text_follows_deltas_and_a_retraction_replaces_it():
    text = AnswerText()
    for event in (
        Delta(request_id="r", seq=0, text="Hi "),
        Retract(request_id="r", seq=1, message_id="m", reason="pii", replacement="[removed]"),
        Delta(request_id="r", seq=2, text="more"),
    ):
        text.add(event)
    assert str(text) == "[removed]" and text.retracted

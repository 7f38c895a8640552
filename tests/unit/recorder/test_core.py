"""Recorder core: `chat.answers` events in, the answer to store out (the same rule the
gateway uses when it relays the end of a stream)."""

from __future__ import annotations

import pytest

from conversations.store import NewMessage
from recorder.core import Recorder
from schemas.events import (
    AnswerStarted,
    DeliveryDone,
    DeliveryError,
    Delta,
    Queued,
    Retract,
    Role,
    Routed,
    Usage,
)
from schemas.lifecycle import RequestStatus

STOPPED, FILTERED, ERROR = (
    RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_FILTERED, RequestStatus.FINISHED_ERROR,
)  # fmt: skip


def started(rid: str = "r1") -> AnswerStarted:
    return AnswerStarted(
        request_id=rid,
        conversation_id="c1",
        message_id=f"m-{rid}",
        parent_id="u1",
        user_id="u",
        model="big",
        reply_to="chat.deliver.gw",
    )


def delta(seq: int, text: str, rid: str = "r1") -> Delta:
    return Delta(request_id=rid, seq=seq, text=text)


def done(seq: int, rid: str = "r1", status=STOPPED, model: str | None = None) -> DeliveryDone:
    return DeliveryDone(
        request_id=rid,
        seq=seq,
        status=status,
        model=model,
        usage=Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=3),
    )


def error(seq: int, rid: str = "r1") -> DeliveryError:
    return DeliveryError(request_id=rid, seq=seq, code="engine", message="boom")


def retract(seq: int, rid: str = "r1") -> Retract:
    return Retract(
        request_id=rid, seq=seq, message_id=f"m-{rid}", reason="pii", replacement="[removed]"
    )


def feed(recorder: Recorder, events: list[object]) -> list[NewMessage]:
    out = []
    for offset, event in enumerate(events):
        message = recorder.on_event(event, offset=offset)
        if message is not None:
            out.append(message)
    return out


CASES = {
    "normal": ([started(), delta(0, "Hel"), delta(1, "lo"), done(2)], "Hello", STOPPED),
    "empty answer": ([started(), done(0)], "", STOPPED),
    "queue updates and duplicates": (
        [
            started(),
            Queued(request_id="r1", position=2),
            delta(0, "Hel"),
            delta(0, "Hel"),
            delta(1, "lo"),
            done(2),
            done(2),
        ],
        "Hello",
        STOPPED,
    ),
    "sparse ids (a held-back window)": ([started(), delta(3, "Hello"), done(5)], "Hello", STOPPED),
    "retracted: the replacement, never the text": (
        [started(), delta(0, "bob@"), retract(1), done(2, status=FILTERED)],
        "[removed]",
        FILTERED,
    ),
    "error keeps the text shown": ([started(), delta(0, "par"), error(1)], "par", ERROR),
}


@pytest.mark.parametrize("events,content,status", CASES.values(), ids=CASES.keys())
def test_answer_is_built_by_the_one_rule(events, content, status):
    [message] = feed(Recorder(), events)
    assert (message.content, message.status) == (content, status)
    assert (
        message.message_id,
        message.conversation_id,
        message.parent_id,
        message.role,
        message.request_id,
    ) == ("m-r1", "c1", "u1", Role.ASSISTANT, "r1")


def test_usage_and_the_model_that_answered_are_kept():
    [message] = feed(
        Recorder(),
        [
            started(),
            Routed(request_id="r1", model="small", requested_model="big", reason="saturated"),
            delta(0, "x"),
            done(1),
        ],
    )
    assert message.model == "small"
    assert (message.tokens, message.prompt_tokens, message.cached_tokens) == (2, 7, 3)
    [again] = feed(Recorder(), [started(), done(0, model="other")])
    assert again.model == "other"


def test_events_without_their_marker_are_ignored():
    assert feed(Recorder(), [delta(0, "x"), done(1)]) == []


def test_an_answer_is_finished_once_and_late_events_are_dropped():
    recorder = Recorder()
    assert len(feed(recorder, [started(), delta(0, "x"), done(1)])) == 1
    assert feed(recorder, [started(), delta(0, "x"), done(1)]) == []


def test_commit_floor_is_the_marker_of_the_oldest_open_answer():
    recorder = Recorder()
    recorder.on_event(started("a"), partition=0, offset=10)
    recorder.on_event(started("b"), partition=0, offset=12)
    recorder.on_event(started("c"), partition=1, offset=3)
    assert (recorder.commit_floor(0), recorder.commit_floor(1)) == (10, 3)
    recorder.on_event(done(0, rid="a"), partition=0, offset=13)
    assert recorder.commit_floor(0) == 12
    recorder.forget_partition(1)
    assert recorder.commit_floor(1) is None and recorder.open_requests() == ["b"]


def test_idle_answers_expire_as_errors_with_their_text():
    recorder = Recorder(idle_timeout_s=10)
    recorder.on_event(started(), now=0.0)
    recorder.on_event(delta(0, "part"), now=1.0)
    assert recorder.expire(5.0) == []
    [message] = recorder.expire(11.0)
    assert (message.content, message.status) == ("part", ERROR)
    assert recorder.open_requests() == []


def test_time_spent_waiting_for_the_store_does_not_make_answers_idle():
    recorder = Recorder(idle_timeout_s=10)
    recorder.on_event(started(), now=0.0)
    recorder.waited(30.0)  # the store was down; nothing was read meanwhile
    assert recorder.expire(31.0) == []
    assert len(recorder.expire(41.0)) == 1

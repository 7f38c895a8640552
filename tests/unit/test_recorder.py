"""Recorder core: token events in, the assistant message to store out."""

from __future__ import annotations

import pytest

from conversations.recorder import Recorder, TokenStreamEvent
from conversations.store import NewMessage
from schemas.events import GenerationDone, GenerationError, Role, TokenChunk, Usage
from schemas.lifecycle import RequestStatus

STOPPED, ABORTED, ERROR = (
    RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR,
)  # fmt: skip


def _ids(request_id: str) -> dict:
    return dict(
        request_id=request_id, conversation_id="c1", message_id=f"m-{request_id}",
        parent_id="u1", model="tiny", reply_to="chat.deliver.gw1",
    )  # fmt: skip


def chunk(seq: int, text: str, attempt: int = 0, rid: str = "r1", **fields) -> TokenChunk:
    return TokenChunk(
        **_ids(rid), attempt=attempt, seq=seq, text=text, token_count=1,
        completion_tokens=seq + 1, **fields,
    )  # fmt: skip


def done(
    seq: int, attempt: int = 0, rid: str = "r1", status=STOPPED, tokens: int = 0, **fields
) -> GenerationDone:
    return GenerationDone(
        **_ids(rid), attempt=attempt, seq=seq, status=status,
        usage=Usage(prompt_tokens=3, completion_tokens=tokens), **fields,
    )  # fmt: skip


def error(seq: int, attempt: int = 0, rid: str = "r1") -> GenerationError:
    return GenerationError(**_ids(rid), attempt=attempt, seq=seq, code="engine", message="boom")


def feed(recorder: Recorder, events: list[TokenStreamEvent]) -> list[NewMessage]:
    """Every message the recorder returned, in order."""
    out = []
    for offset, event in enumerate(events):
        message = recorder.on_event(event, offset=offset)
        if message is not None:
            out.append(message)
    return out


CASES = {
    "normal": ([chunk(0, "Hel"), chunk(1, "lo"), done(2)], "Hello", STOPPED),
    "empty answer": ([done(0)], "", STOPPED),
    "duplicates": (
        [chunk(0, "Hel"), chunk(0, "Hel"), chunk(1, "lo"), chunk(0, "Hel"), done(2), done(2),
         chunk(1, "lo")],
        "Hello", STOPPED,
    ),  # fmt: skip
    "out of order": ([chunk(1, "lo"), chunk(0, "Hel"), done(2)], "Hello", STOPPED),
    "done before its chunks": ([done(2), chunk(1, "lo"), chunk(0, "Hel")], "Hello", STOPPED),
    "aborted keeps partial text": ([chunk(0, "Hel"), done(1, status=ABORTED)], "Hel", ABORTED),
    "error mid-stream": ([chunk(0, "Hel"), chunk(1, "lo"), error(2)], "Hello", ERROR),
    "error before any text": ([error(0)], "", ERROR),
    "attempt 1 continues attempt 0": (
        [chunk(0, "Hel"), chunk(1, "lo"), chunk(2, " wor", 1), chunk(3, "ld", 1), done(4, 1)],
        "Hello world", STOPPED,
    ),  # fmt: skip
    "attempt 1 resumes below attempt 0's last chunk": (
        [chunk(0, "A"), chunk(1, "B"), chunk(1, "b", 1), chunk(2, "c", 1), done(3, 1)],
        "Abc", STOPPED,
    ),  # fmt: skip
    "old attempt still running, interleaved": (
        [chunk(0, "A"), chunk(1, "b", 1), chunk(1, "B"), chunk(2, "C"), chunk(2, "c", 1),
         done(3), chunk(3, "D"), done(3, 1)],
        "Abc", STOPPED,
    ),  # fmt: skip
    "attempt 1 restarts from zero": (
        [chunk(0, "A"), chunk(1, "B"), chunk(0, "x", 1), done(1, 1)], "x", STOPPED,
    ),
    "attempt 1 resumes after zero new chunks": (
        [chunk(0, "A"), chunk(1, "B"), done(2, 1)], "AB", STOPPED,
    ),
    "old chunk redelivered after attempt 1 ends": (
        [chunk(0, "A"), chunk(2, "c", 1), done(3, 1), chunk(1, "B")], "ABc", STOPPED,
    ),
    "old attempt's end cannot replace the newer one's": (
        [chunk(0, "A"), chunk(2, "c", 1), done(3, 1), done(2), chunk(1, "B")], "ABc", STOPPED,
    ),
    "attempt 1 after an error of attempt 0 still open": (
        [chunk(0, "A"), error(2), chunk(1, "b", 1), done(2, 1)], "Ab", STOPPED,
    ),
}


@pytest.mark.parametrize(("events", "content", "status"), CASES.values(), ids=CASES.keys())
def test_message_from_events(events, content: str, status: RequestStatus) -> None:
    recorder = Recorder()

    messages = feed(recorder, events)

    assert [(m.content, m.status) for m in messages] == [(content, status)]
    assert recorder.open_requests() == []


def test_message_carries_ids_and_completion_tokens() -> None:
    (message,) = feed(Recorder(), [chunk(0, "Hi"), chunk(1, "!"), done(2, tokens=9)])

    assert message == NewMessage(
        message_id="m-r1", conversation_id="c1", role=Role.ASSISTANT, content="Hi!",
        parent_id="u1", model="tiny", tokens=9, status=STOPPED, request_id="r1",
        prompt_tokens=3,
    )  # fmt: skip


def test_message_carries_prompt_and_cached_tokens_of_the_finishing_attempt() -> None:
    finish = GenerationDone(
        **_ids("r1"), attempt=1, seq=1, status=STOPPED,
        usage=Usage(prompt_tokens=120, completion_tokens=1, cached_tokens=96),
    )  # fmt: skip
    (message,) = feed(Recorder(), [chunk(0, "A"), finish])
    (failed,) = feed(Recorder(), [chunk(0, "A", rid="r2"), error(1, rid="r2")])

    assert (message.prompt_tokens, message.cached_tokens) == (120, 96)
    assert (failed.prompt_tokens, failed.cached_tokens) == (0, 0)


def test_tokens_of_a_resumed_attempt_count_the_whole_message() -> None:
    events = [chunk(0, "A"), chunk(1, "B"), chunk(2, "C", 1), done(3, 1, tokens=1)]

    (message,) = feed(Recorder(), events)

    assert message.tokens == 3  # the last chunk's completion_tokens, not attempt 1's usage


def test_waits_for_the_newer_attempt_s_own_chunk() -> None:
    recorder = Recorder()
    events = [chunk(0, "A"), chunk(1, "B"), chunk(2, "C"), chunk(1, "b", 1), chunk(3, "d", 1),
              done(4, 1)]  # fmt: skip

    assert feed(recorder, events) == []  # attempt 0's "C" must not stand in for attempt 1's
    message = recorder.on_event(chunk(2, "c", 1))
    assert message is not None and message.content == "Abcd"


def test_store_false_is_ignored() -> None:
    recorder = Recorder()

    assert feed(recorder, [chunk(0, "x", store=False), done(1, store=False)]) == []
    assert recorder.open_requests() == []
    assert recorder.commit_floor(0) is None


def test_commit_floor_is_the_first_offset_of_an_open_request() -> None:
    recorder = Recorder()
    recorder.on_event(chunk(0, "a", rid="r1"), partition=0, offset=10)
    recorder.on_event(chunk(0, "b", rid="r2"), partition=0, offset=11)
    recorder.on_event(chunk(0, "c", rid="r3"), partition=1, offset=5)

    assert recorder.open_requests() == ["r1", "r2", "r3"]
    assert (recorder.commit_floor(0), recorder.commit_floor(1)) == (10, 5)

    recorder.on_event(done(1, rid="r1"), partition=0, offset=12)
    assert recorder.open_requests() == ["r2", "r3"]
    assert recorder.commit_floor(0) == 11

    recorder.on_event(done(1, rid="r2"), partition=0, offset=13)
    assert recorder.commit_floor(0) is None
    assert recorder.commit_floor(2) is None


def test_forget_partition_drops_its_open_requests() -> None:
    recorder = Recorder()
    recorder.on_event(chunk(0, "a", rid="r1"), partition=0, offset=1)
    recorder.on_event(chunk(0, "b", rid="r2"), partition=1, offset=1)

    recorder.forget_partition(0)

    assert recorder.open_requests() == ["r2"]


def test_late_duplicates_of_recent_requests_are_dropped_and_memory_is_bounded() -> None:
    recorder = Recorder(max_finished=2)
    for rid in ("r1", "r2", "r3"):
        feed(recorder, [chunk(0, "x", rid=rid), done(1, rid=rid)])

    assert recorder.on_event(chunk(0, "x", rid="r3")) is None
    assert recorder.on_event(done(1, rid="r2")) is None
    assert recorder.open_requests() == []
    assert len(recorder._finished) == 2

    # r1 was forgotten: its late duplicate reopens it (the store's idempotence
    # on message_id keeps that harmless).
    assert recorder.on_event(chunk(0, "x", rid="r1")) is None
    assert recorder.open_requests() == ["r1"]


def test_expire_closes_idle_requests_with_their_gap_free_text() -> None:
    recorder = Recorder(idle_timeout_s=60)
    recorder.on_event(chunk(0, "Hel", rid="r1"), now=0)
    recorder.on_event(chunk(2, "XX", rid="r1"), now=10)  # position 1 never arrives
    recorder.on_event(chunk(0, "x", rid="r2"), now=50)

    assert recorder.expire(now=69) == []
    (message,) = recorder.expire(now=70)

    assert (message.message_id, message.content, message.status) == ("m-r1", "Hel", ERROR)
    assert recorder.open_requests() == ["r2"]
    assert recorder.on_event(chunk(1, "lo", rid="r1"), now=71) is None  # finished now


def test_expire_of_an_incomplete_done_is_an_error() -> None:
    recorder = Recorder(idle_timeout_s=1)
    recorder.on_event(chunk(0, "A"), now=0)
    recorder.on_event(done(3), now=0)

    (message,) = recorder.expire(now=5)

    assert (message.content, message.status) == ("A", ERROR)

"""Assembling what earlier attempts streamed, for a redispatched request to continue."""

from schemas.events import AttemptStarted, GenerationDone, TokenChunk, Usage
from schemas.lifecycle import RequestStatus
from workers.core import assemble

BASE = dict(conversation_id="c", message_id="m", model="tiny-random", reply_to="chat.deliver.g")


def chunk(seq: int, text: str, attempt: int = 0, request_id: str = "r") -> TokenChunk:
    return TokenChunk(
        **BASE,
        request_id=request_id,
        attempt=attempt,
        seq=seq,
        text=text,
        token_count=1,
        completion_tokens=seq + 1,
    )


def marker(attempt: int) -> AttemptStarted:
    return AttemptStarted(request_id="r", attempt=attempt, conversation_id="c", worker_id="w")


def test_contiguous_chunks_of_earlier_attempts():
    prior = assemble("r", [marker(0), chunk(0, "a"), chunk(1, "b"), chunk(2, "c")])
    assert (prior.text, prior.tokens, prior.next_seq, prior.finished) == ("abc", 3, 3, False)
    assert prior.streamed


def test_other_requests_are_ignored():
    prior = assemble("r", [chunk(0, "a"), chunk(1, "x", request_id="other"), chunk(1, "b")])
    assert (prior.text, prior.next_seq) == ("ab", 2)


def test_an_earlier_continuation_fences_the_attempt_it_replaced():
    events = [
        marker(0),
        chunk(0, "a"),
        marker(1),
        chunk(1, "zombie"),
        chunk(1, "B", attempt=1),
        chunk(2, "C", attempt=1),
    ]
    prior = assemble("r", events)
    assert prior.text == "aBC" and prior.next_seq == 3 and prior.tokens == 3


def test_a_finished_stream_is_reported():
    done = GenerationDone(
        **BASE, request_id="r", seq=1, status=RequestStatus.FINISHED_STOPPED, usage=Usage()
    )
    assert assemble("r", [chunk(0, "a"), done]).finished


def test_nothing_streamed_yet():
    prior = assemble("r", [marker(0)])
    assert (prior.text, prior.tokens, prior.next_seq, prior.streamed) == ("", 0, 0, False)


def test_token_ids_come_back_only_when_every_chunk_carried_its_own():
    with_ids = [
        chunk(0, "a").model_copy(update={"token_ids": (7,)}),
        chunk(1, "b").model_copy(update={"token_ids": (8,)}),
    ]
    assert assemble("r", with_ids).token_ids == (7, 8)
    assert assemble("r", [with_ids[0], chunk(1, "b")]).token_ids == (), (
        "a chunk without its tokens: continue from the text"
    )

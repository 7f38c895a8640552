"""Assembling what earlier attempts streamed, for a redispatched request to continue."""

from schemas.events import GenerationDone, TokenChunk, Usage
from schemas.lifecycle import RequestStatus
from workers.resume import assemble

BASE = dict(conversation_id="c", message_id="m", model="tiny", reply_to="chat.deliver.g")


def chunk(seq: int, text: str, attempt: int = 0, request_id: str = "r") -> TokenChunk:
    return TokenChunk(**BASE, request_id=request_id, attempt=attempt, seq=seq, text=text,
                      token_count=1, completion_tokens=seq + 1)


def test_contiguous_chunks_of_earlier_attempts():
    prior = assemble("r", 1, [chunk(0, "a"), chunk(1, "b"), chunk(2, "c")])
    assert (prior.text, prior.tokens, prior.next_seq, prior.finished) == ("abc", 3, 3, False)


def test_stops_at_the_first_gap_and_ignores_other_requests_and_own_attempt():
    events = [chunk(0, "a"), chunk(2, "c"), chunk(1, "x", request_id="other"),
              chunk(1, "own", attempt=1)]
    prior = assemble("r", 1, events)
    assert (prior.text, prior.next_seq) == ("a", 1)


def test_newer_attempt_owns_its_positions():
    events = [chunk(0, "a"), chunk(1, "b"), chunk(1, "B", attempt=1), chunk(2, "C", attempt=1)]
    prior = assemble("r", 2, events)
    assert prior.text == "aBC" and prior.next_seq == 3


def test_a_finished_stream_is_reported():
    done = GenerationDone(**BASE, request_id="r", seq=1, status=RequestStatus.FINISHED_STOPPED,
                          usage=Usage())
    assert assemble("r", 1, [chunk(0, "a"), done]).finished


def test_nothing_streamed_yet():
    prior = assemble("r", 1, [])
    assert (prior.text, prior.tokens, prior.next_seq) == ("", 0, 0)

"""The worker core's decisions with hand-made assignments, cancels and engine outputs:
which assignments run, what a heartbeat says, and an attempt's events (positions,
coalesced chunks, its end, its usage) on a clock the test moves."""

from __future__ import annotations

import pytest

from schemas.answer import UNKNOWN_END_SEQ
from schemas.events import (
    Cancel,
    ChatMessage,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    Role,
    TokenChunk,
    Usage,
    WorkAssignment,
)
from schemas.lifecycle import RequestStatus
from workers.coalesce import ChunkPacing
from workers.core import (
    DEFAULT_PACING,
    NOTHING,
    TELL_HANDED_BACK,
    Attempt,
    PriorOutput,
    Take,
    WorkerBook,
)
from workers.engine import Continuation, EngineOutput, EngineStats


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_request(request_id: str = "r", attempt: int = 0) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        attempt=attempt,
        conversation_id="c",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="pro",
        model="tiny-random",
        requested_model="big",
        messages=(ChatMessage(role=Role.USER, content="hi"),),
        reply_to="chat.deliver.gw",
    )


def assignment(
    request_id: str = "r",
    worker: str = "w1",
    epoch: int = 0,
    incarnation: str = "",
    attempt: int = 0,
) -> WorkAssignment:
    return WorkAssignment(
        worker_id=worker,
        request=make_request(request_id, attempt),
        epoch=epoch,
        incarnation=incarnation,
    )


def book() -> WorkerBook:
    return WorkerBook("w1", "inc-1", Clock(5000.0))


def output(
    text: str,
    completion: int,
    status: RequestStatus | None = None,
    prompt: int = 7,
    cached: int = 3,
) -> EngineOutput:
    return EngineOutput(
        text=text,
        new_tokens=1,
        completion_tokens=completion,
        prompt_tokens=prompt,
        cached_tokens=cached,
        status=status,
        token_ids=(completion,),
    )


# --- which assignments run ------------------------------------------------------------


@pytest.mark.parametrize(
    ("work", "why"),
    [
        (assignment(worker="w2"), "another worker's"),
        (assignment(incarnation="inc-0"), "this worker's previous process"),
    ],
)
def test_an_assignment_not_for_this_process_is_skipped(work, why):
    assert book().take(work, 0, 10) is Take.SKIP, why


def test_an_assignment_for_any_process_of_this_worker_runs():
    worker = book()
    assert worker.take(assignment(incarnation=""), 0, 10) is Take.RUN
    assert worker.take(assignment("r2", incarnation="inc-1"), 0, 11) is Take.RUN
    assert worker.running == {"r": (0, 10), "r2": (0, 11)}


def test_a_claim_fences_older_epochs_on_its_partition_only():
    worker = book()
    worker.claimed(0, 3)
    assert worker.take(assignment("old", epoch=2), 0, 1) is Take.SKIP
    assert worker.take(assignment("other-partition", epoch=2), 1, 1) is Take.RUN
    assert worker.take(assignment("current", epoch=3), 0, 2) is Take.RUN


def test_an_assignment_raises_the_epoch_even_when_it_is_another_workers():
    worker = book()
    assert worker.take(assignment("theirs", worker="w2", epoch=4), 0, 1) is Take.SKIP
    assert worker.take(assignment("mine", epoch=3), 0, 2) is Take.SKIP


def test_a_duplicate_of_a_running_or_finished_attempt_is_skipped_the_next_attempt_runs():
    worker = book()
    assert worker.take(assignment(), 0, 1) is Take.RUN
    assert worker.take(assignment(), 0, 2) is Take.SKIP  # running
    worker.ended(make_request())
    assert worker.running == {}
    assert worker.take(assignment(), 0, 3) is Take.SKIP  # finished
    assert worker.take(assignment(attempt=1), 0, 4) is Take.RUN


def test_a_later_attempt_of_one_running_here_replaces_it_and_its_assignment_is_done():
    """The scheduler took this worker for lost (its heartbeats were cut off) and sent the
    request back to it as the next attempt, while the first still runs."""
    worker = book()
    assert worker.take(assignment(), 0, 1) is Take.RUN
    assert worker.take(assignment(attempt=1), 0, 2) is Take.SUPERSEDE
    assert worker.running == {"r": (0, 1)}  # until the first attempt has stopped
    worker.supersede("r")
    assert worker.stopped("r") == (0, 1)  # its assignment is done here
    assert worker.take(assignment(attempt=1), 0, 2) is Take.RUN
    assert worker.running == {"r": (0, 2)} and worker.handed_back == {}
    assert worker.take(assignment(attempt=0), 0, 1) is Take.SKIP  # an older one, read again
    assert worker.take(assignment(attempt=1), 0, 2) is Take.SKIP  # a copy of the one running


def test_a_stopping_worker_hands_its_new_work_back_unrun():
    worker = book()
    worker.stopping = True
    assert worker.take(assignment(), 2, 9) is Take.HAND_BACK
    assert worker.running == {}
    assert worker.handed_back == {"r": (2, 9)}


def test_a_running_request_handed_back_stays_running_until_its_attempt_stopped():
    worker = book()
    worker.take(assignment(), 1, 5)
    assert not worker.hand_back("unknown")
    assert worker.hand_back("r")
    assert (worker.running, worker.handed_back) == ({"r": (1, 5)}, {"r": (1, 5)})
    assert worker.stopped("r") == (1, 5)
    assert worker.running == {}


def test_an_attempt_stopped_without_being_handed_back_is_not_done_here():
    worker = book()
    worker.take(assignment(), 1, 5)
    assert worker.stopped("r") is None
    assert worker.running == {}


def beat_of(worker: WorkerBook):
    return worker.heartbeat("tiny-random", 8, EngineStats(running=1, waiting=0), 1, {0: 9})


def test_a_preempted_request_is_listed_running_until_its_stream_is_released():
    worker = book()
    worker.take(assignment("r", attempt=2), 0, 5)
    assert not worker.hand_back("r", attempt=1, until_released=True)  # another attempt's
    assert worker.hand_back("r", attempt=2, until_released=True)
    assert worker.stopped("r") == (0, 5)
    beat = beat_of(worker)
    assert (beat.active, beat.handed_back) == (("r",), ())  # its tokens are not out yet
    worker.released("r")
    beat = beat_of(worker)
    assert (beat.active, beat.handed_back, beat.handed_back_attempts) == ((), ("r",), {"r": 2})
    assert beat.assignments == {"r": (0, 5)}


def test_a_worker_that_goes_on_forgets_a_hand_back_after_telling_it_a_few_times():
    worker = book()
    worker.take(assignment("r"), 0, 5)
    worker.hand_back("r", until_released=True)
    worker.stopped("r")
    worker.released("r")
    told = [beat_of(worker).handed_back for _ in range(TELL_HANDED_BACK + 1)]
    assert told == [("r",)] * TELL_HANDED_BACK + [()]
    assert worker.handed_back == {}


def test_the_next_attempt_of_a_request_handed_back_here_runs_here():
    worker = book()
    worker.take(assignment("r"), 0, 5)
    worker.hand_back("r", until_released=True)
    worker.stopped("r")
    worker.released("r")
    assert worker.take(assignment("r", attempt=1), 0, 9) is Take.RUN
    beat = beat_of(worker)
    assert (beat.active, beat.handed_back, beat.assignments) == (("r",), (), {"r": (0, 9)})


def test_cancels():
    worker = book()
    worker.take(assignment("running"), 0, 1)
    conditional = Cancel(request_id="running", reason="grace", held_by="gw-1")
    assert not worker.cancel(conditional)
    assert not worker.cancelled("running")
    assert worker.cancel(Cancel(request_id="running", reason="stop"))
    assert not worker.cancel(Cancel(request_id="later", reason="stop"))
    assert worker.cancelled("running") and worker.cancelled("later")


def test_the_heartbeat_reports_what_runs_and_what_was_handed_back():
    worker = book()
    worker.partitions = (0, 2)
    worker.take(assignment("a"), 0, 4)
    worker.take(assignment("b"), 2, 7)
    worker.hand_back("b")
    worker.stopping = True
    beat = worker.heartbeat(
        "tiny-random",
        8,
        EngineStats(running=2, waiting=1, free_kv_blocks=40),
        peak_running=5,
        consumed={0: 5, 2: 8},
    )
    assert (beat.worker_id, beat.incarnation, beat.model, beat.partitions) == (
        "w1",
        "inc-1",
        "tiny-random",
        (0, 2),
    )
    assert (beat.max_slots, beat.running, beat.waiting, beat.free_kv_blocks, beat.peak_running) == (
        8,
        2,
        1,
        40,
        5,
    )
    assert beat.active == ("a", "b")
    assert beat.assignments == {"a": (0, 4), "b": (2, 7)}
    assert beat.handed_back == ("b",)
    assert beat.consumed == {0: 5, 2: 8}
    assert beat.stopping and beat.sent_at == 5000.0


# --- one attempt's events -------------------------------------------------------------


def attempt(
    clock: Clock, request: GenerationRequest | None = None, pacing: ChunkPacing = DEFAULT_PACING
) -> Attempt:
    return Attempt(request or make_request(), "w1", pacing, clock, Clock(9000.0))


def sent(run: Attempt, event):
    """As the stage does once the bus has the event."""
    if event is not None:
        run.sent()
    return event


def test_chunks_take_consecutive_positions_and_the_end_the_next():
    clock = Clock()
    run = attempt(clock)
    assert run.resume(NOTHING) is None
    first = sent(run, run.output(output("Hel", 1), streams=1))
    assert isinstance(first, TokenChunk)  # the first goes at once
    assert (first.seq, first.text, first.completion_tokens, first.token_ids) == (0, "Hel", 1, (1,))
    clock.now += 0.01
    assert run.output(output("lo", 2), streams=1) is None  # held: within the interval
    clock.now += 0.05
    second = sent(run, run.output(output(" you", 3), streams=1))
    assert (second.seq, second.text, second.token_count, second.completion_tokens) == (
        1,
        "lo you",
        2,
        3,
    )
    clock.now += 0.01
    assert run.output(output("!", 4, RequestStatus.FINISHED_STOPPED), streams=1) is None
    tail = sent(run, run.tail())
    assert (tail.seq, tail.text, tail.completion_tokens) == (2, "!", 4)
    done = run.done()
    assert isinstance(done, GenerationDone)
    assert (done.seq, done.status) == (3, RequestStatus.FINISHED_STOPPED)
    assert done.usage == Usage(prompt_tokens=7, completion_tokens=4, cached_tokens=3)
    assert (done.request_id, done.attempt, done.conversation_id, done.reply_to) == (
        "r",
        0,
        "c",
        "chat.deliver.gw",
    )


def test_nothing_held_gives_no_tail():
    run = attempt(Clock())
    run.resume(NOTHING)
    sent(run, run.output(output("a", 1), streams=1))
    assert run.tail() is None


def test_an_event_the_bus_refused_leaves_no_gap_before_the_error():
    run = attempt(Clock())
    run.resume(NOTHING)
    refused = run.output(output("a", 1), streams=1)
    assert refused.seq == 0  # not sent: its position stays free
    error = run.error("pipeline_rejected", "the pipeline could not carry this answer")
    assert isinstance(error, GenerationError)
    assert (error.seq, error.code) == (0, "pipeline_rejected")
    assert run.status is RequestStatus.FINISHED_ERROR


def test_an_end_before_the_earlier_output_is_read_goes_past_any_position():
    run = attempt(Clock())
    assert run.error("engine_error", "the engine failed").seq == UNKNOWN_END_SEQ


def test_a_continuation_goes_on_after_what_earlier_attempts_streamed():
    clock = Clock()
    run = attempt(clock, make_request(attempt=1))
    prior = PriorOutput("Hello", 2, 4, False, (5, 6))
    assert run.resume(prior) == Continuation("Hello", 2, (5, 6))
    chunk = sent(run, run.output(output(" there", 3), streams=1))
    assert (chunk.seq, chunk.attempt) == (4, 1)
    clock.now += 2.5
    done = sent(run, run.done())
    assert done.seq == 5 and done.usage.completion_tokens == 3
    usage = run.usage()
    assert (usage.completion_tokens, usage.prior_completion_tokens, usage.prompt_tokens) == (
        1,
        2,
        7,
    )
    assert usage.gpu_ms == pytest.approx(2500.0)


def test_the_usage_of_a_whole_attempt():
    clock = Clock()
    run = attempt(clock)
    run.resume(NOTHING)
    sent(run, run.output(output("a", 1), streams=1))
    sent(run, run.output(output("b", 2, RequestStatus.FINISHED_LENGTH), streams=1))
    sent(run, run.done())
    clock.now += 0.25
    usage = run.usage()
    assert (
        usage.request_id,
        usage.attempt,
        usage.user_id,
        usage.org_id,
        usage.tier,
        usage.model,
        usage.requested_model,
        usage.worker_id,
    ) == ("r", 0, "u", "o", "pro", "tiny-random", "big", "w1")
    assert (
        usage.status,
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.prior_completion_tokens,
        usage.cached_tokens,
    ) == (RequestStatus.FINISHED_LENGTH, 7, 2, 0, 3)
    assert usage.gpu_ms == pytest.approx(250.0)
    assert usage.created_at == 9000.0


def test_a_failed_attempt_counts_no_output_of_its_own():
    run = attempt(Clock(), make_request(attempt=1))
    run.resume(PriorOutput("ab", 2, 2, False))
    sent(run, run.output(output("c", 3), streams=1))
    run.error("engine_error", "the engine failed")
    usage = run.usage()
    assert (
        usage.status,
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.prior_completion_tokens,
    ) == (RequestStatus.FINISHED_ERROR, 0, 0, 2)


def test_an_attempt_whose_end_the_bus_refused_counts_what_it_generated():
    run = attempt(Clock())
    run.resume(NOTHING)
    sent(run, run.output(output("a", 1, RequestStatus.FINISHED_STOPPED), streams=1))
    run.done()  # refused: not sent
    error = run.error("pipeline_rejected", "the pipeline could not carry this answer")
    assert error.seq == 1
    usage = run.usage()
    assert (usage.status, usage.completion_tokens) == (RequestStatus.FINISHED_ERROR, 1)


def test_a_request_cancelled_before_it_ran_ends_aborted_with_what_was_streamed():
    run = attempt(Clock(), make_request(attempt=2))
    run.resume(PriorOutput("abc", 3, 3, False))
    done = run.done()
    assert (done.seq, done.status) == (3, RequestStatus.FINISHED_ABORTED)
    assert done.usage == Usage(completion_tokens=3)
    assert run.usage().completion_tokens == 0


def test_more_streams_widen_the_chunk_interval():
    clock = Clock()
    run = attempt(clock, pacing=ChunkPacing(0.05, 0.2, max_chunks_per_s=100))
    run.resume(NOTHING)
    sent(run, run.output(output("a", 1), streams=20))
    clock.now += 0.1
    assert run.output(output("b", 2), streams=20) is None  # 20 streams: every 0.2 s
    clock.now += 0.1
    assert sent(run, run.output(output("c", 3), streams=20)).text == "bc"

"""The differentiators benchmark's arithmetic: ETA errors, the pairing of a retraction
with its offending chunk and of a hang-up with its abort, the report's verdicts, and
how it finds the resume measurement."""

from __future__ import annotations

import math
import random

import orjson
import pytest

from bench.cancel import HangUp
from bench.differentiators.cancel_latency import (
    CancelLatencyStats,
    CancelTiming,
    abort_times,
    aborted_ends,
    timing,
)
from bench.differentiators.eta import Backlog, EtaStats, QueuedWait, arrivals, queued_wait
from bench.differentiators.report import (
    DifferentiatorsRun,
    cancel_rows,
    eta_rows,
    markdown,
    retraction_rows,
)
from bench.differentiators.resume import ResumeStats
from bench.differentiators.retraction import (
    Retraction,
    RetractionStats,
    chunk_times,
    retraction,
)
from bench.differentiators.turns import Turn
from bench.sse_client import StreamRecord
from schemas.events import GenerationDone, TokenChunk, Usage
from schemas.lifecycle import RequestStatus
from schemas.sse import SSEMessage


def message(event: str, data: dict, at: float, seq: int | None = None) -> SSEMessage:
    return SSEMessage(event, orjson.dumps(data).decode(), None if seq is None else str(seq), at)


def turn(*events: SSEMessage, wall_offset: float = 0.0) -> Turn:
    return Turn(status=200, sent_at=0.0, wall_offset=wall_offset, events=list(events))


def wait(position: int, eta_ms: int | None, actual_s: float) -> QueuedWait:
    return QueuedWait(position, eta_ms, 10.0, 10.0 + actual_s)


# --- queue ETA -------------------------------------------------------------------------


def test_the_prediction_is_the_first_queued_events_and_the_wait_runs_to_the_first_token():
    seen = turn(
        message("request", {"request_id": "r1"}, 1.0),
        message("queued", {"position": 3, "eta_ms": 1500}, 1.2),
        message("queued", {"position": 2, "eta_ms": 900}, 2.2),
        message("delta", {"delta": "Hi"}, 3.2, seq=0),
        message("delta", {"delta": " there"}, 3.4, seq=1),
    )
    found = queued_wait(seen)
    assert found is not None
    assert (found.position, found.eta_ms) == (3, 1500)
    assert found.actual_ms == pytest.approx(2000)
    assert found.error == pytest.approx(0.25)


def test_a_turn_never_queued_or_never_streamed_has_no_wait():
    assert queued_wait(turn(message("delta", {"delta": "Hi"}, 1.0, seq=0))) is None
    assert queued_wait(turn(message("queued", {"position": 1, "eta_ms": 100}, 1.0))) is None


def test_a_queued_event_without_an_eta_gives_no_error_but_is_counted():
    stats = EtaStats(Backlog(), offered=2, slots=4, waits=[wait(5, None, 1.0), wait(6, 800, 1.0)])
    assert stats.without_eta == 1
    assert stats.errors == [pytest.approx(0.2)]


def test_errors_split_at_the_positions_the_free_slots_reach_first():
    waits = [wait(1, 100, 1.0), wait(2, 300, 0.5), wait(9, 2200, 2.0), wait(12, 3000, 3.0)]
    stats = EtaStats(Backlog(), offered=4, slots=4, waits=waits)
    assert stats.error_at(50, head=True) == pytest.approx((0.9 + 0.4) / 2)
    assert stats.error_at(50, head=False) == pytest.approx((0.1 + 0.0) / 2)
    assert stats.max_position() == 12
    assert not stats.met


def test_the_target_is_met_at_a_median_error_of_20_percent():
    stats = EtaStats(Backlog(), offered=3, slots=4, waits=[wait(5, 1200, 1.0)] * 3)
    assert stats.met
    over = EtaStats(Backlog(), offered=3, slots=4, waits=[wait(5, 1210, 1.0)] * 3)
    assert not over.met


def test_arrivals_fall_in_their_spell_in_order():
    times = arrivals(3.0, 10.0, 26.0, random.Random(1))
    assert times == sorted(times)
    assert all(10.0 < t < 26.0 for t in times)


def test_the_backlog_sends_both_spells_each_with_a_length_in_range():
    backlog = Backlog(warm_rate_per_s=1.0, warm_s=5.0, rate_per_s=4.0, offer_s=5.0)
    sent, lengths = backlog.plan()
    assert len(sent) == len(lengths)
    assert any(t < 5.0 for t in sent) and any(t >= 5.0 for t in sent)
    assert all(20 <= n <= 60 for n in lengths)
    assert backlog.plan() == (sent, lengths), "the same plan on every run"


# --- retraction ------------------------------------------------------------------------


def test_a_retraction_is_timed_from_the_chunk_it_names_to_its_arrival():
    seen = turn(
        message("request", {"request_id": "r1"}, 1.0),
        message("delta", {"delta": "You can"}, 1.1, seq=0),
        message("delta", {"delta": " write to"}, 1.15, seq=1),
        message("retract", {"message_id": "m", "reason": "pii", "replacement": "x"}, 1.3, seq=2),
        message("done", {"status": "finished_filtered"}, 1.31, seq=3),
        wall_offset=1000.0,
    )
    found = retraction(seen, {0: 1_000_900.0, 1: 1_001_000.0, 2: 1_001_250.0})
    assert found == Retraction(1_001_250.0, 1_001_300.0, tokens_shown=4)
    assert found.latency_ms == pytest.approx(50.0)


def test_no_retraction_without_a_retract_or_without_its_chunk():
    delta = message("delta", {"delta": "Hi"}, 1.0, seq=0)
    retract = message("retract", {"message_id": "m", "reason": "pii", "replacement": ""}, 2.0, 1)
    assert retraction(turn(delta), {0: 0.0}) is None
    assert retraction(turn(delta, retract), {0: 0.0}) is None


def test_the_retraction_target_needs_every_answer_retracted_within_250_ms_at_p99():
    quick = [Retraction(0.0, 40.0, 3)] * 10
    assert RetractionStats(offered=10, retractions=quick).met
    assert not RetractionStats(offered=11, retractions=quick).met
    slow = RetractionStats(offered=10, retractions=[*quick[:9], Retraction(0.0, 5000.0, 3)])
    assert not slow.met
    assert retraction_rows(slow)[1][3] == "no"


# --- cancel latency --------------------------------------------------------------------

LOG = """\
2026-12-03 07:16:30,100 INFO workers.stage cancel r1: client_disconnected
2026-12-03 07:16:30,250 INFO workers.stage cancel r2: content_filter
2026-12-03 07:16:31,000 INFO workers.stage cancel r1: client_disconnected
2026-12-03 07:16:31,500 INFO bus.stage_runner r3 assigned
"""


def test_aborts_are_read_from_the_workers_cancel_lines_for_hang_ups_only():
    aborted = abort_times(LOG.splitlines())
    assert set(aborted) == {"r1"}, "a retraction's cancel is no hang-up"
    second = abort_times(
        ["2026-12-03 07:16:31,100 INFO workers.stage cancel r9: client_disconnected"]
    )
    assert second["r9"] - aborted["r1"] == pytest.approx(1.0), "the first line of each, to the ms"


def test_a_hang_up_counts_the_tokens_published_by_then():
    record = StreamRecord(started=100.0, wall_started=5000.0, ended=101.0)  # hung up at 5001 s
    published = [(5000.5, 3), (5000.9, 7), (5001.05, 9)]
    found = timing(record, aborted_at=5001.02, ended_at=5001.03, published=published,
                   received=6, generated=9)  # fmt: skip
    assert found.latency_ms == pytest.approx(20.0)
    assert found.end_ms == pytest.approx(30.0)
    assert found.tokens == HangUp(received=6, published_before=7, generated=9)
    assert found.tokens.generated_after == 2
    assert found.tokens.waste == 3, "generated, never shown"


def test_the_cancel_target_is_a_p99_of_100_ms():
    def at(ms: float) -> CancelTiming:
        return CancelTiming(0.0, ms / 1000, None, HangUp(1, 1, 1))

    assert CancelLatencyStats(10, [at(20.0)] * 10).met
    late = CancelLatencyStats(10, [at(20.0)] * 9 + [at(400.0)])
    assert not late.met
    assert cancel_rows(late)[1][3] == "no"
    assert not CancelLatencyStats(10, []).met, "nothing measured is no pass"


def test_an_empty_measurement_reads_not_available():
    [p50, p90] = eta_rows(EtaStats(Backlog(), offered=0, slots=4))
    assert p50[1] == "n/a" and p50[3] == "no"
    assert p90[1] == "n/a"
    assert math.isnan(CancelLatencyStats(0).end_ms(50))


def _run(resume: ResumeStats) -> DifferentiatorsRun:
    host = {"date": "today", "nproc": "2", "cpu": "cpu", "commit": "abc1234"}
    return DifferentiatorsRun(
        "cmd", host, EtaStats(Backlog(), 0, 4), RetractionStats(0), CancelLatencyStats(0), resume
    )


def test_resumes_rows_join_the_table_and_a_note_follows_it_per_answer_not_byte_exact():
    stats = ResumeStats(5, 10, 9, 300.0, 400.0, mismatches=("r7: differs at byte 12",))
    table = markdown(_run(stats)).splitlines()
    first = stats.lines()[0]
    assert table.index(first) == table.index("|---|---|---|---|") + 11, "after the 10 rows"
    note = "Not resumed byte-exact: r7: differs at byte 12"
    assert note in table
    assert table[table.index(note) - 1] == ""


# --- chat.tokens, read once ---------------------------------------------------------------


def _of(request_id: str, seq: int) -> dict[str, object]:
    return dict(
        request_id=request_id,
        seq=seq,
        conversation_id="c",
        message_id="m",
        model="tiny-random",
        reply_to="chat.deliver.g1",
    )


def _chunk(request_id: str, seq: int) -> TokenChunk:
    return TokenChunk(**_of(request_id, seq), text="x", token_count=1, completion_tokens=seq + 1)


def _done(request_id: str, status: RequestStatus) -> GenerationDone:
    return GenerationDone(**_of(request_id, 9), status=status, usage=Usage())


def test_chunk_times_keep_the_first_record_of_each_seq_of_the_requests_asked():
    found = [(10, _chunk("a", 0)), (20, _chunk("a", 1)), (25, _chunk("a", 1)), (30, _chunk("b", 0))]
    assert chunk_times(found, {"a"}) == {"a": {0: 10.0, 1: 20.0}}


def test_an_aborted_end_is_the_record_time_of_an_aborted_done_only():
    found = [
        (1500, _done("a", RequestStatus.FINISHED_ABORTED)),
        (1600, _done("b", RequestStatus.FINISHED_STOPPED)),
        (1700, _done("c", RequestStatus.FINISHED_ABORTED)),
        (1800, _chunk("a", 3)),
    ]
    assert aborted_ends(found, {"a", "b"}) == {"a": 1.5}

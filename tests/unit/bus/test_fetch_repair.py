"""Gaps: a poll's records are cut where their offsets skip, and the consumer fetches
again from the first missing one, until a hole has stood for its wait."""

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.fetch_repair import Gaps

TP = TopicPartition("chat.tokens", 0)
OTHER = TopicPartition("chat.tokens", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def records(tp: TopicPartition, *offsets: int) -> list[ConsumerRecord]:
    return [
        ConsumerRecord(tp.topic, tp.partition, o, 0, 0, None, b"{}", None, 0, 2, [])
        for o in offsets
    ]


def offsets(kept: dict[TopicPartition, list[ConsumerRecord]]) -> dict[TopicPartition, list[int]]:
    return {tp: [r.offset for r in part] for tp, part in kept.items()}


def test_records_without_a_hole_pass_whole():
    kept, again = Gaps().cut(
        {TP: 5, OTHER: 0}, {TP: records(TP, 5, 6, 7), OTHER: records(OTHER, 0)}
    )
    assert offsets(kept) == {TP: [5, 6, 7], OTHER: [0]}
    assert again == {}


def test_records_are_cut_at_the_first_missing_offset_and_fetched_again_from_it():
    kept, again = Gaps().cut(
        {TP: 5, OTHER: 0}, {TP: records(TP, 5, 6, 8, 9), OTHER: records(OTHER, 0)}
    )
    assert offsets(kept) == {TP: [5, 6], OTHER: [0]}
    assert again == {TP: 7}


def test_an_answer_that_starts_past_the_position_keeps_nothing_of_that_partition():
    kept, again = Gaps().cut({TP: 5}, {TP: records(TP, 6, 7)})
    assert kept == {}
    assert again == {TP: 5}


def test_a_hole_standing_for_its_wait_is_read_past():
    clock = Clock()
    gaps = Gaps(wait_s=1.0, clock=clock)
    assert gaps.cut({TP: 5}, {TP: records(TP, 6)})[1] == {TP: 5}
    clock.now = 0.9
    assert gaps.cut({TP: 5}, {TP: records(TP, 6)})[1] == {TP: 5}
    clock.now = 1.0
    kept, again = gaps.cut({TP: 5}, {TP: records(TP, 6, 7)})
    assert offsets(kept) == {TP: [6, 7]}
    assert again == {}


def test_a_filled_hole_starts_the_wait_afresh_for_the_next_one():
    clock = Clock()
    gaps = Gaps(wait_s=1.0, clock=clock)
    gaps.cut({TP: 5}, {TP: records(TP, 6)})
    clock.now = 0.5
    assert offsets(gaps.cut({TP: 5}, {TP: records(TP, 5, 6)})[0]) == {TP: [5, 6]}
    clock.now = 1.2
    assert gaps.cut({TP: 7}, {TP: records(TP, 8)})[1] == {TP: 7}  # a new hole: waited for


def test_records_below_the_position_mean_the_consumer_was_moved_and_pass_whole():
    kept, again = Gaps().cut({TP: 9}, {TP: records(TP, 3, 4, 6)})
    assert offsets(kept) == {TP: [3, 4, 6]}
    assert again == {}


def test_a_partition_without_a_known_position_passes_whole():
    kept, again = Gaps().cut({}, {TP: records(TP, 3, 5)})
    assert offsets(kept) == {TP: [3, 5]}
    assert again == {}

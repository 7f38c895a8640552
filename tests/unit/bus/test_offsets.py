from aiokafka.structs import TopicPartition

from bus.offsets import OffsetTracker

TP = TopicPartition("t", 0)


def test_commit_waits_for_oldest_open_event():
    tracker = OffsetTracker()
    tracker.started(TP, 0)
    tracker.started(TP, 1)
    tracker.done(TP, 1)
    assert tracker.to_commit() == {TP: 0}
    tracker.committed({TP: 0})
    assert tracker.to_commit() == {}
    tracker.done(TP, 0)
    assert tracker.to_commit() == {TP: 2}


def test_seen_events_advance_the_watermark():
    tracker = OffsetTracker()
    tracker.seen(TP, 0)
    tracker.seen(TP, 1)
    assert tracker.to_commit() == {TP: 2}
    assert tracker.next_offsets() == {TP: 2}


def test_forget_drops_revoked_partitions():
    tracker = OffsetTracker()
    tracker.started(TP, 3)
    tracker.forget({TP})
    assert tracker.to_commit() == {}

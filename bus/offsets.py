"""Commit watermarks: commit an offset only when every event before it is done."""

from __future__ import annotations

from collections.abc import Callable

from aiokafka import ConsumerRebalanceListener
from aiokafka.structs import TopicPartition


class OffsetTracker:
    """Tracks events in flight per partition; says what is safe to commit.

    Events end out of order (a short request finishes before a long one that
    arrived first). The committable offset of a partition is the oldest offset
    still in flight, or one past the last seen offset when nothing is.
    """

    def __init__(self) -> None:
        self._open: dict[TopicPartition, set[int]] = {}
        self._next: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}

    def started(self, tp: TopicPartition, offset: int) -> None:
        self._open.setdefault(tp, set()).add(offset)
        self._next[tp] = max(self._next.get(tp, 0), offset + 1)

    def done(self, tp: TopicPartition, offset: int) -> None:
        self._open.get(tp, set()).discard(offset)

    def seen(self, tp: TopicPartition, offset: int) -> None:
        """An event handled at once (nothing to wait for)."""
        self._next[tp] = max(self._next.get(tp, 0), offset + 1)

    def next_offsets(self) -> dict[TopicPartition, int]:
        """Per partition, the next offset to read: what the consumer has taken."""
        return dict(self._next)

    def to_commit(self, floor: Callable[[TopicPartition], int | None] | None = None,
                  ) -> dict[TopicPartition, int]:
        """Offsets to commit now (only partitions whose watermark moved). `floor` gives,
        per partition, an offset the stage still needs (e.g. the first event of a stream
        it has not finished), or None: the watermark never passes it."""
        result: dict[TopicPartition, int] = {}
        for tp, next_offset in self._next.items():
            open_offsets = self._open.get(tp)
            mark = min(open_offsets) if open_offsets else next_offset
            needed = floor(tp) if floor is not None else None
            if needed is not None:
                mark = min(mark, needed)
            if mark > self._committed.get(tp, -1):
                result[tp] = mark
        return result

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        self._committed.update(offsets)

    def forget(self, partitions: set[TopicPartition]) -> None:
        """Partitions revoked in a rebalance: their events belong to someone else now."""
        for tp in partitions:
            self._open.pop(tp, None)
            self._next.pop(tp, None)
            self._committed.pop(tp, None)


class ForgetRevoked(ConsumerRebalanceListener):
    """A group member's rebalance: what it held of a revoked partition is its next
    owner's now (it reads again from the committed offset), so the tracker and the
    stage's per-partition state (`forget_partition`) drop it."""

    def __init__(self, tracker: OffsetTracker,
                 forget_partition: Callable[[int], None] | None = None) -> None:
        self.tracker = tracker
        self.forget_partition = forget_partition

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if self.forget_partition is not None:
            for tp in revoked:
                self.forget_partition(tp.partition)
        self.tracker.forget(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass

"""Commit watermarks: commit an offset only when every event before it is done."""

from __future__ import annotations

from collections.abc import Callable

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

    def to_commit(
        self,
        floor: Callable[[TopicPartition], int | None] | None = None,
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

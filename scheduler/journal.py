"""`chat.work` as the scheduler's journal: pure rules, no Kafka.

The journal holds every decision the scheduler makes about a request: an assignment
(handed to a worker), an `Unserved` record (ended without a worker: cancelled,
expired, refused, not deliverable) and each scheduler's `SchedulerClaim`. A
restarted scheduler replays it from its committed offset up to its own claim and
so knows, for every request it reads again, whether it was decided already.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Hashable

from bus.produce_failures import PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE
from schemas.answer import UNKNOWN_END_SEQ
from schemas.events import (
    GenerationDone,
    GenerationError,
    GenerationRequest,
    Usage,
    stream_fields,
)
from schemas.lifecycle import RequestStatus

CANCELLED = "cancelled"
DEADLINE_EXCEEDED = "deadline_exceeded"
OVERLOADED = "overloaded"
DISPATCH_FAILED = "dispatch_failed"

_MESSAGES = {
    DEADLINE_EXCEEDED: "the request waited past its deadline",
    DISPATCH_FAILED: "the request could not be handed to a worker",
    PIPELINE_REJECTED: PIPELINE_REJECTED_MESSAGE,
}


def unserved_end(
    request: GenerationRequest, code: str, retry_after: float | None = None
) -> GenerationDone | GenerationError:
    """The terminal event of a request ended without a worker, so the gateway's stream
    closes and the recorder stores the (empty or partial) answer."""
    fields = stream_fields(request, 0 if request.attempt == 0 else UNKNOWN_END_SEQ)
    if code == CANCELLED:
        return GenerationDone(**fields, status=RequestStatus.FINISHED_ABORTED, usage=Usage())
    if code == OVERLOADED:
        return GenerationError(
            **fields,
            code=code,
            retry_after=retry_after or 1.0,
            message=f"the {request.tier} tier is overloaded; retry later",
        )
    return GenerationError(**fields, code=code, message=_MESSAGES.get(code, code))


def unserved_partition(request_id: str, partitions: int) -> int:
    """The `chat.work` partition of a request's `Unserved` record: any fixed rule."""
    return zlib.crc32(request_id.encode()) % partitions


class JournalWindow:
    """Where a restarted scheduler must start replaying the journal: its commit rule.

    A restart reads again every request whose offset is not committed, and must find
    each one's decision in what it replays. A decision is written after its request
    was read, so it lies at or past the journal's ends at that moment (the scheduler
    is the journal's only writer: it knows its ends). The journal's commit is
    therefore, per partition, the lowest of:
    - the ends when each request not committed yet was read;
    - the start of the window replayed at start-up, until the request partitions are
      committed up to where they ended then (those requests' decisions are in it);
    - each assignment its worker has not read yet (`unread`): no heartbeat tells of it.
    Without any of these, the current ends.
    """

    def __init__(self, ends: dict[int, int], replayed_from: dict[int, int]) -> None:
        self.ends = dict(ends)
        self._replayed_from = dict(replayed_from)
        self._held_by: dict[Hashable, int | None] = {}
        self._reads: dict[Hashable, deque[tuple[int, dict[int, int]]]] = {}
        self._committed_requests: dict[Hashable, int] = {}
        self._committed: dict[int, int] = {}

    def hold_until_read(self, source: Hashable, committed: int) -> None:
        """`source` (a request partition) had `committed` as its commit at start-up;
        the replayed window holds until it is committed up to its end then."""
        self._held_by[source] = None
        self._committed_requests[source] = committed

    def end_at_start(self, source: Hashable, end: int) -> None:
        """The end `source` had at start-up (its first known high watermark)."""
        if source in self._held_by and self._held_by[source] is None:
            self._held_by[source] = end
            self._release(source)

    def ends_unknown(self) -> list[Hashable]:
        return [source for source, end in self._held_by.items() if end is None]

    def wrote(self, partition: int, offset: int) -> None:
        if offset >= self.ends.get(partition, 0):
            self.ends = {**self.ends, partition: offset + 1}  # read marks share the old one

    def read(self, source: Hashable, offset: int) -> None:
        """A request was read at `offset` of `source`."""
        self._reads.setdefault(source, deque()).append((offset, self.ends))

    def requests_committed(self, offsets: dict[Hashable, int]) -> None:
        for source, committed in offsets.items():
            self._committed_requests[source] = committed
            reads = self._reads.get(source)
            while reads and reads[0][0] < committed:
                reads.popleft()
            self._release(source)

    def _release(self, source: Hashable) -> None:
        end = self._held_by.get(source)
        if end is not None and self._committed_requests.get(source, 0) >= end:
            del self._held_by[source]

    def to_commit(self, unread: dict[int, int]) -> dict[int, int]:
        """Journal offsets to commit now (only partitions whose floor moved)."""
        floors = dict(self.ends)
        bounds = [unread] + [reads[0][1] for reads in self._reads.values() if reads]
        if self._held_by:
            bounds.append(self._replayed_from)
        for bound in bounds:
            for partition, offset in bound.items():
                if partition in floors:
                    floors[partition] = min(floors[partition], offset)
        return {p: o for p, o in floors.items() if o > self._committed.get(p, -1)}

    def committed(self, floors: dict[int, int]) -> None:
        self._committed.update(floors)

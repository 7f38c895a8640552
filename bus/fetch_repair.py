"""Reading every record the broker holds where its answers fall short.

Two faults of the embedded broker (Tansu) reach a consumer, and chatpipe's consumers
(`bus.fetch_pace.PacedConsumer`) repair both on every poll:

- **Empty answers below the watermark.** Tansu finds a fetch's records by listing every
  batch the partition holds, from its first, and stops listing when the fetch's wait is
  over. Once a partition holds more batches than it can list in that time (some 30,000
  at 20 ms on an idle core, fewer on a busy one), every fetch near its end comes back
  empty although the high watermark it reports stands above the fetch offset, and the
  consumer never reads on. While a consumer stands below the watermark its last fetch
  reported (`held_back`), it fetches with `CATCH_UP_MS`: with records there the broker
  answers as soon as it has listed them, so the longer wait costs nothing.
- **Skipped records.** A write takes its offsets (raising the watermark) before its
  batch is stored. While two producers write one partition, a fetch can find the later
  batch stored and the earlier one not yet, and answer from the later one: a consumer
  taking that answer would never see the earlier records. chatpipe's topics are neither
  compacted nor transactional, so their offsets have no holes: a poll whose records jump
  past the next offset is cut at the jump, and the consumer fetches again from the
  missing offset (`Gaps`). A hole still there after `GAP_WAIT_S` is read past, with a
  warning.

On Apache Kafka neither happens, and neither repair ever acts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

log = logging.getLogger(__name__)

CATCH_UP_MS = 1000
"""The fetch wait while the broker holds records back (`held_back`): time for it to
list a partition of a million batches on an idle core."""
GAP_WAIT_S = 1.0
"""How long a hole in a partition's offsets is fetched again before it is read past."""


def assignment_of(consumer: AIOKafkaConsumer) -> Any:
    """aiokafka's current assignment (its partitions' fetch state), or None."""
    subscription = consumer._subscription.subscription
    return None if subscription is None else subscription.assignment


def positions(consumer: AIOKafkaConsumer) -> tuple[Any, dict[TopicPartition, int]]:
    """The consumer's assignment and the next offset it reads of each assigned partition
    that has one."""
    assignment = assignment_of(consumer)
    if assignment is None:
        return None, {}
    found = {}
    for tp in assignment.tps:
        state = assignment.state_value(tp)
        if state.has_valid_position:
            found[tp] = state.position
    return assignment, found


def held_back(consumer: AIOKafkaConsumer) -> bool:
    """Whether a partition this consumer fetches (assigned, not paused, nothing of it
    buffered) stands below the high watermark its last fetch reported: the broker holds
    records past the consumer's position that its answer did not carry."""
    fetcher = getattr(consumer, "_fetcher", None)  # None until the consumer has started
    assignment = assignment_of(consumer)
    if fetcher is None or assignment is None:
        return False
    for tp in assignment.tps:
        state = assignment.state_value(tp)
        if state.paused or tp in fetcher._records or not state.has_valid_position:
            continue
        if state.highwater is not None and state.highwater > state.position:
            return True
    return False


@dataclass
class Gaps:
    """Where a poll's records skipped offsets, partition by partition."""

    wait_s: float = GAP_WAIT_S
    clock: Callable[[], float] = time.monotonic
    _seen: dict[TopicPartition, tuple[int, float]] = field(default_factory=dict)
    """Each partition's open hole: its first missing offset and when it was first met."""

    def cut(
        self,
        before: Mapping[TopicPartition, int],
        records: Mapping[TopicPartition, list[ConsumerRecord]],
    ) -> tuple[dict[TopicPartition, list[ConsumerRecord]], dict[TopicPartition, int]]:
        """`records` up to the first offset each partition's are missing, counting from
        its position `before` the poll, and the offsets to fetch again from. A partition
        whose records start below its position was moved meanwhile (a seek, a
        rebalance) and is kept whole."""
        now = self.clock()
        kept: dict[TopicPartition, list[ConsumerRecord]] = {}
        again: dict[TopicPartition, int] = {}
        for tp, part in records.items():
            expected = before.get(tp)
            cut_at = None if expected is None else _first_jump(part, expected)
            if cut_at is None:
                self._seen.pop(tp, None)
                kept[tp] = part
                continue
            assert expected is not None
            missing = expected + cut_at
            first, since = self._seen.setdefault(tp, (missing, now))
            if first != missing:
                self._seen[tp] = (missing, now)
            elif now - since >= self.wait_s:
                log.warning(
                    "%s: offsets %d to %d are missing from the broker; reading past them",
                    tp,
                    missing,
                    part[cut_at].offset - 1,
                )
                del self._seen[tp]
                kept[tp] = part
                continue
            if cut_at:
                kept[tp] = part[:cut_at]
            again[tp] = missing
        return kept, again


def _first_jump(part: list[ConsumerRecord], expected: int) -> int | None:
    """The index of the first record past a hole, counting on from `expected`; None when
    the offsets run on without one (or start below `expected`)."""
    if not part or part[0].offset < expected:
        return None
    for index, record in enumerate(part):
        if record.offset != expected + index:
            return index
    return None

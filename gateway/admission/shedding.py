"""What the schedulers last said about shedding, per scheduler shard (docs/architecture/scale.md).

Each scheduler shard publishes its own `SchedulerStatus` on `chat.scheduler`, naming the
models it decides for; the unnamed shard (empty name) decides for every other model. A
request for a model is refused `overloaded` only while the status of that model's shard
is fresh and sheds its tier: one shard shedding leaves the others' models admitted.
"""

from __future__ import annotations

from schemas.events import SchedulerStatus
from schemas.topics import Tier

STATUS_FRESH_S = 5.0
"""An older scheduler status says nothing about now."""
SCHEDULER_SILENT_S = 15.0
"""A scheduler sends its status at least every 10 s: one not heard from for this long
is taken as gone (readiness)."""


class Shedding:
    """The newest status of each scheduler shard."""

    def __init__(self) -> None:
        self._by_shard: dict[str, SchedulerStatus] = {}

    def update(self, status: SchedulerStatus) -> None:
        self._by_shard[status.shard] = status

    def speaks_for(self, model: str, now: float) -> bool:
        """The shard deciding for `model` sent its status within SCHEDULER_SILENT_S."""
        status = self._deciding(model)
        return status is not None and status.sent_at >= now - SCHEDULER_SILENT_S

    def workers(self, model: str, now: float) -> int:
        """Live workers serving `model` as its shard last said; 0 without a recent status."""
        status = self._deciding(model)
        if status is None or not self.speaks_for(model, now):
            return 0
        return status.workers.get(model, 0)

    def _deciding(self, model: str) -> SchedulerStatus | None:
        return next(
            (s for s in self._by_shard.values() if model in s.models), self._by_shard.get("")
        )

    def retry_after(self, tier: Tier, model: str, now: float) -> float | None:
        """Seconds to wait before retrying while the shard deciding for `model` sheds
        `tier` (its status no older than STATUS_FRESH_S at wall time `now`), else None."""
        status = self._deciding(model)
        if status is None or status.sent_at < now - STATUS_FRESH_S:
            return None
        tier_status = status.tiers.get(tier)
        if tier_status is None or not tier_status.shedding:
            return None
        return tier_status.retry_after_s or 1.0

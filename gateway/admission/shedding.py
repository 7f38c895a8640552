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


class Shedding:
    """The newest status of each scheduler shard."""

    def __init__(self) -> None:
        self._by_shard: dict[str, SchedulerStatus] = {}

    def update(self, status: SchedulerStatus) -> None:
        self._by_shard[status.shard] = status

    def retry_after(self, tier: Tier, model: str, now: float) -> float | None:
        """Seconds to wait before retrying while the shard deciding for `model` sheds
        `tier` (its status no older than STATUS_FRESH_S at wall time `now`), else None."""
        status = next(
            (s for s in self._by_shard.values() if model in s.models), self._by_shard.get("")
        )
        if status is None or status.sent_at < now - STATUS_FRESH_S:
            return None
        tier_status = status.tiers.get(tier)
        if tier_status is None or not tier_status.shedding:
            return None
        return tier_status.retry_after_s or 1.0

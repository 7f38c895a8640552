"""Deleting the delivery topics of gateways that are gone: every `interval_s` the
scheduler lists the `chat.deliver.*` topics and deletes those `GatewayWatch.gone_topics`
names (the decision is there, pure; the listing and deleting here, over the bus).

A gateway judged gone that comes back (a pause longer than the TTL) creates its topic
again (`bus.request_reply`). A sweep that fails is logged and tried again at the next.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection

from bus.clients import KafkaConfig
from bus.topics import delete_topics, list_topics
from ops import metrics
from scheduler.gateways import GatewayWatch
from schemas import topics

log = logging.getLogger(__name__)


class DeliveryTopicJanitor:
    def __init__(
        self,
        kafka: KafkaConfig,
        watch: GatewayWatch,
        delivering: Callable[[], Collection[str]],
        interval_s: float,
        acting: Callable[[], bool] = lambda: True,
    ) -> None:
        """`delivering`: the delivery topics requests waiting or running deliver to;
        `acting`: whether this scheduler acts (a fenced one deletes nothing)."""
        self.kafka = kafka
        self.watch = watch
        self.delivering = delivering
        self.interval_s = interval_s
        self.acting = acting

    async def run(self) -> None:
        """Sweep every `interval_s` until cancelled; nothing when the TTL is 0."""
        if self.watch.topic_ttl_s <= 0:
            return
        while True:
            await asyncio.sleep(self.interval_s)
            if not self.acting():
                continue
            try:
                await self.sweep()
            except Exception:  # the next sweep tries again
                log.warning("sweeping delivery topics failed", exc_info=True)

    async def sweep(self) -> list[str]:
        """Delete the delivery topics of gateways gone at this moment; returns them."""
        listed = await list_topics(self.kafka, topics.DELIVER_PREFIX)
        gone = self.watch.gone_topics(listed, self.delivering(), time.monotonic())
        deleted = await delete_topics(self.kafka, gone)
        self.watch.deleted(deleted)
        if deleted:
            metrics.DELIVERY_TOPICS_DELETED.inc(len(deleted))
            log.info(
                "deleted the delivery topics of %d gone gateways: %s",
                len(deleted),
                ", ".join(deleted),
            )
        return deleted

"""Billing's Kafka adapter: `chat.usage` in, the usage ledger updated.

Commit policy: an offset is committed only after its event is in the ledger
(the handler awaits the write, retrying while the ledger's store fails for a while;
commits happen after each poll batch). A
restart re-reads what was not committed; the ledger charges each request the
most any of its events reports, so a redelivery never double counts. An event
that fails to parse goes to chat.dlq (`bus.subscriber.consume`) and is
committed past.
"""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord, TopicPartition

from billing.core import charges_for, usage_key
from billing.ledger import UsageLedger
from bus.clients import KafkaConfig
from bus.offsets import ForgetRevoked, OffsetTracker
from bus.produce_failures import RetryingPublisher
from bus.subscriber import consume, decode_record
from common.durable import retried
from schemas import topics
from schemas.events import UsageEvent

STAGE = "billing"
GROUP = "chatpipe-billing"


class BillingStage:
    def __init__(self, kafka: KafkaConfig, ledger: UsageLedger) -> None:
        self.kafka = kafka
        self.ledger = ledger
        self.tracker = OffsetTracker()

    async def run(self) -> None:
        producer = self.kafka.producer()
        self.consumer = self.kafka.consumer(group_id=GROUP, bulk=True)
        self.consumer.subscribe([topics.USAGE], listener=ForgetRevoked(self.tracker))
        await producer.start()
        await self.consumer.start()
        try:
            await consume(self.consumer, STAGE, RetryingPublisher(producer), self._handle,
                          self._commit, tracker=self.tracker)
        finally:
            await self.consumer.stop()
            await producer.stop()

    async def _handle(self, record: ConsumerRecord) -> None:
        event = decode_record(UsageEvent, record)
        await retried(lambda: self.ledger.record(usage_key(event), charges_for(event)),
                      f"billing {event.request_id}")
        self.tracker.seen(TopicPartition(record.topic, record.partition), record.offset)

    async def _commit(self) -> None:
        offsets = self.tracker.to_commit()
        if offsets:
            await self.consumer.commit(offsets)
            self.tracker.committed(offsets)

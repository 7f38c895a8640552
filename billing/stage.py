"""Billing's Kafka adapter: `chat.usage` in, the usage ledger updated.

Commit policy (`bus.stage_runner`): an offset is committed only after its event is in
the ledger (the handler awaits the write, retrying while the ledger's store fails for a
while; commits happen after each poll batch). A restart re-reads what was not
committed; the ledger charges each request the most any of its events reports, so a
redelivery never double counts. An event that fails to parse goes to chat.dlq and is
committed past.
"""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from billing.core import charges_for, usage_key
from bus.clients import KafkaConfig
from bus.stage_runner import RunnerOptions, Stage, StageRunner
from bus.subscriber import decode_record
from common.durable import retried
from ledger.store import UsageLedger
from schemas import topics
from schemas.events import UsageEvent

STAGE = "billing"
GROUP = "chatpipe-billing"


class BillingStage(Stage):
    def __init__(self, kafka: KafkaConfig, ledger: UsageLedger) -> None:
        self.ledger = ledger
        self.runner = StageRunner(
            kafka, STAGE, GROUP, [topics.USAGE], self, RunnerOptions(bulk=True)
        )

    async def run(self) -> None:
        await self.runner.run()

    async def handle(self, record: ConsumerRecord) -> None:
        event = decode_record(UsageEvent, record)
        await retried(
            lambda: self.ledger.record(usage_key(event), charges_for(event)),
            f"billing {event.request_id}",
        )

"""Topic provisioning: every topic is created explicitly, never auto-created."""

from __future__ import annotations

import logging

from aiokafka.admin import NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from bus.clients import KafkaConfig, kafka_config
from chatpipe.settings import Settings
from schemas import topics

log = logging.getLogger(__name__)


def topic_partitions(settings: Settings) -> dict[str, int]:
    """Partition count of every shared topic."""
    counts = {name: settings.topic_partitions for name in topics.shared_topics()}
    counts[topics.WORK] = settings.work_partitions
    counts[topics.SCHEDULER] = 1  # one writer; readers want its newest status
    return counts


async def create_topics(
    kafka: KafkaConfig | str, partitions: dict[str, int], replication_factor: int = 1
) -> list[str]:
    """Create the missing topics; returns the names created."""
    admin = kafka_config(kafka).admin()
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(name, num_partitions=count, replication_factor=replication_factor)
            for name, count in partitions.items()
            if name not in existing
        ]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                log.info("topics created concurrently by another process")
        return [topic.name for topic in missing]
    finally:
        await admin.close()


async def ensure_topics(kafka: KafkaConfig | str, settings: Settings) -> list[str]:
    """The shared topics; a bare address gets this process's credential from `settings`."""
    if isinstance(kafka, str):
        kafka = KafkaConfig.from_settings(settings, kafka)
    return await create_topics(
        kafka, topic_partitions(settings), settings.kafka_replication_factor
    )

"""Topic provisioning: every topic is created explicitly, never auto-created; delivery
topics of gateways that are gone are deleted (`scheduler.delivery_topics`)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import NewTopic
from aiokafka.errors import (
    NoError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.structs import TopicPartition

from bus.clients import KafkaConfig, kafka_config
from schemas import topics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicLayout:
    """How the shared topics are made: partitions and replication."""

    topic_partitions: int = 2
    """Of each shared topic but chat.work."""
    work_partitions: int = 4
    """Of chat.work: at most this many workers."""
    replication_factor: int = 1
    shards: tuple[str, ...] = ()
    """Named scheduler shards: each has its own chat.work.<shard>, as chat.work."""

    def partitions(self) -> dict[str, int]:
        """Partition count of every shared topic."""
        counts = {name: self.topic_partitions for name in topics.shared_topics()}
        for shard in ("", *self.shards):
            counts[topics.work_topic(shard)] = self.work_partitions
        counts[topics.SCHEDULER] = 1  # one writer; readers want its newest status
        counts[topics.ROLLOUT] = 1  # every gateway reads it all, in the order it was set
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


async def ensure_topics(
    kafka: KafkaConfig | str,
    layout: TopicLayout = TopicLayout(),
) -> list[str]:
    """The shared topics, laid out as `layout` says; returns the names created."""
    return await create_topics(kafka, layout.partitions(), layout.replication_factor)


async def topic_partitions(
    consumer: AIOKafkaConsumer, topic: str, wait_s: float = 0.0
) -> list[TopicPartition]:
    """The partitions of `topic`, in order, from freshly read metadata; waits up to
    `wait_s` for a topic just created, then LookupError."""
    deadline = time.monotonic() + wait_s
    while True:
        await consumer.topics()  # refreshes metadata
        partitions = consumer.partitions_for_topic(topic)
        if partitions:
            return [TopicPartition(topic, p) for p in sorted(partitions)]
        if time.monotonic() >= deadline:
            raise LookupError(f"topic {topic} does not exist: create the topics first")
        await asyncio.sleep(0.1)


async def list_topics(kafka: KafkaConfig | str, prefix: str = "") -> list[str]:
    """The names of the topics that start with `prefix`, sorted."""
    admin = kafka_config(kafka).admin()
    await admin.start()
    try:
        return sorted(name for name in await admin.list_topics() if name.startswith(prefix))
    finally:
        await admin.close()


async def delete_topics(kafka: KafkaConfig | str, names: list[str]) -> list[str]:
    """Delete `names`; returns those deleted. One already gone counts as deleted; one
    the broker refuses is logged and left."""
    if not names:
        return []
    admin = kafka_config(kafka).admin()
    await admin.start()
    try:
        response = await admin.delete_topics(names)
    finally:
        await admin.close()
    deleted = []
    for name, code, *_ in response.topic_error_codes:
        error = for_code(code)
        if error is NoError or error is UnknownTopicOrPartitionError:
            deleted.append(name)
        else:
            log.warning("topic %s not deleted: %s", name, error.__name__)
    return deleted

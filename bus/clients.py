"""Kafka clients built from one connection value, and the event publisher every stage uses."""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, errors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.helpers import create_ssl_context
from aiokafka.partitioner import DefaultPartitioner, murmur2
from aiokafka.structs import RecordMetadata

from bus.fetch_pace import FetchPace, PacedConsumer
from schemas.codec import encode, headers
from schemas.events import Event


@dataclass(frozen=True)
class KafkaConfig:
    """Connection and client tuning shared by every client of one process (built from
    the settings in `chatpipe.wiring.kafka_from_settings`)."""

    bootstrap_servers: str
    compression: str | None = "lz4"
    idempotence: bool = False
    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 1000
    fetch_max_wait_ms: int = 20
    bulk_fetch_max_wait_ms: int = 100
    idle_fetch_wait_ms: int = 0
    """The fetch wait of a consumer idle for `idle_after_s` (bus.fetch_pace); 0: none."""
    idle_after_s: float = 10.0
    loaded_fetch_wait_ms: int = 0
    """The fetch wait of a consumer whose stage carries `loaded_streams` or more; 0: none."""
    loaded_streams: int = 32
    first_event_fetch_wait_ms: int = 0
    """The fetch wait of a consumer whose stage awaits a stream's first event (below
    `loaded_streams`); 0: `fetch_max_wait_ms`."""
    linger_ms: int = 0
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "SCRAM-SHA-512"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    client_id: str = "chatpipe"
    """How this process's clients name themselves to the broker (its logs, quotas)."""

    def __post_init__(self) -> None:
        if self.security_protocol.startswith("SASL_") and not (
            self.sasl_username and self.sasl_password
        ):
            raise ValueError(
                f"{self.security_protocol} needs CHATPIPE_KAFKA_SASL_USERNAME and "
                "CHATPIPE_KAFKA_SASL_PASSWORD (this stage's Kafka credential)"
            )

    def connection(self) -> dict[str, Any]:
        """aiokafka's keywords for reaching the broker, the same for every producer,
        consumer and admin client: its address and this process's credential."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol.startswith("SASL_"):
            kwargs |= {
                "sasl_mechanism": self.sasl_mechanism,
                "sasl_plain_username": self.sasl_username,
                "sasl_plain_password": self.sasl_password,
            }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs["ssl_context"] = create_ssl_context(cafile=self.ssl_cafile)
        return kwargs

    def admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self.connection())

    def producer(self) -> AIOKafkaProducer:
        # Idempotence only where the broker supports it: Tansu answers UnknownError.
        producer = AIOKafkaProducer(
            **self.connection(),
            compression_type=self.compression,
            enable_idempotence=self.idempotence,
            acks="all" if self.idempotence else 1,
            linger_ms=self.linger_ms,
            max_request_size=8 * 1024 * 1024,
            partitioner=keyed_partition,
        )
        _PRODUCERS[producer] = self.bootstrap_servers
        return producer

    def consumer(
        self,
        *topics: str,
        group_id: str | None = None,
        bulk: bool = False,
    ) -> PacedConsumer:
        """A consumer that never auto-commits: each stage decides when an event is done.

        `bulk`: off a stream's path (recorder, billing), so it fetches less often. Once
        idle (`consumer.busy_while` says when it is not) it fetches every
        `idle_fetch_wait_ms`, or QUIET_FACTOR times that for bulk consumers (nobody
        waits on them); while it says it carries `loaded_streams` or more, every
        `loaded_fetch_wait_ms`."""
        wait_ms = self.bulk_fetch_max_wait_ms if bulk else self.fetch_max_wait_ms
        idle_ms = self.idle_fetch_wait_ms * (QUIET_FACTOR if bulk else 1)
        eager_ms = 0 if bulk else self.first_event_fetch_wait_ms
        pace = None
        if idle_ms > wait_ms or self.loaded_fetch_wait_ms > wait_ms or 0 < eager_ms < wait_ms:
            pace = FetchPace(
                wait_ms,
                max(idle_ms, wait_ms),
                self.idle_after_s,
                loaded_ms=self.loaded_fetch_wait_ms,
                loaded_at=self.loaded_streams,
                eager_ms=eager_ms,
            )
        return PacedConsumer(
            *topics,
            pace=pace,
            **self.connection(),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            fetch_max_wait_ms=wait_ms,
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )


QUIET_FACTOR = 4


def kafka_config(kafka: KafkaConfig | str) -> KafkaConfig:
    """`kafka` itself, or a plain connection to the broker at that address (the embedded
    broker, tests and benchmarks)."""
    return kafka if isinstance(kafka, KafkaConfig) else KafkaConfig(bootstrap_servers=kafka)


def keyed_partition(
    key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
) -> int:
    """Kafka's default partitioner (murmur2 of the key, as the Java client), with the hash
    cached: every chunk of a conversation carries the same key, and aiokafka's murmur2
    is pure Python."""
    if key is None:
        return DefaultPartitioner()(key, all_partitions, available)
    return all_partitions[_key_hash(key) % len(all_partitions)]


@functools.lru_cache(maxsize=65536)
def _key_hash(key: bytes) -> int:
    return murmur2(key) & 0x7FFFFFFF


_PRODUCERS: weakref.WeakKeyDictionary[AIOKafkaProducer, str] = weakref.WeakKeyDictionary()
"""Every producer this process made (`KafkaConfig.producer`), with the broker it writes to."""


class BrokerGone(errors.KafkaConnectionError):
    """The broker these records were for is gone with everything it held."""


async def drop_pending_writes(bootstrap_servers: str) -> int:
    """Stop every producer of this process that writes to `bootstrap_servers` from
    writing what it still holds for that broker, which died with all it had (an
    embedded broker), and fail those records: the embedded broker takes a write to a
    topic before the topic is created again, and then fails the partition's next
    write. A producer whose records were dropped sends nothing more: whoever goes on
    needs a new one. Producers writing to other brokers are left alone. How many
    records were dropped."""
    dropped = 0
    gone = BrokerGone("the broker restarted empty")
    for producer, broker in list(_PRODUCERS.items()):
        if broker != bootstrap_servers:
            continue  # another broker's (a second stack in this process)
        sender = producer._sender  # aiokafka has no API for this
        if sender is None or sender.sender_task is None:
            continue  # never started
        await sender.close()  # nothing it holds is sent any more
        accumulator = producer._message_accumulator
        held = [b for q in accumulator._batches.values() for b in q]
        held += list(accumulator._pending_batches)
        dropped += sum(batch.record_count for batch in held)
        accumulator.fail_all(gone)
    return dropped


UNKNOWN_ERROR_RETRIES = 2
"""`send_and_wait`s sent again after an error the broker gives no reason for: the
embedded broker fails the first write to a partition that was written to before it
created the partition again after a restart, and takes the next."""
UNKNOWN_ERROR_PAUSE_S = 0.05


class Publisher:
    """Sends events with their headers; `send` enqueues, `flush` waits for acks."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    async def send(
        self, topic: str, event: Event, key: str | None = None, partition: int | None = None
    ) -> asyncio.Future[RecordMetadata]:
        """Enqueue `event`; the returned future resolves when the broker has it."""
        return await self.producer.send(
            topic,
            encode(event),
            key=key.encode() if key is not None else None,
            partition=partition,
            headers=headers(event),
        )

    async def send_and_wait(
        self, topic: str, event: Event, key: str | None = None, partition: int | None = None
    ) -> RecordMetadata:
        """Send `event` and wait until the broker has it; an error without a reason is
        tried again `UNKNOWN_ERROR_RETRIES` times before it is raised."""
        value, encoded_key = encode(event), key.encode() if key is not None else None
        retries = 0
        while True:
            try:
                return await self.producer.send_and_wait(
                    topic, value, key=encoded_key, partition=partition, headers=headers(event)
                )
            except errors.UnknownError:
                if retries == UNKNOWN_ERROR_RETRIES:
                    raise
                retries += 1
                await asyncio.sleep(UNKNOWN_ERROR_PAUSE_S)

    async def flush(self) -> None:
        await self.producer.flush()

"""The Kafka settings of a process (environment `CHATPIPE_KAFKA_*`, composed into
`chatpipe.settings.Settings`) and the topics' partitions; the clients themselves are
built from the connection value they make (`KafkaSettings.client`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr

from bus.clients import KafkaConfig
from bus.topics import TopicLayout


class KafkaSettings(BaseModel):
    """How this process reaches Kafka and tunes its clients."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    bootstrap_servers: str | None = Field(
        None,
        validation_alias=AliasChoices(
            "CHATPIPE_KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"
        ),
        description="external Kafka; unset = start the embedded Tansu broker",
    )
    idempotence: bool = Field(
        False, description="idempotent producer; Apache Kafka only (Tansu rejects it)"
    )
    compression: Literal["lz4", "zstd", "gzip", "none"] = Field(
        "lz4", description="producer compression"
    )
    replication_factor: int = Field(
        1, description="replication of the topics `chatpipe topics create` makes"
    )
    session_timeout_ms: int = Field(
        6000, description="a consumer silent this long leaves its group (its partitions move)"
    )
    heartbeat_interval_ms: int = Field(1000, description="consumer group heartbeat")
    fetch_max_wait_ms: int = Field(
        20,
        ge=1,
        description="fetch wait of the stages on a stream's path (scheduler, worker, "
        "safety, gateway). Tansu answers a fetch only after this wait (Apache Kafka returns as "
        "soon as data is there), so each hop adds up to it: lower = faster, more fetches",
    )
    bulk_fetch_max_wait_ms: int = Field(
        100,
        ge=1,
        description="fetch wait of the stages off the stream's path "
        "(recorder, billing): fewer, larger fetches",
    )
    idle_fetch_wait_ms: int = Field(
        500,
        ge=0,
        description="fetch wait of a consumer with nothing to do for "
        "kafka_idle_after_s (4x for consumers nobody waits on; 0 = never longer): an idle "
        "stack fetches less, and the first request after a quiet spell waits up to this long "
        "once per hop (Apache Kafka answers a fetch when data comes: there it costs nothing)",
    )
    idle_after_s: float = Field(
        10.0,
        ge=0,
        description="a consumer with no work this long fetches every kafka_idle_fetch_wait_ms",
    )
    loaded_fetch_wait_ms: int = Field(
        50,
        ge=0,
        description="fetch wait of a stream-path stage while it carries "
        "kafka_loaded_streams streams or more (0 = never longer): under load fewer, larger "
        "fetches (on Tansu each busy fetch takes its whole wait), each hop up to this long",
    )
    first_event_fetch_wait_ms: int = Field(
        5,
        ge=0,
        description="fetch wait of the gateway and safety while a stream's first "
        "event is on its way to them (below kafka_loaded_streams; 0 = kafka_fetch_max_wait_ms): "
        "a few ms less per hop of the time to first token on a broker that answers fetches on "
        "their wait (Tansu)",
    )
    loaded_streams: int = Field(
        32,
        ge=1,
        description="streams a stage carries from which it fetches every "
        "kafka_loaded_fetch_wait_ms",
    )
    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = Field(
        "PLAINTEXT",
        description="how the stages reach Kafka; compose and k8s use SASL_PLAINTEXT "
        "with one SCRAM credential per stage (the embedded broker: PLAINTEXT on loopback)",
    )
    sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism with a SASL_* security protocol"
    )
    sasl_username: str | None = Field(None, description="this stage's Kafka user")
    sasl_password: SecretStr | None = Field(None, description="this stage's Kafka password")
    ssl_cafile: Path | None = Field(
        None, description="CA bundle for SSL / SASL_SSL; unset = the system's"
    )
    linger_ms: int = Field(
        0, ge=0, description="producer linger: waiting this long lets more events share a request"
    )
    embedded_broker_spin_cpu: float = Field(
        0.0,
        ge=0,
        description="chatpipe up: the embedded broker using more than this share of a core "
        "while no stream is open, for embedded_broker_spin_s, is restarted (it spins and "
        "stalls answers after a while under load); 0 = never (the default: a replay of "
        "large topics also keeps it busy with nothing streaming)",
    )
    embedded_broker_spin_s: float = Field(
        20.0, gt=0, description="how long the embedded broker may spin while idle"
    )

    def client(self, bootstrap_servers: str) -> KafkaConfig:
        """The broker at `bootstrap_servers`, with this process's credential and tuning."""
        password = self.sasl_password
        return KafkaConfig(
            bootstrap_servers=bootstrap_servers,
            compression=None if self.compression == "none" else self.compression,
            idempotence=self.idempotence,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            fetch_max_wait_ms=self.fetch_max_wait_ms,
            bulk_fetch_max_wait_ms=self.bulk_fetch_max_wait_ms,
            idle_fetch_wait_ms=self.idle_fetch_wait_ms,
            idle_after_s=self.idle_after_s,
            loaded_fetch_wait_ms=self.loaded_fetch_wait_ms,
            loaded_streams=self.loaded_streams,
            first_event_fetch_wait_ms=self.first_event_fetch_wait_ms,
            linger_ms=self.linger_ms,
            security_protocol=self.security_protocol,
            sasl_mechanism=self.sasl_mechanism,
            sasl_username=self.sasl_username,
            sasl_password=password.get_secret_value() if password is not None else None,
            ssl_cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
        )


class TopicSettings(BaseModel):
    """The partitions of the topics `chatpipe topics create` (and the embedded broker) make."""

    # Each fetch costs the broker per partition, and Tansu answers fetches on a timer:
    # few partitions suit one machine; a cluster sets more (docker-compose.yml, k8s/: 8).
    topic_partitions: int = Field(2, ge=1, description="partitions of the shared topics")
    work_partitions: int = Field(
        4, ge=1, description="partitions of chat.work: at most this many workers"
    )

    def layout(self, replication_factor: int, shards: tuple[str, ...] = ()) -> TopicLayout:
        return TopicLayout(
            self.topic_partitions, self.work_partitions, replication_factor, shards=shards
        )

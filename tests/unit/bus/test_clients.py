"""Kafka clients: every one connects with the process's credential, and the producer's
partitioner places keys as Kafka's default one does, with the key hash cached."""

import os
import ssl

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import DefaultPartitioner

from bus.clients import KafkaConfig, kafka_config, keyed_partition
from chatpipe.settings import Settings
from chatpipe.wiring import kafka_from_settings


def test_keyed_partition_places_keys_as_kafkas_default_partitioner():
    for partitions in ([0], [0, 1], list(range(8)), list(range(12))):
        for _ in range(300):
            key = os.urandom(16).hex().encode()
            assert keyed_partition(key, partitions, partitions) == DefaultPartitioner()(
                key, partitions, partitions
            )


def test_a_key_keeps_its_partition_and_no_key_goes_to_an_available_one():
    key = b"conversation-1"
    assert len({keyed_partition(key, [0, 1, 2, 3], [0, 1, 2, 3]) for _ in range(20)}) == 1
    assert {keyed_partition(None, [0, 1, 2, 3], [2]) for _ in range(20)} == {2}


# --- connection: every client gets the process's credential --------------------------------

SASL_ENV = {
    "KAFKA_BOOTSTRAP_SERVERS": "kafka:9092",
    "CHATPIPE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "CHATPIPE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "CHATPIPE_KAFKA_SASL_USERNAME": "scheduler",
    "CHATPIPE_KAFKA_SASL_PASSWORD": "s3cret-hex",
}


def sasl_config(monkeypatch, **env: str) -> KafkaConfig:
    for name, value in {**SASL_ENV, **env}.items():
        monkeypatch.setenv(name, value)
    return kafka_from_settings(Settings(), "kafka:9092")


def test_settings_carry_the_sasl_credential_to_the_connection(monkeypatch):
    kafka = sasl_config(monkeypatch)
    assert kafka.connection() == {
        "bootstrap_servers": "kafka:9092",
        "client_id": "chatpipe",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "scheduler",
        "sasl_plain_password": "s3cret-hex",
    }
    assert "s3cret-hex" not in repr(kafka), "the password would reach the logs"


def test_sasl_ssl_adds_a_verifying_tls_context(monkeypatch):
    kafka = sasl_config(monkeypatch, CHATPIPE_KAFKA_SECURITY_PROTOCOL="SASL_SSL")
    context = kafka.connection()["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_plaintext_sends_no_credential():
    assert KafkaConfig("localhost:9092").connection() == {
        "bootstrap_servers": "localhost:9092",
        "client_id": "chatpipe",
        "security_protocol": "PLAINTEXT",
    }
    assert kafka_config("127.0.0.1:1").connection()["security_protocol"] == "PLAINTEXT"


def test_sasl_without_a_password_refuses_to_start(monkeypatch):
    monkeypatch.delenv("CHATPIPE_KAFKA_SASL_PASSWORD", raising=False)
    for name, value in SASL_ENV.items():
        if name != "CHATPIPE_KAFKA_SASL_PASSWORD":
            monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="CHATPIPE_KAFKA_SASL_PASSWORD"):
        kafka_from_settings(Settings(), "kafka:9092")


def _client_settings(client) -> tuple[str, str | None, str | None]:
    """What aiokafka's connection layer of `client` will use (aiokafka 0.14 internals)."""
    inner = getattr(client, "_client", None) or getattr(client, "client", None)
    return inner._security_protocol, inner._sasl_plain_username, inner._sasl_plain_password


async def test_every_producer_consumer_and_admin_client_authenticates(monkeypatch):
    """The clients the stages make (KafkaConfig) and the helpers' own (bus.replay,
    bus.topics) all take the stage's credential: none falls back to PLAINTEXT."""
    from bus import replay

    kafka = sasl_config(monkeypatch)
    made = [
        kafka.producer(),
        kafka.consumer("chat.work", group_id="g"),
        kafka.consumer(),
        kafka.admin(),
        replay._reader(kafka),
    ]
    expected = ("SASL_PLAINTEXT", "scheduler", "s3cret-hex")
    for client in made:
        assert isinstance(client, AIOKafkaProducer | AIOKafkaConsumer | AIOKafkaAdminClient)
        assert _client_settings(client) == expected, type(client).__name__
    for client in made:
        close = getattr(client, "stop", None) or client.close
        await close()

"""The embedded broker (Tansu, `chatpipe up` and the tests) has no users or ACLs, so it
must be reachable from this machine only: every socket it listens on is on loopback."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from bus.broker import EmbeddedBroker
from bus.clients import BrokerGone, KafkaConfig, drop_pending_writes
from bus.topics import create_topics

LISTEN = "0A"  # TCP state in /proc/net/tcp*


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed since the listing: not a listener
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != LISTEN or inode not in inodes:
                continue
            address, port = local.split(":")
            raw = bytes.fromhex(address)
            # /proc prints the address as 32-bit words in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def other_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: only picks the route
        except OSError:
            return []
        address = probe.getsockname()[0]
    return [] if address.startswith("127.") else [address]


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
async def test_the_embedded_broker_listens_on_loopback_only(monkeypatch):
    # Tansu reads its listener from the environment too: the broker's own flag must win.
    monkeypatch.setenv("LISTENER_URL", "tcp://0.0.0.0:19092")
    async with EmbeddedBroker() as broker:
        assert broker.host == "127.0.0.1"
        listening = listening_addresses(broker._process.pid)
        assert listening == {("127.0.0.1", broker.port)}, listening
        for address in other_addresses():
            with pytest.raises(OSError):
                socket.create_connection((address, broker.port), timeout=2).close()


async def test_chatpipe_up_reaches_its_embedded_broker_plaintext_whatever_is_configured():
    """A SASL setting meant for a real Kafka does not break `chatpipe up`: Tansu has no
    users, so the stages reach it PLAINTEXT (on loopback)."""
    import contextlib

    from chatpipe.settings import Settings
    from chatpipe.wiring import open_kafka

    settings = Settings(
        kafka_bootstrap_servers=None,
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_username="gateway",
        kafka_sasl_password="x",
    )
    async with contextlib.AsyncExitStack() as stack:
        kafka = await open_kafka(settings, stack)
        assert kafka.security_protocol == "PLAINTEXT"
        assert kafka.bootstrap_servers.startswith("127.0.0.1:")
        admin = kafka.admin()
        await admin.start()
        try:
            assert "chat.work" in await admin.list_topics()
        finally:
            await admin.close()


async def test_writes_held_for_a_dead_broker_are_dropped_not_written_to_the_next_one():
    """Tansu takes a write to a topic it does not have yet; once that topic is created,
    the partition's next write fails. So what producers still hold when the broker dies
    is dropped (`drop_pending_writes`), and the new broker gets no early write. A
    producer of the same process writing to another broker keeps writing."""
    async with EmbeddedBroker() as broker, EmbeddedBroker() as other_broker:
        kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers)
        other = KafkaConfig(bootstrap_servers=other_broker.bootstrap_servers)
        await create_topics(kafka, {"t": 1})
        await create_topics(other, {"t": 1})
        producer, bystander = kafka.producer(), other.producer()
        await producer.start()
        await bystander.start()
        try:
            await producer.send_and_wait("t", b"before", partition=0)
            broker.stop()
            held = await producer.send("t", b"held", partition=0)
            assert await drop_pending_writes(broker.bootstrap_servers) >= 1
            with pytest.raises(BrokerGone):
                await held
            still = await bystander.send_and_wait("t", b"unharmed", partition=0)
            assert still.offset == 0
        finally:
            await producer.stop()
            await bystander.stop()
        await broker.restart()
        await create_topics(kafka, {"t": 1})
        fresh = kafka.producer()
        await fresh.start()
        try:
            written = await fresh.send_and_wait("t", b"after", partition=0)
        finally:
            await fresh.stop()
        reader = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
        await reader.start()
        try:
            reader.assign([TopicPartition("t", 0)])
            reader.seek(TopicPartition("t", 0), 0)
            fetched = await reader.getmany(timeout_ms=3000)
        finally:
            await reader.stop()
    assert written.offset == 0
    assert [r.value for records in fetched.values() for r in records] == [b"after"]

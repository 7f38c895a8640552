"""`python -m bench broker_clients`: what other Kafka clients meet on the embedded broker
(Tansu), measured on a fresh one: where `ListOffsets` says a partition ends against
where a fetch says it does, how long a consumer group's first assignment takes with
librdkafka's default session timeout, a short one, and `assign()`, and whether `kcat`
can talk to it at all. `docs/operating/embedded-broker.md` states the results.

    pip install confluent-kafka   # into a venv of its own (not a dependency)
    .venv/bin/python -m bench broker_clients --confluent /path/to/venv/bin/python

Without `--confluent` (or without `kcat` on the PATH) those parts are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from bus.broker import EmbeddedBroker
from bus.clients import KafkaConfig
from bus.topics import create_topics

TOPIC = "probe"
BATCHES = (100, 7)
"""Records produced in two batches: ListOffsets answers from the last batch's start."""

_GROUP_PROBE = """
import json, sys, time
from confluent_kafka import Consumer, TopicPartition, libversion
bootstrap, mode, topic, records = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
conf = {"bootstrap.servers": bootstrap, "group.id": "probe-" + mode,
        "auto.offset.reset": "earliest"}
if mode == "session_timeout_6s":
    conf["session.timeout.ms"] = 6000
consumer = Consumer(conf)
started = time.monotonic()
if mode == "assign":
    consumer.assign([TopicPartition(topic, 0, 0)])
else:
    consumer.subscribe([topic])
read = 0
while read < records and time.monotonic() - started < 90:
    message = consumer.poll(0.5)
    if message is not None and not message.error():
        read += 1
took = time.monotonic() - started
low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)
consumer.close()
print(json.dumps({"librdkafka": libversion()[0], "read": read, "first_records_s": round(took, 1),
                  "watermark_high": high}))
"""


async def offsets(bootstrap: str) -> dict[str, int]:
    """Records written, ListOffsets' end (aiokafka `end_offsets`), the fetch's high
    watermark."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for size in BATCHES:
            sent = [await producer.send(TOPIC, b"%d" % i) for i in range(size)]
            await asyncio.gather(*sent)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        listed = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, 0)
        read = 0
        while read < sum(BATCHES):
            batch = await consumer.getmany(timeout_ms=2000)
            if not batch:
                break
            read += sum(len(records) for records in batch.values())
        return {
            "written": sum(BATCHES),
            "list_offsets_end": listed,
            "fetch_high_watermark": consumer.highwater(tp) or 0,
        }
    finally:
        await consumer.stop()


def group_joins(python: str, bootstrap: str) -> dict[str, object]:
    """A confluent-kafka consumer reading the topic: by group at librdkafka's defaults,
    with a 6 s session timeout, and by `assign()`."""
    found: dict[str, object] = {}
    for mode in ("assign", "session_timeout_6s", "default_session_timeout"):
        run = subprocess.run(
            [python, "-c", _GROUP_PROBE, bootstrap, mode, TOPIC, str(sum(BATCHES))],
            capture_output=True, text=True, timeout=150,
        )  # fmt: skip
        found[mode] = json.loads(run.stdout) if run.returncode == 0 else run.stderr[-300:]
    return found


def kcat(bootstrap: str) -> dict[str, object]:
    """`kcat -L` (list the broker's metadata)."""
    binary = shutil.which("kcat")
    if binary is None:
        return {"skipped": "no kcat on the PATH"}
    about = subprocess.run([binary, "-V"], capture_output=True, text=True).stdout
    version = next((line for line in about.splitlines() if line.startswith("Version")), "")
    run = subprocess.run(
        [binary, "-b", bootstrap, "-L", "-m", "5"], capture_output=True, text=True, timeout=30
    )
    return {
        "version": version.split(" builtin")[0],
        "exit_code": run.returncode,
        "error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "",
    }


async def measure(confluent: str | None) -> dict[str, object]:
    async with EmbeddedBroker() as broker:
        kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers)
        await create_topics(kafka, {TOPIC: 1})
        found: dict[str, object] = {"offsets": await offsets(broker.bootstrap_servers)}
        if confluent is not None:
            found["confluent_kafka"] = await asyncio.to_thread(
                group_joins, confluent, broker.bootstrap_servers
            )
        found["kcat"] = await asyncio.to_thread(kcat, broker.bootstrap_servers)
        return found


def cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench broker_clients")
    parser.add_argument("--confluent", help="a python that has confluent-kafka installed")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args(argv)
    found = asyncio.run(measure(args.confluent))
    text = json.dumps(found, indent=2)
    (args.out / "broker_clients.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    cli(sys.argv[1:])

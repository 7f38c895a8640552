"""`chatpipe replay` and `chatpipe dlq` against the real broker of a running sim stack,
run as an operator runs them: the command line in its own process, finding the broker
from KAFKA_BOOTSTRAP_SERVERS or from a running `chatpipe up`'s runtime file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from bench.topic_log import find_events
from bus.clients import Publisher
from bus.dead_letters import dead_letter
from bus.replay import offsets_at
from bus.topics import create_topics
from ledger.charges import Account
from ledger.periods import period_of
from ledger.store import SQLiteLedger
from ops.time_bounds import time_offsets_believable
from schemas import topics
from schemas.codec import encode
from schemas.events import DeadLetter, UsageEvent
from schemas.lifecycle import RequestStatus
from schemas.sse import SSEMessage, parse_messages, read_messages
from schemas.topics import Tier
from tests.support.chat import post_message, until
from tests.support.stack import client_for
from tests.support.tool_calls import sdk

pytestmark = pytest.mark.timeout(300)

FILLER = " ".join(f"word{i}" for i in range(150))
TRIPPING = f"[[sim:reply=Sure. You can write to bob@example.com for the details. {FILLER}]]"
ENV_BROKER = ("KAFKA_BOOTSTRAP_SERVERS", "CHATPIPE_KAFKA_BOOTSTRAP_SERVERS")


async def cli(
    *args: str, kafka: str | None, cwd: Path | None = None, **env: str
) -> tuple[int, str, str]:
    """`chatpipe ARGS` in its own process: (exit code, stdout, stderr)."""
    environ = {k: v for k, v in os.environ.items() if k not in ENV_BROKER} | env
    if kafka is not None:
        environ["KAFKA_BOOTSTRAP_SERVERS"] = kafka
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "chatpipe.cli",
        *args,
        env=environ,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode, out.decode(), err.decode()


async def json_lines(stack, *args: str) -> list[dict[str, Any]]:
    code, out, err = await cli(*args, kafka=stack.kafka.bootstrap_servers)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


async def life(stack, request_id: str) -> list[dict[str, Any]]:
    # Usage is the last record a finished request makes: wait for it before replaying.
    await find_events(
        stack.kafka, topics.USAGE, UsageEvent, lambda u: u.request_id == request_id, timeout_s=30
    )
    return await json_lines(stack, "replay", "request", request_id)


def kinds(lines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(line["topic"], line["event"]["type"] if line["event"] else "raw") for line in lines]


def first(lines: list[dict[str, Any]], topic_prefix: str, kind: str) -> int:
    return next(
        i
        for i, line in enumerate(lines)
        if line["topic"].startswith(topic_prefix)
        and line["event"]
        and line["event"]["type"] == kind
    )


def as_shown(events: list[tuple[str | None, str | None, str]]) -> list[tuple[str, Any, Any]]:
    """A native stream's events, each delta run joined into one with the id of its last:
    the gateway joins the deltas that arrive together, which the bus cannot tell."""
    shown: list[tuple[str, Any, Any]] = []
    for kind, event_id, data in events:
        kind = kind or "message"
        if kind == "delta":
            text = orjson.loads(data)["delta"]
            if shown and shown[-1][0] == "delta":
                text = shown[-1][2] + text
                shown.pop()
            shown.append((kind, event_id, text))
        else:
            shown.append((kind, event_id, data))
    return shown


async def assert_as_client_is_what_was_received(
    stack, request_id: str, received: list[SSEMessage]
) -> None:
    code, out, err = await cli(
        "replay", "request", request_id, "--as-client", kafka=stack.kafka.bootstrap_servers
    )
    assert code == 0, err
    rebuilt = [(m.event, m.id, m.data) for m in parse_messages(out)]
    assert as_shown(rebuilt) == as_shown([(e.event, e.id, e.data) for e in received])


def in_partition_order(lines: list[dict[str, Any]]) -> bool:
    seen: dict[tuple[str, int], int] = {}
    for line in lines:
        where = (line["topic"], line["partition"])
        if seen.get(where, -1) >= line["offset"]:
            return False
        seen[where] = line["offset"]
    return True


async def conversation(client) -> str:
    return (await client.post("/v1/conversations", json={})).json()["conversation_id"]


# --- replay request / conversation ------------------------------------------------------


async def test_a_requests_life_in_order_and_its_stream_as_the_client_got_it(sim_stack):
    async with client_for(sim_stack) as client:
        cid = await conversation(client)
        result = await post_message(
            client, cid, {"content": "[[sim:reply=Hello from the replay test]]", "max_tokens": 50}
        )
        second = await post_message(client, cid, {"content": "and again", "max_tokens": 5})
    assert result.ended_with_done and second.ended_with_done
    request_id = result.request["request_id"]
    lines = await life(sim_stack, request_id)

    assert {line["request_id"] for line in lines} == {request_id}
    # A stored answer's marker comes first (the gateway writes it before it queues).
    assert kinds(lines)[:2] == [(topics.ANSWERS, "started"), ("chat.requests.free", "request")]
    assert lines[0]["t_ms"] == 0 and lines[1]["event"]["conversation_id"] == cid
    for line in lines:
        assert isinstance(line["partition"], int) and isinstance(line["offset"], int)
        assert line["t_ms"] == line["timestamp_ms"] - lines[0]["timestamp_ms"]
        assert line["timestamp"].endswith("Z")
    assert in_partition_order(lines)
    assignment = first(lines, topics.WORK, "work")
    chunk = first(lines, topics.TOKENS, "chunk")
    delivered = first(lines, topics.DELIVER_PREFIX, "delta")
    usage = first(lines, topics.USAGE, "usage")
    # The worker reports usage right after its `done`, so usage may come before the
    # safety stage releases the text; it never comes before the worker's `done`.
    assert 1 < assignment < chunk < delivered, kinds(lines)
    assert first(lines, topics.TOKENS, "attempt") < chunk
    assert first(lines, topics.TOKENS, "done") < first(lines, topics.DELIVER_PREFIX, "done")
    assert first(lines, topics.TOKENS, "done") < usage, kinds(lines)
    assert lines[usage]["event"]["status"] == "finished_stopped"
    deliveries = [
        line["event"] for line in lines if line["topic"].startswith(topics.DELIVER_PREFIX)
    ]
    assert "".join(e["text"] for e in deliveries if e["type"] == "delta") == result.text

    await assert_as_client_is_what_was_received(sim_stack, request_id, result.events)
    assert await json_lines(sim_stack, "replay", "request", request_id, "--since", "10m") == lines
    code, _, err = await cli(
        "replay",
        "request",
        request_id,
        "--since",
        "2099-01-01",
        kafka=sim_stack.kafka.bootstrap_servers,
    )
    assert code == 1 and "no record of request" in err

    # The conversation: both turns in order (and its title's request, of the same
    # conversation), each request's records together with their request.
    whole = await json_lines(sim_stack, "replay", "conversation", cid)
    order = list(dict.fromkeys(line["request_id"] for line in whole))
    turns = [request_id, second.request["request_id"]]
    assert [rid for rid in order if rid in turns] == turns
    queued = {
        line["request_id"]: line["event"]
        for line in whole
        if line["topic"].startswith(topics.REQUESTS_PREFIX)
    }
    assert set(queued) == set(order) and {e["conversation_id"] for e in queued.values()} == {cid}
    assert [line for line in whole if line["request_id"] == request_id] == lines


async def test_a_completion_is_replayed_by_the_id_the_sdk_shows(sim_stack):
    completion = await sdk(sim_stack).chat.completions.create(
        model=sim_stack.settings.inference.model_name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
    )
    request_id = completion._request_id
    lines = await life(sim_stack, request_id)
    assert await json_lines(sim_stack, "replay", "request", completion.id) == lines
    queued = lines[first(lines, topics.REQUESTS_PREFIX, "request")]["event"]
    assert (queued["request_id"], queued["store"]) == (request_id, False)


async def test_a_cancelled_request(sim_stack):
    async with client_for(sim_stack) as client:
        cid = await conversation(client)
        body = {"content": "[[sim:length=2000]]", "max_tokens": 2000}
        async with client.stream(
            "POST", f"/v1/conversations/{cid}/messages", json=body
        ) as response:
            lines = response.aiter_lines()
            received = await read_messages(lines, stop=lambda e: e.event == "delta")
            request_id = orjson.loads(received[0].data)["request_id"]
            assert (await client.post(f"/v1/requests/{request_id}/cancel")).status_code == 202
            received += await read_messages(lines)
    assert received[-1].data == "[DONE]"
    replayed = await life(sim_stack, request_id)
    cancel = first(replayed, topics.CONTROL, "cancel")
    assert replayed[cancel]["event"]["reason"] == "cancelled_by_user"
    assert first(replayed, topics.DELIVER_PREFIX, "delta") < cancel
    usage = replayed[first(replayed, topics.USAGE, "usage")]["event"]
    assert usage["status"] == RequestStatus.FINISHED_ABORTED
    await assert_as_client_is_what_was_received(sim_stack, request_id, received)


async def test_a_request_retracted_by_safety(sim_stack):
    async with client_for(sim_stack) as client:
        result = await post_message(
            client, await conversation(client), {"content": TRIPPING, "max_tokens": 400}
        )
    assert result.of("retract"), [e.event for e in result.events]
    request_id = result.request["request_id"]
    lines = await life(sim_stack, request_id)
    decision = lines[first(lines, topics.MODERATION, "moderation")]["event"]
    assert (decision["action"], decision["category"]) == ("retract", "pii")
    assert first(lines, topics.DELIVER_PREFIX, "retract") < first(
        lines, topics.DELIVER_PREFIX, "done"
    )
    await assert_as_client_is_what_was_received(sim_stack, request_id, result.events)


async def test_an_unknown_request_is_an_error(sim_stack):
    code, out, err = await cli(
        "replay", "request", "no-such-request", kafka=sim_stack.kafka.bootstrap_servers
    )
    assert (code, out) == (1, "") and "no record of request no-such-request" in err


# --- replay topic -----------------------------------------------------------------------


async def test_replay_topic_filters_by_key_offset_and_time(sim_stack):
    """Records with known timestamps, a minute apart, two keys on two partitions; on the
    embedded broker --since finds its start by reading from the first offset."""
    kafka = sim_stack.kafka.bootstrap_servers
    topic = f"replay-test-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka, {topic: 2})
    now_ms = int(time.time() * 1000)
    stamps = [now_ms - (600 - 60 * i) * 1000 for i in range(10)]  # 10 min ago .. 1 min ago
    producer = AIOKafkaProducer(bootstrap_servers=kafka)
    await producer.start()
    try:
        for i, stamp in enumerate(stamps):
            await producer.send_and_wait(
                topic, b'{"n": %d}' % i, key=b"k%d" % (i % 2), partition=i % 2, timestamp_ms=stamp
            )
    finally:
        await producer.stop()

    def numbers(lines: list[dict[str, Any]]) -> list[int]:
        return [json.loads(line["raw"])["n"] for line in lines]

    relative = await json_lines(
        sim_stack, "replay", "topic", topic, "--since", "270s", "--limit", "3"
    )
    assert numbers(relative) == [6, 7, 8]  # 240, 180, 120 s ago; 300 s ago is out

    every = await json_lines(sim_stack, "replay", "topic", topic)
    assert numbers(every) == list(range(10))
    assert [line["timestamp_ms"] for line in every] == stamps
    assert every[0]["event"] is None and every[0]["raw_encoding"] == "text"
    assert numbers(await json_lines(sim_stack, "replay", "topic", topic, "--key", "k1")) == [
        1,
        3,
        5,
        7,
        9,
    ]
    from_3 = await json_lines(sim_stack, "replay", "topic", topic, "--from-offset", "3")
    assert numbers(from_3) == [6, 7, 8, 9] and {line["offset"] for line in from_3} == {3, 4}
    assert await json_lines(sim_stack, "replay", "topic", topic, "--from-offset", "99") == []
    since = await json_lines(
        sim_stack,
        "replay",
        "topic",
        topic,
        "--since",
        every[3]["timestamp"],
        "--until",
        every[6]["timestamp"],
    )
    assert numbers(since) == [3, 4, 5, 6]
    code, _, err = await cli("replay", "topic", topic, "--since", "last tuesday", kafka=kafka)
    assert code == 2 and "not a time" in err
    code, _, err = await cli("replay", "topic", "no.such.topic", kafka=kafka)
    assert code == 1 and "no topic no.such.topic" in err

    # offsets_for_times is used only where its answer is right: else None (scan).
    from aiokafka.structs import TopicPartition

    answer = await offsets_at(
        kafka,
        [TopicPartition(topic, 0), TopicPartition(topic, 1)],
        stamps[3],
        time_offsets_believable,
    )
    assert answer is None or answer == {TopicPartition(topic, 0): 2, TopicPartition(topic, 1): 1}


async def test_replay_topic_of_the_token_stream_by_conversation(sim_stack):
    async with client_for(sim_stack) as client:
        cid = await conversation(client)
        result = await post_message(client, cid, {"content": "tokens please", "max_tokens": 6})
    lines = await json_lines(sim_stack, "replay", "topic", topics.TOKENS, "--key", cid)
    assert lines and {line["key"] for line in lines} == {cid}
    assert {line["event"]["conversation_id"] for line in lines} == {cid}
    assert "".join(line["event"]["text"] for line in lines if line["event"]["type"] == "chunk"
                   and line["event"]["request_id"] == result.request["request_id"]
                   ) == result.text  # fmt: skip


# --- dlq ---------------------------------------------------------------------------------


async def dlq_rows(stack, *args: str) -> list[dict[str, Any]]:
    return await json_lines(stack, "dlq", "list", "--json", *args)


async def until_row(stack, match, *args: str, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [row for row in await dlq_rows(stack, *args) if match(row)]
        if found:
            return found[0]
        await asyncio.sleep(0.5)
    raise AssertionError("no such dead letter")


async def test_a_malformed_record_is_listed_and_retried_onto_its_topic(sim_stack):
    kafka = sim_stack.kafka.bootstrap_servers
    marker = f"garbage-{uuid.uuid4().hex}"
    producer = AIOKafkaProducer(bootstrap_servers=kafka)
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            topics.USAGE,
            b"{" + marker.encode(),
            key=b"bad-key",
            headers=[("x-origin", b"test\xff")],
        )
    finally:
        await producer.stop()
    [letter] = await find_events(
        sim_stack.kafka, topics.DLQ, DeadLetter, lambda d: marker in d.value, timeout_s=20
    )
    row = await until_row(
        sim_stack,
        lambda r: (
            (r["topic"], r["offset"]) == (topics.USAGE, sent.offset)
            and r["partition"] == sent.partition
        ),
        "--topic",
        topics.USAGE,
    )
    assert (row["stage"], row["key"], row["retry_of"]) == ("billing", "bad-key", None)
    assert row["error"] == letter.error and row["id"].startswith("chat.dlq-")
    assert await dlq_rows(sim_stack, "--topic", "chat.elsewhere") == []
    assert row in await dlq_rows(sim_stack, "--since", "5m")
    assert row not in await dlq_rows(sim_stack, "--since", "2099-01-01T00:00:00Z")
    code, table, _ = await cli("dlq", "list", kafka=kafka)
    assert code == 0 and table.splitlines()[0].split() == [
        "id",
        "when",
        "topic",
        "partition",
        "offset",
        "stage",
        "key",
        "retry_of",
        "error",
    ]
    assert any(line.startswith(row["id"] + " ") for line in table.splitlines())

    code, out, err = await cli("dlq", "retry", row["id"], kafka=kafka)
    assert code == 0, err
    assert out.startswith(f"retried {row['id']}: {topics.USAGE} partition {sent.partition} ")
    retried_offset = int(out.split()[-1])
    # The record is back on its topic as it was, billing fails on it again, and the new
    # dead letter says which one it retries.
    again = await until_row(sim_stack, lambda r: r["retry_of"] == row["id"])
    assert (again["topic"], again["partition"], again["offset"]) == (
        topics.USAGE,
        sent.partition,
        retried_offset,
    )
    [second] = await find_events(
        sim_stack.kafka,
        topics.DLQ,
        DeadLetter,
        lambda d: d.offset == retried_offset and marker in d.value,
    )
    assert (second.value, second.key) == (letter.value, letter.key)
    assert dict(second.headers)["x-origin"] == dict(letter.headers)["x-origin"]

    code, _, err = await cli("dlq", "retry", row["id"], kafka=kafka)
    assert code == 1 and "retried already" in err and f"offset {retried_offset}" in err
    code, out, err = await cli("dlq", "retry", row["id"], "--force", kafka=kafka)
    assert code == 0 and int(out.split()[-1]) > retried_offset, err
    code, _, err = await cli("dlq", "retry", "chat.dlq-0-999999", kafka=kafka)
    assert code == 1 and "no dead letter chat.dlq-0-999999" in err


async def test_a_dead_letter_whose_cause_is_fixed_is_processed_when_retried(sim_stack):
    """A valid usage event dead-lettered while billing's ledger was down (written here as
    billing writes it): once retried, billing charges it."""
    user = f"retry-{uuid.uuid4().hex[:8]}"
    event = UsageEvent(
        request_id=uuid.uuid4().hex,
        conversation_id="c",
        user_id=user,
        org_id="retry-org",
        tier=Tier.FREE,
        model="tiny-random",
        worker_id="w",
        status=RequestStatus.FINISHED_STOPPED,
        prompt_tokens=7,
        completion_tokens=4,
        cached_tokens=0,
        gpu_ms=1.0,
    )
    value = encode(event)
    record = ConsumerRecord(
        topics.USAGE,
        0,
        0,
        int(time.time() * 1000),
        0,
        user.encode(),
        value,
        None,
        len(user),
        len(value),
        [("event-type", b"usage")],
    )
    producer = sim_stack.kafka.producer()
    await producer.start()
    try:
        await dead_letter(
            Publisher(producer), "billing", record, "OperationalError: database is locked"
        )
    finally:
        await producer.stop()
    row = await until_row(sim_stack, lambda r: r["key"] == user)
    code, _, err = await cli("dlq", "retry", row["id"], kafka=sim_stack.kafka.bootstrap_servers)
    assert code == 0, err
    ledger = SQLiteLedger(sim_stack.settings.storage.database_path)
    await ledger.open()
    try:
        window = period_of(time.time(), "day")
        account = Account.user("retry-org", user)

        async def used() -> int:
            return (await ledger.used([account], "day", window.key))[account]

        async def counted() -> bool:
            return await used() >= 11

        with contextlib.suppress(TimeoutError):
            await until(counted, timeout_s=20, interval_s=0.2)
        assert await used() == 11
    finally:
        await ledger.close()
    assert [r for r in await dlq_rows(sim_stack) if r["retry_of"] == row["id"]] == []


# --- finding the broker ------------------------------------------------------------------


async def test_commands_find_a_running_chatpipe_up_and_refuse_a_stale_file(
    tmp_path, tiny_model_dir
):
    database = tmp_path / "chatpipe.db"
    run_file = tmp_path / "chatpipe.db.run.json"
    env = {"CHATPIPE_DATABASE_PATH": str(database)}
    code, _, err = await cli("dlq", "list", kafka=None, cwd=tmp_path, **env)
    assert code == 1 and "no running `chatpipe up`" in err and "KAFKA_BOOTSTRAP_SERVERS" in err

    up = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "chatpipe.cli",
        "up",
        "--engine",
        "sim",
        "--port",
        "0",
        "--model",
        str(tiny_model_dir),
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k not in ENV_BROKER} | env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not run_file.exists():
            assert up.returncode is None, "chatpipe up stopped"
            assert time.monotonic() < deadline, "chatpipe up wrote no runtime file"
            await asyncio.sleep(0.5)
        info = json.loads(run_file.read_text())
        assert info["pid"] == up.pid and info["embedded_broker"] is True
        assert info["gateway_url"].startswith("http://127.0.0.1:")
        code, out, err = await cli(
            "replay", "topic", topics.SCHEDULER, "--limit", "1", kafka=None, cwd=tmp_path, **env
        )
        assert code == 0, err
        [line] = [json.loads(text) for text in out.splitlines()]
        assert line["topic"] == topics.SCHEDULER and line["event"]["type"] == "claim"
    finally:
        if up.returncode is None:
            os.killpg(up.pid, signal.SIGTERM)
        await asyncio.wait_for(up.wait(), 60)
    assert not run_file.exists(), "chatpipe up left its runtime file"

    run_file.write_text(json.dumps(info))  # as a killed `chatpipe up` leaves it
    code, _, err = await cli("dlq", "list", kafka=None, cwd=tmp_path, **env)
    assert code == 1 and f"pid {up.pid}, is not running" in err and "stale" in err

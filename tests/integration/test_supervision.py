"""`chatpipe up` as a process: its embedded broker is killed, and chat works again.

The chat after the restart runs on the delivery partition the gateway had already
read before it: the gateway reads its topics again from their new start
(`KafkaPipeline.rewind`), or that stream would lose its first events.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import psutil
import pytest

from bench.processes import Service, chatpipe_up_ready, free_port, start_chatpipe_up, wait_until
from bus.clients import keyed_partition
from tests.support.chat import SseResult, post_message

pytestmark = pytest.mark.timeout(180)

API_KEY = "k"
REPLY = "hello there"
DELIVER_PARTITIONS = list(range(4))  # KafkaPipeline's default


def delivery_partition(conversation_id: str) -> int:
    return keyed_partition(conversation_id.encode(), DELIVER_PARTITIONS, DELIVER_PARTITIONS)


async def chat(port: int, avoid_partitions: set[int]) -> tuple[int, SseResult]:
    """A new conversation whose deliveries go to none of `avoid_partitions`, and one
    message the sim engine answers with `REPLY`: the partition and the answer."""
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        timeout=40,
        headers={"Authorization": f"Bearer {API_KEY}"},
    ) as client:
        while True:
            created = await client.post("/v1/conversations", json={})
            created.raise_for_status()
            conversation_id = created.json()["conversation_id"]
            if delivery_partition(conversation_id) not in avoid_partitions:
                break
        result = await post_message(
            client, conversation_id, {"content": f"[[sim:reply={REPLY}]]", "max_tokens": 8}
        )
        return delivery_partition(conversation_id), result


def answered(result: SseResult) -> bool:
    return result.status == 200 and result.ended_with_done and result.text == REPLY


def broker_of(service: Service) -> psutil.Process:
    [broker] = [
        child
        for child in psutil.Process(service.pid).children()
        if child.cmdline()[1:2] == ["broker"]
    ]
    return broker


@pytest.fixture
def chatpipe_up(tmp_path: Path, tiny_model_dir: Path):
    port = free_port()
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": "",
        "CHATPIPE_DEV_API_KEY": API_KEY,
        "CHATPIPE_DATABASE_PATH": str(tmp_path / "db"),
        "CHATPIPE_AUTO_TITLES": "false",
        "CHATPIPE_MODEL": str(tiny_model_dir),
    }
    service = start_chatpipe_up(env, port, tmp_path, "sim")
    brokers: list[psutil.Process] = []
    try:
        yield service, port, brokers
    finally:
        service.stop()
        for broker in brokers:  # in its own session: the group kill does not reach it
            if broker.is_running():
                broker.kill()


async def test_chat_works_again_after_the_embedded_broker_is_killed(chatpipe_up) -> None:
    service, port, brokers = chatpipe_up
    await chatpipe_up_ready(service, timeout_s=60)
    read_before, result = await chat(port, set())
    assert answered(result), service.log_text()
    others = set(DELIVER_PARTITIONS) - {read_before}
    for _ in range(3):  # the gateway reads well into that partition
        assert answered((await chat(port, others))[1]), service.log_text()

    brokers.append(broker_of(service))
    brokers[0].send_signal(signal.SIGKILL)

    async def restarted() -> bool:
        return "embedded broker restarted on" in service.log_text()

    await wait_until(restarted, service, 15, "the broker's restart in the log")
    assert "embedded broker exited with code -9; restarting it" in service.log_text()
    _, result = await asyncio.wait_for(chat(port, others), 45)
    assert answered(result), f"{result}\n{service.log_text()}"
    brokers.append(broker_of(service))
    assert brokers[1].pid != brokers[0].pid

    service.process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(service.process.wait, 20) == 0, service.log_text()
    assert not brokers[1].is_running(), "SIGTERM stops the restarted broker too"

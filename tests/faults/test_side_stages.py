"""The stages beside the stream keep every answer: a store that fails for a
while, a recorder restarted before it stored a retracted answer, poison records on
every stage's input, a conversation deleted while it streams.

To reach the recorder the answers here are not relayed to their end by a gateway: the
client drops its stream, and the answer ends within the resume grace, so only the
recorder (reading `chat.answers`) can store it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest
import pytest_asyncio

from bench import fault_scenarios as scenarios
from bench.fault_scenarios import PIPELINE_SETTINGS, stored_once_ended
from bench.process_pipeline import Pipeline, running_pipeline
from bench.watched_streams import Watched, reading, watch
from schemas import topics
from schemas.events import DeadLetter

pytestmark = pytest.mark.timeout(180)

GRACE_S = 10.0
BUSY_TIMEOUT_S = 10.0  # the store's: a write waits this long for a lock, then fails
REPLACEMENT = "[This answer was removed: pii]"


@pytest_asyncio.fixture(scope="module")
async def pipeline(tmp_path_factory) -> Pipeline:
    settings = {**PIPELINE_SETTINGS, "resume_grace_s": GRACE_S}
    async with running_pipeline(tmp_path_factory.mktemp("side"), **settings) as pipe:
        for stage in (*scenarios.SIDE_STAGES, "gateway"):
            await pipe.start(stage)
        await pipe.start("w1", "worker")
        await pipe.wait_for_workers("w1")
        await pipe.wait_for_gateway()
        yield pipe


async def dropped_answer(client, content: str, tokens: int = 20) -> Watched:
    """An answer whose client drops the stream after its first piece."""
    [cid] = await scenarios.conversations(client, 1)
    return await (await reading([client], cid, {"content": content, "max_tokens": tokens})).drop()


async def test_a_store_that_fails_for_a_while_is_retried_not_dead_lettered(pipeline):
    database = pipeline.tmp_path / "chatpipe.db"
    unlock = threading.Event()
    locked = threading.Event()

    def hold_the_write_lock() -> None:
        connection = sqlite3.connect(database, timeout=30)
        connection.execute("BEGIN EXCLUSIVE")
        locked.set()
        unlock.wait()
        connection.rollback()
        connection.close()

    async with pipeline.http() as client:
        seen = await dropped_answer(client, "[[sim:reply=kept through a locked store]]")
        holder = threading.Thread(target=hold_the_write_lock)
        holder.start()
        await asyncio.to_thread(locked.wait)
        # Longer than the store's busy timeout: the recorder's write fails, then retries.
        await asyncio.sleep(BUSY_TIMEOUT_S + 3)
        unlock.set()
        await asyncio.to_thread(holder.join)
        stored = await stored_once_ended(client, seen, timeout_s=20)
    assert (stored["content"], stored["status"]) == (
        "kept through a locked store",
        "finished_stopped",
    )
    assert "retrying" in pipeline.log_tail("recorder", 200), "the write failed and was retried"
    assert await dead_letters(pipeline, "recorder") == []
    assert await dead_letters(pipeline, "billing") == []


async def test_a_retraction_survives_a_recorder_restart(pipeline):
    pipeline.kill("recorder")
    async with pipeline.http() as client:
        seen = await dropped_answer(client, "[[sim:reply=write to bob@example.com please]]")
        await asyncio.sleep(2.0)  # the answer and its retraction are on chat.answers
        await pipeline.restart("recorder")
        stored = await stored_once_ended(client, seen, timeout_s=30)
    assert (stored["content"], stored["status"]) == (REPLACEMENT, "finished_filtered")


async def test_poison_records_are_dead_lettered_and_every_stage_goes_on(pipeline):
    garbage = b"{not an event"
    targets = {
        topics.requests_topic("free"): "scheduler",
        topics.TOKENS: "safety",
        topics.ANSWERS: "recorder",
        topics.USAGE: "billing",
        topics.WORK: "worker",
    }
    producer = pipeline.kafka.producer()
    await producer.start()
    try:
        for topic in targets:
            await producer.send_and_wait(topic, garbage, key=b"poison")
    finally:
        await producer.stop()
    for stage in targets.values():
        assert await dead_letters(pipeline, stage, garbage.decode(), timeout_s=20), stage
    async with pipeline.http() as client:
        [cid] = await scenarios.conversations(client, 1)
        after = await watch([client], cid, {"content": "[[sim:reply=still here]]"})
    assert after.finished and after.text == "still here"
    assert all(stage.running for stage in pipeline.stages.values())


async def test_deleting_a_conversation_while_it_streams_leaves_nothing_behind(pipeline):
    async with pipeline.http() as client:
        [cid] = await scenarios.conversations(client, 1)
        answer = await reading([client], cid, scenarios.body(400, "deleted"))
        assert (await client.delete(f"/v1/conversations/{cid}")).status_code == 204
        watched = await answer.result(timeout_s=15)
        await asyncio.sleep(2.0)  # the recorder has read the answer's end by now
        assert (await client.get(f"/v1/conversations/{cid}")).status_code == 404
        assert await stored_answer_rows(pipeline, cid) == (0, 0)
        assert (await client.get(f"/v1/requests/{watched.request_id}/events")).status_code == 404
    assert watched.end["status"] == "finished_aborted", "its generation was cancelled"


async def dead_letters(
    pipeline: Pipeline, stage: str, value: str | None = None, timeout_s: float = 2.0
) -> list[DeadLetter]:
    """What `stage` dead-lettered (only records holding `value`, when given)."""
    return await pipeline.find(
        topics.DLQ,
        DeadLetter,
        lambda d: d.stage == stage and (value is None or d.value == value),
        timeout_s=timeout_s,
    )


async def stored_answer_rows(pipeline: Pipeline, conversation_id: str) -> tuple[int, int]:
    """(messages, request records) the store holds for the conversation."""

    def count() -> tuple[int, int]:
        with sqlite3.connect(pipeline.tmp_path / "chatpipe.db") as connection:
            return tuple(
                connection.execute(
                    f"SELECT count(*) FROM {table} WHERE conversation_id = ?", (conversation_id,)
                ).fetchone()[0]
                for table in ("messages", "requests")
            )  # type: ignore[return-value]

    return await asyncio.to_thread(count)

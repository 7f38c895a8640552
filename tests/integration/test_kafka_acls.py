"""The ACL table (chatpipe/kafka_acls.py) against what the stages really do: the whole pipeline
runs on the embedded broker with each stage's clients named after it, every topic a
producer writes, a consumer reads or an admin client creates (and every consumer group
joined) is noted, and each must be one the stage's Kafka user is granted. Tansu has no
ACLs, so this is where a stage that starts using a new topic is caught before a secured
broker refuses it (the broker's own config is checked in
tests/unit/project/test_deployment_files.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from bus.clients import KafkaConfig
from chatpipe import wiring
from chatpipe.dev_stack import running_sim_stack, stack_settings
from chatpipe.kafka_acls import GRANTS, Operation, Resource, allowed
from schemas import topics
from schemas.sse import read_messages
from tests.support.chat import post_message, until
from tests.support.stack import client_for

TAG = "acl-check:"
R, W, C = Operation.READ, Operation.WRITE, Operation.CREATE
Use = tuple[str, Operation, Resource, str]
RETRACTED = (
    "[[sim:reply=Sure. You can write to bob@example.com for the details. "
    + " ".join(f"word{i}" for i in range(150))
    + "]]"
)


def tagged(stage: str, kafka: KafkaConfig) -> KafkaConfig:
    return dataclasses.replace(kafka, client_id=f"{TAG}{stage}")


@pytest.fixture
def uses(monkeypatch: pytest.MonkeyPatch) -> set[Use]:
    """What each stage's clients do from now on, noted as (stage, operation, resource, name)."""
    seen: set[Use] = set()

    def note(client: object, operation: Operation, resource: Resource, name: str) -> None:
        client_id = client._client_id  # aiokafka 0.14's AIOKafkaClient
        if client_id.startswith(TAG):
            seen.add((client_id.removeprefix(TAG), operation, resource, name))

    def wrap(cls: type, method: str, record: Callable[..., None]) -> None:
        original = getattr(cls, method)
        if asyncio.iscoroutinefunction(original):

            async def patched(self, *args, **kwargs):
                record(self, *args, **kwargs)
                return await original(self, *args, **kwargs)
        else:

            def patched(self, *args, **kwargs):
                record(self, *args, **kwargs)
                return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, method, patched)

    wrap(
        AIOKafkaProducer,
        "send",
        lambda self, topic, *_, **__: note(self.client, W, Resource.TOPIC, topic),
    )
    wrap(
        AIOKafkaConsumer,
        "subscribe",
        lambda self, topics=(), *_, **__: [
            note(self._client, R, Resource.TOPIC, topic) for topic in topics
        ],
    )
    wrap(
        AIOKafkaConsumer,
        "assign",
        lambda self, partitions: [
            note(self._client, R, Resource.TOPIC, tp.topic) for tp in partitions
        ],
    )
    wrap(
        AIOKafkaConsumer,
        "start",
        lambda self: self._group_id and note(self._client, R, Resource.GROUP, self._group_id),
    )
    wrap(
        AIOKafkaAdminClient,
        "create_topics",
        lambda self, new_topics, *_, **__: [
            note(self._client, C, Resource.TOPIC, topic.name) for topic in new_topics
        ],
    )

    # Each stage gets its own named KafkaConfig where the wiring hands it one.
    for factory, stage in (
        ("gateway_pipeline", "gateway"),
        ("scheduler_stage", "scheduler"),
        ("safety_stage", "safety"),
        ("recorder_stage", "recorder"),
        ("BillingStage", "billing"),
        ("worker_stage", "worker"),
        ("tools_stage", "tools"),
    ):
        original = getattr(wiring, factory)
        monkeypatch.setattr(
            wiring,
            factory,
            lambda kafka, *rest, _o=original, _s=stage: _o(tagged(_s, kafka), *rest),
        )
    return seen


async def test_every_topic_a_stage_uses_is_granted_to_its_kafka_user(
    uses, tiny_model_dir, tmp_path
):
    settings = stack_settings(
        tmp_path, engine="sim", model=tiny_model_dir, sim_tokens_per_s=200.0, max_slots=1
    )
    async with running_sim_stack(settings) as stack, client_for(stack) as client:

        async def conversation() -> str:
            return (await client.post("/v1/conversations", json={})).json()["conversation_id"]

        # A long answer takes the only slot; the next one waits in line (the scheduler
        # tells its gateway where); the first client goes away and the gateway cancels it.
        long = {"content": "[[sim:length=2000]]", "max_tokens": 2000}
        async with client.stream(
            "POST", f"/v1/conversations/{await conversation()}/messages", json=long
        ) as response:
            await read_messages(response.aiter_lines(), stop=lambda e: e.event == "delta")
            waiting = asyncio.create_task(
                post_message(client, await conversation(), {"content": "[[sim:reply=hello there]]"})
            )
            await until(lambda: ("scheduler", W, Resource.TOPIC, stack.pipeline.reply_to) in uses)
        assert (await waiting).text == "hello there"
        # An answer the safety stage retracts.
        retracted = await post_message(client, await conversation(), {"content": RETRACTED})
        assert retracted.of("retract")
        # An answer that calls a server tool: the worker hands the round to chat.tools,
        # the tools stage answers on chat.tokens and queues the next round.
        tooled = await post_message(
            client,
            await conversation(),
            {
                "content": '[[sim:call=calculator {"expression": "6*7"}]] [[sim:reply=42]]',
                "tool_choice": "auto",
                "max_tokens": 64,
            },
        )
        assert tooled.of("tool_result") and tooled.ended_with_done, tooled
        # Records nobody can read: each consumer dead-letters them.
        producer = AIOKafkaProducer(bootstrap_servers=stack.kafka.bootstrap_servers)
        await producer.start()
        try:
            for topic in (
                topics.requests_topic(topics.Tier.FREE),
                topics.TOKENS,
                topics.ANSWERS,
                topics.USAGE,
                topics.TOOLS,
                stack.pipeline.reply_to,
            ):
                await producer.send_and_wait(
                    topic, b"not an event " + uuid.uuid4().bytes, key=b"acl-check"
                )
        finally:
            await producer.stop()

        expected = {
            ("gateway", W, Resource.TOPIC, topics.requests_topic(settings.gateway.default_tier)),
            ("gateway", C, Resource.TOPIC, stack.pipeline.reply_to),
            ("gateway", W, Resource.TOPIC, topics.CONTROL),
            ("scheduler", W, Resource.TOPIC, topics.WORK),
            ("scheduler", W, Resource.TOPIC, stack.pipeline.reply_to),
            ("worker", W, Resource.TOPIC, topics.TOKENS),
            ("worker", W, Resource.TOPIC, topics.USAGE),
            ("safety", W, Resource.TOPIC, stack.pipeline.reply_to),
            ("safety", W, Resource.TOPIC, topics.MODERATION),
            ("recorder", R, Resource.TOPIC, topics.ANSWERS),
            ("billing", R, Resource.TOPIC, topics.USAGE),
            ("worker", W, Resource.TOPIC, topics.TOOLS),
            ("tools", R, Resource.TOPIC, topics.TOOLS),
            ("tools", W, Resource.TOPIC, topics.TOKENS),
            ("tools", W, Resource.TOPIC, topics.requests_topic(settings.gateway.default_tier)),
            *(
                (stage, W, Resource.TOPIC, topics.DLQ)
                for stage in ("gateway", "scheduler", "safety", "recorder", "billing", "tools")
            ),
        }
        try:
            await until(lambda: expected <= uses)
        except TimeoutError:
            pytest.fail(f"never seen: {sorted(expected - uses)}")

    assert {use[0] for use in uses} == set(GRANTS), "a stage's clients were not followed"
    refused = sorted(use for use in uses if not allowed(*use))
    assert not refused, f"a secured broker would refuse these (chatpipe/kafka_acls.py): {refused}"

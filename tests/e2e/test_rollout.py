"""Model rollout end to end: a stack of its own serves two models (`v1`, `v2`: two sim
workers) and the alias `chat` over them. Requests for the alias spread by weight, each
conversation stays on its version (regenerations too), the version is on the stored
answers, the usage events and the done event; `chatpipe rollout set/rollback` moves the
running gateway without a restart; feedback reaches chat.feedback; `chatpipe rollout
report` compares the versions from the topics.

The tests run in order and share the stack (module scope).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from typer.testing import CliRunner

from bench.topic_log import find_events
from bus.clients import Publisher
from chatpipe.cli import app as cli
from chatpipe.dev_stack import running_sim_stack, stack_settings
from chatpipe.wiring import Stack, worker_stage
from conversations.store import ApiKey
from gateway.rollout import pick
from schemas import topics
from schemas.events import DeadLetter, FeedbackEvent, RolloutSet, UsageEvent
from schemas.topics import Tier
from tests.support.chat import SseResult, post_message, read_sse
from tests.support.stack import client_for
from workers.sim_engine import SimEngine

START = {"v1": 0.5, "v2": 0.5}
TURN = {"model": "chat", "content": "hello", "max_tokens": 8}
SENT: dict[str, str] = {}
"""conversation id -> the version its answers came from, as the tests saw it."""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rollout_stack(tiny_model_dir, tmp_path_factory) -> AsyncIterator[Stack]:
    settings = stack_settings(
        tmp_path_factory.mktemp("rollout-stack"),
        engine="sim",
        model=tiny_model_dir,
        model_name="v1",
        served_models=["v1", "v2"],
        model_aliases={"chat": START},
        sim_tokens_per_s=400.0,
        max_slots=8,
        auto_titles=False,
        user_requests_per_minute=10_000,
        org_requests_per_minute=10_000,
    )
    async with running_sim_stack(settings) as stack, second_worker(stack, "v2"):
        async with client_for(stack) as client:  # v2's worker has joined once it answers
            cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
            turn = await post_message(client, cid, {**TURN, "model": "v2"})
            assert turn.ended_with_done, turn
        yield stack


@contextlib.asynccontextmanager
async def second_worker(stack: Stack, model: str) -> AsyncIterator[None]:
    """A sim worker of `model` beside the stack's own, on the same broker."""
    settings = stack.settings
    engine = SimEngine(
        model,
        settings.inference.max_slots,
        settings.inference.sim_tokens_per_s,
        settings.inference.sim_prompt_tokens_per_s,
    )
    await engine.start()
    stage = worker_stage(
        stack.kafka,
        engine,
        settings.replace(**{"worker_id": f"worker-{model}", "ready_file": None}),
    )
    task = asyncio.create_task(stage.run(), name=f"worker-{model}")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await engine.stop()


def rollout_cli(stack: Stack, *args: str, exit_code: int = 0) -> str:
    """`chatpipe ARGS` as an operator runs it against the stack's broker and settings."""
    result = CliRunner().invoke(
        cli,
        list(args),
        env={
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
            "CHATPIPE_DATABASE_PATH": str(stack.settings.storage.database_path),
            "CHATPIPE_MODEL_NAME": "v1",
            "CHATPIPE_SERVED_MODELS": '["v1", "v2"]',
            "CHATPIPE_MODEL_ALIASES": json.dumps({"chat": START}),
        },
    )
    assert result.exit_code == exit_code, (result.output, result.exception)
    return result.output


async def in_thread(stack: Stack, *args: str, exit_code: int = 0) -> str:
    return await asyncio.to_thread(rollout_cli, stack, *args, exit_code=exit_code)


async def answered(client, cid: str, path: str | None = None, body: dict | None = None) -> dict:
    """One turn (or a regeneration at `path`); its done event."""
    if path is None:
        turn = await post_message(client, cid, body or TURN)
    else:
        async with client.stream("POST", path, json=body or {"model": "chat"}) as response:
            turn = SseResult(response.status_code, await read_sse(response))
    assert turn.status == 200 and turn.ended_with_done, turn
    [done] = turn.of("done")
    return done.json() | {"request": turn.request}


async def new_chat(client) -> str:
    return (await client.post("/v1/conversations", json={})).json()["conversation_id"]


async def weights_applied(stack: Stack, expected: dict[str, float], wait_s: float = 15) -> None:
    aliases = stack.gateway.state.deps.aliases
    deadline = time.monotonic() + wait_s
    while aliases.weights("chat") != expected:
        assert time.monotonic() < deadline, aliases.weights("chat")
        await asyncio.sleep(0.05)


async def test_the_alias_spreads_conversations_and_keeps_each_on_its_version(rollout_stack):
    stack = rollout_stack
    async with client_for(stack) as client:
        cids = [await new_chat(client) for _ in range(16)]
        for cid in cids:
            SENT[cid] = (await answered(client, cid))["model"]
        assert {cid: pick("chat", START, cid) for cid in cids} == SENT
        assert set(SENT.values()) == {"v1", "v2"}

        for cid in cids[:4]:  # a next turn, and a regeneration of it
            done = await answered(client, cid)
            assert done["model"] == SENT[cid]
            message_id = done["request"]["message_id"]
            again = await answered(
                client, cid, f"/v1/conversations/{cid}/messages/{message_id}/regenerate"
            )
            assert again["model"] == SENT[cid]

        for cid in cids[:4]:
            detail = (await client.get(f"/v1/conversations/{cid}")).json()
            answers = [m for m in detail["messages"] if m["role"] == "assistant"]
            assert len(answers) == 3
            assert {(m["model"], m["alias"]) for m in answers} == {(SENT[cid], "chat")}

        completion = await client.post(
            "/v1/chat/completions",
            json={
                "model": "chat",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert completion.status_code == 200, completion.text
        assert completion.json()["model"] in ("v1", "v2")

    usage = await find_events(
        stack.kafka, topics.USAGE, UsageEvent, lambda e: e.conversation_id in SENT, count=16 + 8
    )
    assert {(e.conversation_id, e.model, e.alias) for e in usage} == {
        (cid, version, "chat") for cid, version in SENT.items()
    }


async def test_weights_change_and_roll_back_on_the_running_gateway(rollout_stack):
    stack = rollout_stack
    on_v1 = next(cid for cid, version in SENT.items() if version == "v1")
    assert "v2=1" in await in_thread(stack, "rollout", "set", "chat", "v2=1")
    await weights_applied(stack, {"v2": 1.0})
    async with client_for(stack) as client:
        assert (await answered(client, on_v1))["model"] == "v2"
        fresh = [await new_chat(client) for _ in range(4)]
        assert [(await answered(client, cid))["model"] for cid in fresh] == ["v2"] * 4

        assert "rolled back" in await in_thread(stack, "rollout", "rollback", "chat")
        await weights_applied(stack, START)
        assert (await answered(client, on_v1))["model"] == "v1"

        await in_thread(stack, "rollout", "rollback", "chat", "--to", "v1")
        await weights_applied(stack, {"v1": 1.0})
        assert [(await answered(client, cid))["model"] for cid in fresh] == ["v1"] * 4
        shown = json.loads(await in_thread(stack, "rollout", "show", "--json"))
        assert shown == {"chat": {"v1": 1.0}}

        await in_thread(stack, "rollout", "set", "chat", "v1=0.5", "v2=0.5")
        await weights_applied(stack, START)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("set", "chat", "v9=1"), "v9 not served"),
        (("set", "chat", "v1=0", "v2=0"), "sum to more than 0"),
        (("set", "chat", "v1=-1"), "must be a number >= 0"),
        (("set", "chat", "v1"), "VERSION=WEIGHT"),
        (("set", "v1", "v2=1"), "is a served model"),
        (("rollback", "nothing"), "no earlier weights"),
    ],
)
async def test_bad_rollouts_exit_2_and_change_nothing(rollout_stack, args, says):
    output = await in_thread(rollout_stack, "rollout", *args, exit_code=2)
    assert says in " ".join(output.replace("│", " ").split())
    assert rollout_stack.gateway.state.deps.aliases.weights("chat") == START


async def test_a_record_the_gateway_cannot_apply_is_dead_lettered(rollout_stack):
    """Written past the CLI's checks: a version this gateway does not serve."""
    stack = rollout_stack
    producer = stack.kafka.producer()
    await producer.start()
    try:
        await Publisher(producer).send_and_wait(
            topics.ROLLOUT, RolloutSet(alias="chat", weights={"v9": 1.0}), key="chat"
        )
    finally:
        await producer.stop()
    [letter] = await find_events(
        stack.kafka, topics.DLQ, DeadLetter, lambda e: e.topic == topics.ROLLOUT
    )
    assert letter.stage == "gateway" and "v9 not served" in letter.error
    assert stack.gateway.state.deps.aliases.weights("chat") == START
    shown = json.loads(await in_thread(stack, "rollout", "show", "--json"))
    assert shown == {"chat": START}, "show skips what the gateways refused"
    await in_thread(stack, "rollout", "set", "chat", "v1=1")
    await weights_applied(stack, {"v1": 1.0})
    await in_thread(stack, "rollout", "set", "chat", "v1=0.5", "v2=0.5")
    await weights_applied(stack, START)


async def test_feedback_lands_on_chat_feedback_for_the_owner_only(rollout_stack):
    stack = rollout_stack
    other = f"key-{uuid.uuid4().hex[:8]}"
    await stack.store.add_api_key(other, ApiKey(user_id="mallory", org_id="evil", tier=Tier.PRO))
    cid = next(iter(SENT))
    async with client_for(stack) as client, client_for(stack, other) as stranger:
        done = await answered(client, cid)
        message_id = done["request"]["message_id"]
        url = f"/v1/messages/{message_id}/feedback"
        refused = await stranger.post(url, json={"rating": "up"})
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "message_not_found"
        for body in ({"rating": "sideways"}, {"rating": "up", "text": "x" * 2001}):
            bad = await client.post(url, json=body)
            assert bad.status_code == 422, bad.text
        user_message = done["request"]["user_message_id"]
        wrong = await client.post(f"/v1/messages/{user_message}/feedback", json={"rating": "up"})
        assert wrong.status_code == 400, wrong.text
        accepted = await client.post(url, json={"rating": "up", "text": "clear answer"})
        assert accepted.status_code == 202, accepted.text

    [event] = await find_events(
        stack.kafka, topics.FEEDBACK, FeedbackEvent, lambda e: e.message_id == message_id
    )
    assert (event.conversation_id, event.model, event.alias, event.rating, event.text) == (
        cid,
        SENT[cid],
        "chat",
        "up",
        "clear answer",
    )
    assert (event.user_id, event.org_id) == ("dev", "dev")


async def test_the_report_compares_the_versions(rollout_stack, tmp_path: Path):
    where = ["--db", str(tmp_path / "a.duckdb"), "--data", str(tmp_path / "parquet")]
    output = await in_thread(
        rollout_stack, "rollout", "report", "chat", "--since", "1h", "--ingest", "--json", *where
    )
    answer = json.loads(output[output.index("{") :])
    rows = {row["version"]: row for row in answer["versions"]}
    assert set(rows) == {"v1", "v2"}
    for row in rows.values():
        assert row["requests"] >= 5 and row["ttft_p50_ms"] > 0 and row["tokens_per_s"] > 0
    assert sum(row["regenerations"] for row in rows.values()) == 4
    feedback = [
        (v, row["feedback_up"], row["feedback_down"])
        for v, row in rows.items()
        if row["feedback_up"] or row["feedback_down"]
    ]
    assert feedback == [(SENT[next(iter(SENT))], 1, 0)]
    text = await in_thread(rollout_stack, "rollout", "report", "chat", *where)
    assert "ttft_p50_ms" in text and "v1" in text and "v2" in text

"""`chatpipe analytics` against the real broker: a stack of its own serves requests of two
orgs on two tiers, one of them cancelled, and a record nobody can read sits on chat.usage;
`ingest --until-idle` reads the topics into Parquet, and `report` answers what the usage
events say. Read again — the same group (nothing new) and a new group (every record a
second time) — the answers stay the same.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import duckdb
import pytest_asyncio
from typer.testing import CliRunner

from bench.topic_log import find_events
from bus.replay import read_to_end
from chatpipe.cli import app
from chatpipe.dev_stack import running_sim_stack, stack_settings
from chatpipe.wiring import Stack
from conversations.store import ApiKey
from schemas import topics
from schemas.events import DeadLetter, UsageEvent
from schemas.sse import read_messages
from schemas.topics import Tier
from tests.support.chat import post_message
from tests.support.stack import client_for

ORGS = {"acme": Tier.PRO, "globex": Tier.FREE}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def analytics_stack(tiny_model_dir, tmp_path_factory):
    settings = stack_settings(
        tmp_path_factory.mktemp("analytics-stack"),
        engine="sim",
        model=tiny_model_dir,
        sim_tokens_per_s=200.0,
        max_slots=8,
        auto_titles=False,
    )
    async with running_sim_stack(settings) as stack:
        yield stack


async def _key(stack: Stack, org: str) -> str:
    key = f"cp-test-{uuid.uuid4().hex}"
    await stack.store.add_api_key(key, ApiKey(user_id=f"user-{org}", org_id=org, tier=ORGS[org]))
    return key


async def _answered(stack: Stack, key: str, count: int) -> None:
    async with client_for(stack, key) as client:
        for n in range(count):
            cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
            turn = await post_message(client, cid, {"content": f"hello {n}", "max_tokens": 12})
            assert turn.status == 200 and turn.ended_with_done


async def _cancelled(stack: Stack, key: str) -> str:
    async with client_for(stack, key) as client:
        cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        body = {"content": "talk for long", "max_tokens": 2000, "ignore_eos": True}
        async with client.stream("POST", f"/v1/conversations/{cid}/messages", json=body) as stream:
            lines = stream.aiter_lines()
            started = await read_messages(lines, stop=lambda e: e.event == "delta")
            request_id = started[0].json()["request_id"]
            stopped = await client.post(f"/v1/requests/{request_id}/cancel")
            assert stopped.status_code == 202, stopped.text
            rest = await read_messages(lines)
    [done] = [e.json() for e in rest if e.event == "done"]
    assert done["status"] == "finished_aborted"
    return request_id


def _cli(stack: Stack, *args: str) -> str:
    result = CliRunner().invoke(
        app,
        list(args),
        env={
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
            "CHATPIPE_DATABASE_PATH": str(stack.settings.storage.database_path),
        },
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


async def _ingest(stack: Stack, where: list[str], *extra: str) -> str:
    return await asyncio.to_thread(
        _cli, stack, "analytics", "ingest", "--until-idle", "--flush-s", "1", *where, *extra
    )


async def _report(stack: Stack, where: list[str], plot: Path) -> dict:
    output = await asyncio.to_thread(
        _cli, stack, "analytics", "report", "--since", "1h", "--json", "--plot", str(plot), *where
    )
    return json.loads(output)


async def test_analytics_counts_what_the_bus_carried_once(
    analytics_stack: Stack, tmp_path: Path
) -> None:
    stack = analytics_stack
    acme, globex = await _key(stack, "acme"), await _key(stack, "globex")
    await _answered(stack, acme, 2)
    await _answered(stack, globex, 2)
    cancelled = await _cancelled(stack, globex)
    usage_events = await find_events(stack.kafka, topics.USAGE, UsageEvent, lambda e: True, count=5)
    assert cancelled in {e.request_id for e in usage_events}

    producer = stack.kafka.producer()
    await producer.start()
    try:  # a usage record nobody can read: dead-lettered, and the rest is counted
        await producer.send_and_wait(
            topics.USAGE, b"{not json", key=b"user-acme", headers=[("event-type", b"usage")]
        )
    finally:
        await producer.stop()

    where = ["--db", str(tmp_path / "analytics.duckdb"), "--data", str(tmp_path / "parquet")]
    ingested = await _ingest(stack, where)
    assert await find_events(
        stack.kafka,
        topics.DLQ,
        DeadLetter,
        lambda e: e.stage == "analytics" and e.value == "{not json",
    )
    assert "usage 5" in ingested and "requests 5" in ingested, ingested
    answer = await _report(stack, where, tmp_path / "tokens.png")

    usage = [event for _, _, event in await read_to_end(stack.kafka, topics.USAGE, UsageEvent)]
    totals = answer["totals"]
    assert totals["usage_events"] == len(usage) == 5
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        assert totals[name] == sum(getattr(event, name) for event in usage), name
    assert totals["completion_tokens"] > 0
    by_org = {row["org_id"]: row for row in answer["tokens"]}
    assert {row["tier"] for row in answer["tokens"]} == {"pro", "free"}
    for org, tier in ORGS.items():
        mine = [event for event in usage if event.org_id == org]
        assert by_org[org]["tier"] == tier.value
        assert by_org[org]["completion_tokens"] == sum(e.completion_tokens for e in mine)
        assert by_org[org]["requests"] == len({e.request_id for e in mine})
    assert (totals["requests"], totals["cancellations"], totals["retractions"]) == (5, 1, 0)
    ttft = {row["tier"]: row for row in answer["ttft_ms"]}
    assert ttft["pro"]["requests"] == 2 and ttft["free"]["requests"] == 3
    assert 0 < ttft["all"]["p50_ms"] <= ttft["all"]["p99_ms"] < 30_000
    png = (tmp_path / "tokens.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")

    assert "read 0 records" in await _ingest(stack, where)  # committed: nothing again
    again = await _ingest(stack, where, "--group", "chatpipe-analytics-rebuild")
    assert "usage 5" in again, again  # every record read a second time
    files = str(tmp_path / "parquet" / "usage" / "*.parquet")
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{files}')").fetchall() == [(10,)]
    reread = await _report(stack, where, tmp_path / "tokens-again.png")
    for name in ("totals", "tokens", "requests", "ttft_ms", "tokens_per_minute"):
        assert reread[name] == answer[name], name

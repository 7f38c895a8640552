"""The response cache in the gateway, in process (`gateway.cache.cached_pipeline`): real SQLite
store, scripted pipeline (see test_gateway_app), both APIs through HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import REGISTRY

from conversations.files import StoredFile
from conversations.sqlite_store import SQLiteStore
from conversations.store import ApiKey, OrgSettings
from gateway.app import create_app
from gateway.cache.cached_pipeline import CachedPipeline, ReplayStream
from gateway.config import ResponseCacheConfig
from gateway.deps import GatewayDeps
from moderation.classifiers import RuleClassifier
from moderation.policy import SafetyPolicy
from schemas import sse
from schemas.events import DeliverEvent, DeliveryDone, GenerationRequest, Usage, UsageEvent
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.gateway import (
    ALICE,
    BOB,
    ScriptedPipeline,
    delta,
    done,
    gateway_deps,
    is_background,
    new_conversation,
)

CONFIG = ResponseCacheConfig(ttl_s=60.0, tokens_per_s=100.0, chunk_s=0.001)
"""One token a chunk, 10 ms apart: a few chunks, quickly (and the deployment's system
prompt, from the test's settings)."""
POLICY = SafetyPolicy(output={"free": [RuleClassifier({}, pii=["email"])]})
"""Output classifiers for the free tier only: a pro or enterprise answer is not checked."""
CAROL = {"Authorization": "Bearer key-carol"}
"""carol of org-a (alice's), free."""
DAVE = {"Authorization": "Bearer key-dave"}
"""dave of org-a, enterprise."""


class Recorder:
    def __init__(self) -> None:
        self.replays: list[tuple[GenerationRequest, list[DeliverEvent], UsageEvent]] = []

    async def record_replay(self, request, events, usage) -> None:
        self.replays.append((request, events, usage))


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def cached(pipeline, recorder, store, settings) -> CachedPipeline:
    config = dataclasses.replace(CONFIG, system_prompt=settings.context.system_prompt)
    return CachedPipeline(pipeline, recorder, store, config, POLICY.output_policy)


@pytest.fixture
async def client(settings, store, cached) -> AsyncIterator[httpx.AsyncClient]:
    deps: GatewayDeps = gateway_deps(settings, store, cached, reply_wait_s=0.3)
    transport = httpx.ASGITransport(create_app(deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
    await deps.background.close()


@pytest.fixture
async def opted_in(store: SQLiteStore) -> None:
    await store.set_org_settings(OrgSettings("org-a", response_cache=True))  # alice's org


def answer_script(pipeline: ScriptedPipeline) -> None:
    pipeline.script(delta("The ", 0), delta("answer ", 1), delta("is 4.", 2), done(3))


def user_turns(pipeline: ScriptedPipeline) -> list[GenerationRequest]:
    return [r for r in pipeline.submitted if not is_background(r)]


async def native(client, text="2+2?", temperature=0.0, headers=ALICE, cid=None):
    """(conversation id, the turn's SSE messages)."""
    if cid is None:
        created = await client.post("/v1/conversations", json={}, headers=headers)
        cid = created.json()["conversation_id"]
    response = await client.post(
        f"/v1/conversations/{cid}/messages",
        headers=headers,
        json={"content": text, "temperature": temperature},
    )
    assert response.status_code == 200, response.text
    return cid, sse.parse_messages(response.text)


def done_of(messages) -> dict:
    [end] = [json.loads(m.data) for m in messages if m.event == "done"]
    return end


def text_of(messages) -> str:
    return "".join(json.loads(m.data)["delta"] for m in messages if m.event == "delta")


def counted(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"tier": "pro", "model": "tiny-random", **labels}) or 0.0


async def test_a_repeat_of_an_opted_in_org_is_replayed_stored_and_marked_hit(
    client, pipeline, recorder, store, opted_in
) -> None:
    lookups = "chatpipe:response_cache_lookups_total"
    hits, misses = counted(lookups, outcome="hit"), counted(lookups, outcome="miss")
    fills = counted("chatpipe:response_cache_fills_total")
    answer_script(pipeline)
    _, first = await native(client)
    assert done_of(first)["cache"] == "miss" and done_of(first)["usage"]["cache"] == "miss"

    cid, second = await native(client)

    assert counted(lookups, outcome="miss") == misses + 1
    assert counted(lookups, outcome="hit") == hits + 1
    assert counted("chatpipe:response_cache_fills_total") == fills + 1

    assert len(user_turns(pipeline)) == 1, "the repeat was never queued"
    assert text_of(second) == "The answer is 4."
    end = done_of(second)
    assert end["cache"] == "hit" and end["status"] == "finished_stopped"
    assert end["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "cached_tokens": 7,
                            "cache": "hit"}  # fmt: skip
    [(request, events, usage)] = recorder.replays
    assert isinstance(events[-1], DeliveryDone) and usage.cache == "hit"
    assert (usage.gpu_ms, usage.worker_id, usage.org_id) == (0.0, "response-cache", "org-a")
    _, answer = await store.list_messages(cid)
    assert (answer.content, answer.status, answer.request_id) == (
        "The answer is 4.",
        RequestStatus.FINISHED_STOPPED,
        request.request_id,
    )


async def test_an_opted_out_org_never_hits(client, pipeline, recorder, opted_in) -> None:
    for _ in range(2):
        answer_script(pipeline)
        _, messages = await native(client, headers=BOB)  # org-b never opted in
        assert "cache" not in done_of(messages) and "cache" not in done_of(messages)["usage"]
    assert len(user_turns(pipeline)) == 2 and recorder.replays == []


async def test_another_orgs_identical_request_is_a_miss(client, pipeline, store,
                                                        opted_in) -> None:  # fmt: skip
    await store.set_org_settings(OrgSettings("org-b", response_cache=True))
    answer_script(pipeline)
    await native(client)
    answer_script(pipeline)
    _, bobs = await native(client, headers=BOB)
    assert done_of(bobs)["cache"] == "miss" and len(user_turns(pipeline)) == 2


async def test_a_user_under_another_output_policy_never_gets_the_kept_answer(
    client, pipeline, store, opted_in
) -> None:
    await store.add_api_key("key-carol", ApiKey("carol", "org-a", Tier.FREE))
    await store.add_api_key("key-dave", ApiKey("dave", "org-a", Tier.ENTERPRISE))
    pipeline.script(delta("Write to ", 0), delta("bob@example.com.", 1), done(2))
    _, alices = await native(client)  # pro: nothing checks this answer; it is kept
    assert done_of(alices)["cache"] == "miss"

    answer_script(pipeline)
    _, carols = await native(client, headers=CAROL)  # free: her answers are checked

    assert done_of(carols)["cache"] == "miss" and text_of(carols) == "The answer is 4."
    assert len(user_turns(pipeline)) == 2, "generated (and checked), not replayed"
    # under the same output policy as alice's (none), another tier's repeat is a hit
    _, daves = await native(client, headers=DAVE)
    assert done_of(daves)["cache"] == "hit" and text_of(daves) == "Write to bob@example.com."
    _, carols_again = await native(client, headers=CAROL)  # her own policy's entry
    assert done_of(carols_again)["cache"] == "hit" and len(user_turns(pipeline)) == 2


async def test_a_turn_naming_files_is_never_looked_up_nor_kept(
    client, pipeline, store, opted_in
) -> None:
    """No documents service here: the files' search finds nothing, so the turn's prompt
    is a plain first turn's; naming files still keeps it from the cache."""
    await store.add_file(StoredFile("file-1", "org-a", "alice", "notes.md", "text/markdown",
                                    "assistants", 10, 0, "minilm"), [])  # fmt: skip
    answer_script(pipeline)
    await native(client)  # kept
    with_files = {"content": "2+2?", "temperature": 0, "file_ids": ["file-1"]}
    for _ in range(2):
        answer_script(pipeline)
        cid = await new_conversation(client)
        response = await client.post(f"/v1/conversations/{cid}/messages", headers=ALICE,
                                     json=with_files)  # fmt: skip
        assert response.status_code == 200, response.text
        assert "cache" not in done_of(sse.parse_messages(response.text))
    *_, plain, first_with_files, second_with_files = user_turns(pipeline)
    assert first_with_files.messages == plain.messages, "nothing was retrieved"
    assert first_with_files.file_ids == second_with_files.file_ids == ("file-1",)
    assert len(user_turns(pipeline)) == 3

    await store.set_org_settings(OrgSettings("org-b", response_cache=True))
    await store.add_file(StoredFile("file-2", "org-b", "bob", "notes.md", "text/markdown",
                                    "assistants", 10, 0, "minilm"), [])  # fmt: skip
    answer_script(pipeline)
    cid = await new_conversation(client, headers=BOB)
    await client.post(f"/v1/conversations/{cid}/messages", headers=BOB,
                      json={**with_files, "file_ids": ["file-2"]})  # fmt: skip
    answer_script(pipeline)
    _, plain_after = await native(client, headers=BOB)
    assert done_of(plain_after)["cache"] == "miss", "the turn with files kept nothing"


async def test_a_prompt_with_history_or_temperature_never_hits(client, pipeline,
                                                               opted_in) -> None:  # fmt: skip
    answer_script(pipeline)
    cid, _ = await native(client)
    answer_script(pipeline)
    await native(client, cid=cid)  # the same question again, after the first exchange
    answer_script(pipeline)
    _, warm = await native(client, temperature=0.7)
    assert "cache" not in done_of(warm)
    assert len(user_turns(pipeline)) == 3


async def test_an_answer_cut_short_is_not_kept(client, pipeline, opted_in) -> None:
    pipeline.script(delta("The ", 0), done(1, RequestStatus.FINISHED_ABORTED))
    await native(client)
    answer_script(pipeline)
    _, again = await native(client)
    assert done_of(again)["cache"] == "miss" and len(user_turns(pipeline)) == 2


async def test_the_openai_route_replays_a_hit_in_chunks_with_its_usage(
    client, pipeline, opted_in
) -> None:
    body = {"model": "tiny-random", "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "2+2?"}]}  # fmt: skip
    answer_script(pipeline)
    first = await client.post("/v1/chat/completions", json=body, headers=ALICE)
    second = await client.post("/v1/chat/completions", json=body, headers=ALICE)

    chunks = [m.json() for m in sse.parse_messages(second.text) if not m.is_done]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "The answer is 4." and len(user_turns(pipeline)) == 1
    assert chunks[-1]["usage"]["response_cache"] == "hit"
    first_usage = [m.json() for m in sse.parse_messages(first.text) if not m.is_done][-1]
    assert first_usage["usage"]["response_cache"] == "miss"
    whole = await client.post("/v1/chat/completions", json={**body, "stream": False},
                              headers=ALICE)  # fmt: skip
    assert whole.json()["choices"][0]["message"]["content"] == "The answer is 4."
    assert whole.json()["usage"]["response_cache"] == "hit"


async def test_stop_ends_a_replay_aborted_after_what_was_shown() -> None:
    timed = [(0.0, delta("a", 0)), (60.0, delta("b", 1)),
             (60.0, DeliveryDone(request_id="-", seq=2, status=RequestStatus.FINISHED_STOPPED,
                                 usage=Usage(completion_tokens=2, cache="hit")))]  # fmt: skip
    stream = ReplayStream(timed, "r1")
    assert [e.text for e in await stream.take()] == ["a"]
    waiting = asyncio.create_task(stream.take())
    await asyncio.sleep(0)
    stream.stop()
    [end] = await waiting
    assert isinstance(end, DeliveryDone)
    assert (end.seq, end.status, end.usage.cache) == (1, RequestStatus.FINISHED_ABORTED, "hit")
    assert await stream.take() == []


def test_the_cached_pipeline_passes_on_every_call_of_the_pipeline() -> None:
    """A call the wrapper lacks fails only when that route is used (it did: feedback)."""
    from gateway.cache.cached_pipeline import CachedPipeline
    from gateway.pipeline import Pipeline

    wanted = {name for name in vars(Pipeline) if not name.startswith("_")}
    assert wanted <= set(dir(CachedPipeline)), wanted - set(dir(CachedPipeline))

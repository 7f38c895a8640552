"""The response cache end to end on the sim stack (real broker, scheduler, worker, safety,
recorder, billing; real HTTP): an opted-in org's repeat is replayed from the store with
no work dispatched, in paced chunks, marked in the done event and usage, stored in the
conversation and resumable; another org, an opted-out org and a prompt with history are
generated. An answer kept for a tier whose output nothing checks (enterprise, on the sim
stack) is never replayed to a free user, whose check retracts it; a turn naming files
is never answered from the cache nor kept, even when their search finds nothing.

The sim engine seeds each answer with its request id, so two generations of one prompt
differ: an answer equal to the first one's text was replayed, not generated.
"""

from __future__ import annotations

import uuid

import httpx
from prometheus_client import REGISTRY

from bench.topic_log import find_events
from conversations.store import ApiKey, OrgSettings
from schemas import topics
from schemas.events import UsageEvent
from schemas.topics import Tier
from tests.support.chat import SseResult, post_message, read_sse
from tests.support.conversations import queued_request
from tests.support.files import upload
from tests.support.stack import client_for

PROMPT = "[[sim:length=40]] tell me about caches"
TURN = {"content": PROMPT, "temperature": 0, "max_tokens": 64}


def dispatched() -> float:
    """Pro-tier requests the scheduler (in this process) has dispatched to a worker, ever:
    the tenants' turns here (a conversation's generated title is a free-tier request)."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "chatpipe:request_queue_time_seconds"
        for sample in metric.samples
        if sample.name.endswith("_count") and sample.labels["tier"] == "pro"
    )


async def tenant(stack, *, cached: bool) -> httpx.AsyncClient:
    """A client of a new org (and user), opted in to the response cache or not."""
    [client] = await org_users(stack, Tier.PRO, cached=cached)
    return client


async def org_users(stack, *tiers: Tier, cached: bool = True) -> list[httpx.AsyncClient]:
    """Clients of a new org (opted in to the response cache or not), a user of each tier."""
    org = f"org-{uuid.uuid4().hex[:8]}"
    if cached:
        await stack.store.set_org_settings(OrgSettings(org, response_cache=True))
    clients = []
    for number, tier in enumerate(tiers):
        key = f"cp-test-{uuid.uuid4().hex}"
        await stack.store.add_api_key(key, ApiKey(f"user-{number}", org_id=org, tier=tier))
        clients.append(client_for(stack, key))
    return clients


async def turn(client: httpx.AsyncClient, body=TURN, conversation_id=None) -> SseResult:
    if conversation_id is None:
        created = await client.post("/v1/conversations", json={"title": "cache"})
        conversation_id = created.json()["conversation_id"]
    result = await post_message(client, conversation_id, body)
    assert result.status == 200 and result.ended_with_done, result
    result.conversation_id = conversation_id  # type: ignore[attr-defined]
    return result


def done(result: SseResult) -> dict:
    return result.of("done")[0].json()


async def test_an_opted_in_orgs_repeat_is_replayed_without_dispatch(sim_stack) -> None:
    async with await tenant(sim_stack, cached=True) as client:
        first = await turn(client)
        assert done(first)["cache"] == "miss"
        before = dispatched()

        second = await turn(client)

        assert dispatched() == before, "a hit dispatches nothing"
        assert second.text == first.text, "replayed, not generated again"
        end = done(second)
        assert end["cache"] == "hit" and end["usage"]["cache"] == "hit"
        assert end["usage"]["completion_tokens"] == done(first)["usage"]["completion_tokens"]
        deltas = second.of("delta")
        assert len(deltas) >= 5, "streamed in chunks, not one burst"
        assert deltas[-1].at - deltas[0].at >= 0.2, "paced at the replay's tokens/s"

        request_id = second.request["request_id"]
        stored = (await client.get(f"/v1/conversations/{second.conversation_id}")).json()
        [answer] = [m for m in stored["messages"] if m["role"] == "assistant"]
        assert (answer["content"], answer["status"]) == (first.text, "finished_stopped")
        async with client.stream("GET", f"/v1/requests/{request_id}/events") as resumed:
            replayed = SseResult(resumed.status_code, await read_sse(resumed))
        assert replayed.text == first.text and done(replayed)["cache"] == "hit"
        [usage] = await find_events(
            sim_stack.kafka,
            topics.USAGE,
            UsageEvent,
            lambda e: e.request_id == request_id,
            timeout_s=20,
        )
        assert (usage.cache, usage.gpu_ms, usage.worker_id) == ("hit", 0.0, "response-cache")


async def test_the_openai_route_replays_a_repeat_too(sim_stack) -> None:
    body = {"model": sim_stack.settings.inference.model_name, "temperature": 0, "max_tokens": 64,
            "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": PROMPT + " (openai)"}]}  # fmt: skip
    async with await tenant(sim_stack, cached=True) as client:
        texts, usages = [], []
        for _ in range(2):
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                chunks = [m.json() for m in await read_sse(response) if not m.is_done]
            texts.append("".join(c["choices"][0]["delta"].get("content") or ""
                                 for c in chunks if c["choices"]))  # fmt: skip
            usages.append(chunks[-1]["usage"]["response_cache"])
        assert texts[0] == texts[1] and usages == ["miss", "hit"]


async def test_other_orgs_opted_out_orgs_and_history_are_generated(sim_stack) -> None:
    async with (await tenant(sim_stack, cached=True) as acme,
                await tenant(sim_stack, cached=True) as globex,
                await tenant(sim_stack, cached=False) as plain):  # fmt: skip
        first = await turn(acme)
        before = dispatched()

        other_org = await turn(globex)
        assert done(other_org)["cache"] == "miss" and other_org.text != first.text

        opted_out = [await turn(plain) for _ in range(2)]
        assert all("cache" not in done(r) for r in opted_out)
        assert opted_out[0].text != opted_out[1].text

        again = await turn(acme, conversation_id=first.conversation_id)  # after history
        assert "cache" not in done(again) and again.text != first.text
        assert dispatched() == before + 4


LEAKY = {**TURN, "content": "[[sim:reply=Write to bob@example.com for the details.]] who?"}
"""An answer the output check (rules: an e-mail address) retracts, where it runs."""


async def test_a_free_user_never_gets_an_answer_kept_where_nothing_checks_output(
    sim_stack,
) -> None:
    enterprise, free = await org_users(sim_stack, Tier.ENTERPRISE, Tier.FREE)
    async with enterprise, free:
        kept = await turn(enterprise, LEAKY)  # nothing checks enterprise answers: kept
        assert done(kept)["cache"] == "miss" and not kept.of("retract")
        assert "bob@example.com" in kept.text
        assert done(await turn(enterprise, LEAKY))["cache"] == "hit", "the entry is there"

        for _ in range(2):  # the free user's own answers are retracted, so never kept
            checked = await turn(free, LEAKY)
            end = done(checked)
            assert (end["cache"], end["finish_reason"]) == ("miss", "content_filter"), end
            [retract] = checked.of("retract")
            assert retract.json()["reason"] == "pii"
            assert "bob@example.com" not in retract.json()["replacement"]


GARDEN = (
    "Behind the tower Anna grows potatoes, beans, onions and a row of tall sunflowers. "
    "The wind off the sea is hard on everything."
)
"""A file whose search for PROMPT finds nothing (no chunk is similar enough)."""


async def test_a_turn_naming_files_never_hits_and_is_never_kept(sim_stack) -> None:
    async with await tenant(sim_stack, cached=True) as client:
        garden = (await upload(client, "garden.md", GARDEN.encode(), "text/markdown")).json()
        with_files = {**TURN, "file_ids": [garden["id"]]}

        first = await turn(client, with_files)
        plain = await turn(client)
        again = await turn(client, with_files)

        assert "cache" not in done(first) and "cache" not in done(again), "not looked up"
        assert done(plain)["cache"] == "miss", "the turn with files kept nothing"
        assert len({first.text, plain.text, again.text}) == 3, "each one generated"
        assert not first.of("citations") and not again.of("citations")
        queued = [await queued_request(sim_stack, r.request["request_id"])
                  for r in (first, plain, again)]  # fmt: skip
        assert queued[0].messages == queued[1].messages == queued[2].messages, (
            "the search found nothing: the prompt is the plain turn's"
        )
        assert queued[0].file_ids == queued[2].file_ids == (garden["id"],)

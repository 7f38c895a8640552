"""Capacity management through the real broker with the sim engine:
priority under overload, fairness, cancel while queued, shedding, worker loss."""

from __future__ import annotations

import asyncio

import pytest

from bench.topic_log import find_events
from schemas import topics
from schemas.events import UsageEvent, WorkAssignment
from schemas.sse import SSEMessage
from schemas.topics import Tier
from tests.support.capacity import TOKENS_PER_S, Chat, sim_pipeline


def positions(events: list[SSEMessage]) -> list[int]:
    return [e.json()["position"] for e in events if e.event == "queued"]


async def test_priority_tiers_under_overload(tmp_path):
    service_s = 30 / TOKENS_PER_S
    async with sim_pipeline(tmp_path, slots=2) as stack:
        chats = {
            name: Chat(stack, key)
            for name, key in [("free", "free-a"), ("pro", "pro-a"), ("ent", "enterprise-a")]
        }
        free = [asyncio.create_task(chats["free"].ask(f"free {i}", 30)) for i in range(8)]
        await asyncio.sleep(0.3)
        (ent_ttft, _), (pro_ttft, _) = await asyncio.gather(
            chats["ent"].ask("vip", 30), chats["pro"].ask("paying", 30)
        )
        free_results = await asyncio.gather(*free)
        for chat in chats.values():
            await chat.aclose()
    # Paying tiers wait for at most one running request to end, not for the free queue.
    assert ent_ttft < service_s + 0.7, ent_ttft
    assert pro_ttft < 2 * service_s + 0.7, pro_ttft
    assert max(ttft for ttft, _ in free_results) > 2 * service_s
    queued = [positions(events) for _, events in free_results if len(positions(events)) >= 3]
    assert queued, "no free request saw its queue position change"
    for seen in queued:
        # Paying requests may push a free one back once; from then on it only moves up.
        after_peak = seen[seen.index(max(seen)) :]
        assert after_peak == sorted(after_peak, reverse=True), seen
        assert seen[-1] < max(seen), seen


async def test_flooding_user_does_not_starve_another(tmp_path):
    async with sim_pipeline(tmp_path, slots=1) as stack:
        flooder, polite = Chat(stack, "free-a"), Chat(stack, "free-b")
        flood = [asyncio.create_task(flooder.ask(f"flood {i}", 10)) for i in range(10)]
        await asyncio.sleep(0.5)
        polite_ttft, polite_events = await polite.ask("just one", 10)
        flood_results = await asyncio.gather(*flood)
        await flooder.aclose()
        await polite.aclose()
    assert positions(polite_events)[0] <= 2
    started_before_polite = sum(1 for ttft, _ in flood_results if ttft < polite_ttft)
    assert started_before_polite <= 3, (polite_ttft, sorted(t for t, _ in flood_results))


async def test_request_cancelled_while_queued_never_reaches_a_worker(tmp_path):
    async with sim_pipeline(tmp_path, slots=1) as stack:
        busy = Chat(stack, "free-a")
        running = asyncio.create_task(busy.ask("long", 80))
        await asyncio.sleep(0.3)
        waiting = Chat(stack, "free-b")
        _, events = await waiting.ask("will leave", 10, until="queued")
        await waiting.aclose()
        request_id = events[0].json()["request_id"]
        await running
        await busy.aclose()
        await asyncio.sleep(1.0)
        assigned = await find_events(
            stack.kafka,
            topics.WORK,
            WorkAssignment,
            lambda a: a.request.request_id == request_id,
            timeout_s=2,
        )
        used = await find_events(
            stack.kafka, topics.USAGE, UsageEvent, lambda u: u.request_id == request_id, timeout_s=1
        )
    assert assigned == [] and used == []


async def test_shedding_refuses_with_503_and_retry_after(tmp_path):
    async with sim_pipeline(tmp_path, slots=1, tier_max_wait_s={"free": 1.5}) as stack:
        chat = Chat(stack, "free-a")
        # One finished request of 1 s: the scheduler knows its pace. One request waiting
        # then means 2 s for the next (shedding), none waiting 1 s (not), clear of the
        # bound either way.
        await chat.ask("warm up", 40)
        conversation = (await chat.client.post("/v1/conversations", json={})).json()
        # Each backlog request runs 3 s: the tier sheds until the first of them ends.
        backlog = [asyncio.create_task(chat.ask(f"more {i}", 120)) for i in range(6)]
        model = stack.settings.inference.model_name
        for _ in range(200):
            if stack.pipeline.overloaded(Tier.FREE, model) is not None:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the gateway never heard that the free tier sheds")
        refused = await chat.client.post(
            f"/v1/conversations/{conversation['conversation_id']}/messages",
            json={"content": "one more", "max_tokens": 5},
        )
        results = await asyncio.gather(*backlog)
        await chat.aclose()
    assert refused.status_code == 503, refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "overloaded"
    errors = [e.json() for _, events in results for e in events if e.event == "error"]
    assert errors, "the scheduler admitted the whole backlog"
    assert all(e["code"] == "overloaded" and e["retry_after"] >= 1 for e in errors)
    served = [events for _, events in results if any(e.event == "delta" for e in events)]
    assert served, "shedding must not refuse everything"


pytestmark = pytest.mark.timeout(180)

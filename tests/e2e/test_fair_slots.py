"""One org floods every slot with long streams; another org's request still starts at
once: the scheduler takes a slot back from the flood (preemption), and the preempted
stream continues on its next attempt with nothing lost or repeated.

On the shared sim stack: 16 slots, 200 tokens/s per stream. Each of the flood's 20
answers is 1,900 words (9.5 s), so without preemption the other org's first token
would wait about as long for a flood stream to end. The sim engine's answer is a pure
function of the request, so each flood answer is checked word for word.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
from prometheus_client import REGISTRY

from conversations.store import ApiKey
from schemas.events import SamplingOptions
from schemas.topics import Tier
from tests.support.scheduler import make_request
from tests.support.stack import client_for
from workers.sim_engine import plan_reply

FLOOD = 20
WORDS = 1900
FIRST_TOKEN_BOUND_S = 5.0


async def _key(stack, org: str) -> str:
    key = f"cp-test-{uuid.uuid4().hex}"
    user = f"user-{uuid.uuid4().hex[:8]}"
    await stack.store.add_api_key(key, ApiKey(user_id=user, org_id=org, tier=Tier.PRO))
    return key


async def _stream(client: httpx.AsyncClient, text: str, max_tokens: int) -> dict:
    """A streamed chat completion: its request id, its text, the time of its first token
    and the longest gap between two chunks (seconds)."""
    body = {
        "model": "tiny-random",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    started = time.monotonic()
    first = last = None
    gap = 0.0
    parts: list[str] = []
    request_id = ""
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            assert "error" not in chunk, chunk
            request_id = chunk["id"].removeprefix("chatcmpl-")
            for choice in chunk["choices"]:
                delta = choice["delta"].get("content")
                if delta:
                    now = time.monotonic()
                    first = first if first is not None else now - started
                    gap = max(gap, now - last) if last is not None else gap
                    last = now
                    parts.append(delta)
    return {"id": request_id, "text": "".join(parts), "first_s": first, "gap_s": gap}


def _planned(request_id: str, text: str, max_tokens: int) -> str:
    """What the sim engine answers to `text` as request `request_id`, whole."""
    request = make_request(request_id, text=text)
    request = request.model_copy(update={"sampling": SamplingOptions(max_tokens=max_tokens)})
    return "".join(plan_reply(request).tokens)


def _preemptions() -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "chatpipe:preemptions"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


async def test_another_org_starts_at_once_while_one_floods_every_slot(sim_stack) -> None:
    flood_key, other_key = await _key(sim_stack, "org-flood"), await _key(sim_stack, "org-other")
    flood_text = f"[[sim:length={WORDS}]]"
    before = _preemptions()
    async with client_for(sim_stack, flood_key) as flood, client_for(sim_stack, other_key) as other:
        streams = [asyncio.create_task(_stream(flood, flood_text, WORDS)) for _ in range(FLOOD)]
        await asyncio.sleep(1.5)  # the flood holds every slot, four of it wait
        started = time.monotonic()
        answer = await _stream(other, "[[sim:reply=served now]]", 8)
        waited_s = time.monotonic() - started
        flooded = await asyncio.gather(*streams)

    assert answer["text"] == "served now"
    assert answer["first_s"] <= FIRST_TOKEN_BOUND_S, f"first token after {answer['first_s']:.1f} s"
    assert _preemptions() > before, "the flood kept every slot"
    # Each flood answer is whole: the preempted one went on where it stopped.
    assert [s["text"] for s in flooded] == [_planned(s["id"], flood_text, WORDS) for s in flooded]
    assert all(len(s["text"].split()) == WORDS for s in flooded)
    pause = max(s["gap_s"] for s in flooded)
    print(f"other org: first token {answer['first_s']:.2f} s, answer {waited_s:.2f} s; "
          f"longest pause of a flood stream {pause:.2f} s")  # fmt: skip

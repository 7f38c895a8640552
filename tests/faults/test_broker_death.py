"""The embedded broker SIGKILLed under `chatpipe up` (its own process, sim engine) while
eight native answers stream: the broker keeps nothing, so those answers are gone.

Every open stream ends at once with error `answer_lost` (stored so), nothing stalls:
while the broker is down a request is refused at once with 503 and Retry-After and
`/readyz` says not ready; `chatpipe up` starts the broker again, every stage comes
back by itself, and a new request is answered within 30 s of the kill; then eight
answers stream to their end as before.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import psutil

from tests.support.chat import SseResult, post_message
from tests.support.chatpipe_up import Up, chatpipe_up
from tests.support.conversations import new_conversation

STREAMS = 8
RECOVERED_WITHIN_S = 30.0
ENDED_WITHIN_S = 5.0
REFUSED_WITHIN_S = 2.0
UNLIMITED = {"CHATPIPE_MAX_CONCURRENT_REQUESTS": "{}"}  # eight streams from the one key


def broker_of(up: Up) -> psutil.Process:
    [broker] = [
        child
        for child in psutil.Process(up.pid).children(recursive=True)
        if "broker" in child.cmdline() and "--storage-engine" in child.cmdline()
    ]
    return broker


async def streamed(client: httpx.AsyncClient, tokens: int) -> list[tuple[str, SseResult]]:
    """(conversation id, stream) of each of STREAMS answers asked at once."""
    conversations = [await new_conversation(client) for _ in range(STREAMS)]
    results = await asyncio.gather(*(
        post_message(client, cid, {"content": f"[[sim:length={tokens}]] go", "max_tokens": tokens})
        for cid in conversations
    ))  # fmt: skip
    return list(zip(conversations, results, strict=True))


async def chat(client: httpx.AsyncClient) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "[[sim:reply=back]] there?"}],
        "model": "tiny-random", "max_tokens": 4}, timeout=60)  # fmt: skip
    return response, time.monotonic() - started


async def test_a_killed_embedded_broker_ends_every_stream_and_the_stack_comes_back(
    tmp_path, tiny_model_dir
) -> None:
    async with (
        chatpipe_up(tmp_path, "--model", str(tiny_model_dir), env=UNLIMITED) as up,
        httpx.AsyncClient(
            base_url=up.url, headers={"Authorization": f"Bearer {up.key}"}, timeout=60
        ) as client,
    ):
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["ready"] and ready.json()["models"]["tiny-random"]["workers"] == 1

        running = asyncio.create_task(streamed(client, 1500))
        await asyncio.sleep(3.0)  # every stream has started
        broker = broker_of(up)
        broker.kill()
        killed = time.monotonic()
        lost = await asyncio.wait_for(running, ENDED_WITHIN_S + 3.0)
        ended_after = time.monotonic() - killed
        for _, result in lost:
            assert result.status == 200 and result.text, "every stream had started"
            [error] = result.of("error")
            assert error.json()["code"] == "answer_lost"
            assert result.events[-2] is error and result.ended_with_done  # then [DONE]
        assert ended_after < ENDED_WITHIN_S

        probes: list[tuple[float, int, float]] = []  # (since the kill, status, took)
        while True:
            readiness = await client.get("/readyz")
            response, took = await chat(client)
            probes.append((time.monotonic() - killed, response.status_code, took))
            if response.status_code == 200:
                break
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "pipeline_unavailable"
            assert int(response.headers["Retry-After"]) >= 1
            assert took < REFUSED_WITHIN_S, probes
            assert readiness.status_code == 503
            assert not readiness.json()["ready"]
            assert time.monotonic() - killed < RECOVERED_WITHIN_S, probes
            await asyncio.sleep(0.5)
        recovered_after = time.monotonic() - killed
        print(f"streams ended {ended_after:.2f} s after the kill; answered again after "
              f"{recovered_after:.1f} s; probes {probes}")  # fmt: skip
        assert response.json()["choices"][0]["message"]["content"] == "back"
        assert recovered_after < RECOVERED_WITHIN_S
        assert broker_of(up).pid != broker.pid

        again = [result for _, result in await streamed(client, 40)]
        assert [(r.status, r.ended_with_done, len(r.text.split())) for r in again] == [
            (200, True, 40)
        ] * STREAMS, [r.events[-3:] for r in again]
        assert (await client.get("/readyz")).status_code == 200
        for cid, result in lost:
            stored = (await client.get(f"/v1/conversations/{cid}")).json()["messages"]
            [answer] = [m for m in stored if m["message_id"] == result.request["message_id"]]
            assert answer["status"] == "finished_error", answer

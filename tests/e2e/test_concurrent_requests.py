"""A key's concurrent generations over HTTP through the whole pipeline (real broker, sim
engine, real sockets): past its limit every generating route answers 429
`too_many_concurrent_requests` with Retry-After, and each way a stream ends (a client
gone, a Stop, a native stream dropped past its resume grace, its end) frees its place,
so nothing is leaked."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import httpx

from chatpipe.wiring import Stack
from conversations.store import ApiKey, OrgSettings
from schemas.topics import Tier
from tests.support.chat import until
from tests.support.stack import client_for

LONG = 2000
"""Words of an answer that outlasts the test at the sim stack's 200 tokens a second."""
LONG_CHAT = {
    "model": "tiny-random",
    "messages": [{"role": "user", "content": f"[[sim:length={LONG}]]"}],
    "max_tokens": LONG,
    "stream": True,
}
SHORT_CHAT = {
    "model": "tiny-random",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 4,
}
LONG_TURN = {"content": f"[[sim:length={LONG}]]", "max_tokens": LONG}
STREAM = {"stream": True}


class OpenStream:
    """A streamed answer read as it arrives, by a client that may go away (`drop`)."""

    def __init__(self, client: httpx.AsyncClient, path: str, body: dict) -> None:
        self.lines: list[str] = []
        self._started = asyncio.Event()
        self._task = asyncio.create_task(self._read(client, path, body))

    @classmethod
    async def open(cls, client: httpx.AsyncClient, path: str, body: dict) -> OpenStream:
        """Returns once the answer streams (its first data line arrived)."""
        stream = cls(client, path, body)
        started = asyncio.create_task(stream._started.wait())
        await asyncio.wait([stream._task, started], timeout=30,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        started.cancel()
        if stream._task.done():
            stream._task.result()
        assert stream._started.is_set(), f"{path}: no answer streamed"
        return stream

    async def _read(self, client: httpx.AsyncClient, path: str, body: dict) -> None:
        async with client.stream("POST", path, json=body) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                self.lines.append(line)
                if line.startswith("data:"):
                    self._started.set()

    @property
    def request_id(self) -> str:
        """The native stream's request id (its first event's)."""
        first = next(line for line in self.lines if line.startswith("data:"))
        return json.loads(first.removeprefix("data:"))["request_id"]

    async def drop(self) -> None:
        """The client goes away: its connection is closed."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def finished(self, timeout_s: float = 30) -> list[str]:
        await asyncio.wait_for(self._task, timeout_s)
        return self.lines


async def key_client(stack: Stack, org: str, max_concurrent: int | None) -> httpx.AsyncClient:
    user = f"user-{uuid.uuid4().hex[:8]}"
    key = f"key-{user}"
    owner = ApiKey(user, org, Tier.PRO, max_concurrent_requests=max_concurrent)
    await stack.store.add_api_key(key, owner)
    return client_for(stack, key)


def assert_too_many(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "too_many_concurrent_requests"
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert response.headers["retry-after"] == "1"


async def admitted_within(client: httpx.AsyncClient, path: str, body: dict,
                          timeout_s: float = 10) -> tuple[OpenStream, float]:  # fmt: skip
    """A stream opened as soon as the key has room again, and how long that took; a
    refusal in between is 429 too_many_concurrent_requests."""
    started = time.monotonic()
    while True:
        probe = await client.post("/v1/chat/completions", json=SHORT_CHAT | {"max_tokens": 1})
        if probe.status_code == 200:
            break
        assert_too_many(probe)
        assert time.monotonic() - started < timeout_s, "the place was never given back"
        await asyncio.sleep(0.05)
    return await OpenStream.open(client, path, body), time.monotonic() - started


async def test_a_key_past_its_limit_is_refused_until_its_streams_end(sim_stack: Stack) -> None:
    stack = sim_stack
    gate = stack.gateway.state.deps.concurrency
    async with await key_client(stack, f"org-{uuid.uuid4().hex[:8]}", 2) as client:
        cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        chat = await OpenStream.open(client, "/v1/chat/completions", LONG_CHAT)
        turn = await OpenStream.open(client, f"/v1/conversations/{cid}/messages", LONG_TURN)

        other = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        for path, body in [
            ("/v1/chat/completions", LONG_CHAT),
            ("/v1/chat/completions", SHORT_CHAT),
            ("/v1/completions", {"model": "tiny-random", "prompt": "hi", "max_tokens": 4}),
            ("/v1/responses", {"model": "tiny-random", "input": "hi", "max_output_tokens": 4}),
            (f"/v1/conversations/{other}/messages", {"content": "hi", "max_tokens": 4}),
        ]:
            assert_too_many(await client.post(path, json=body))

        # The client goes away: the OpenAI stream is cancelled and its place is free.
        await chat.drop()
        chat, _ = await admitted_within(client, "/v1/chat/completions", LONG_CHAT)

        # Stop: the native answer ends aborted and its place is free.
        stopped = await client.post(f"/v1/requests/{turn.request_id}/cancel")
        assert stopped.status_code == 202, stopped.text
        lines = await turn.finished()
        assert any("finished_aborted" in line for line in lines), lines[-4:]
        turn, _ = await admitted_within(client, f"/v1/conversations/{other}/messages", LONG_TURN)

        # A native stream dropped is held for its resume grace, then cancelled.
        await turn.drop()
        short, _ = await admitted_within(client, "/v1/chat/completions", SHORT_CHAT | STREAM)
        await short.finished()

        await chat.drop()
        await until(lambda: gate.held == 0, timeout_s=15, interval_s=0.05)
        both = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=SHORT_CHAT) for _ in range(2))
        )
        assert [r.status_code for r in both] == [200, 200], "every place was given back"
        assert gate.held == 0


async def test_an_orgs_limit_holds_for_each_of_its_keys_without_one_of_its_own(
    sim_stack: Stack,
) -> None:
    stack = sim_stack
    org = f"org-{uuid.uuid4().hex[:8]}"
    await stack.store.set_org_settings(OrgSettings(org, max_concurrent_requests=1))
    async with (
        await key_client(stack, org, None) as first,
        await key_client(stack, org, None) as second,
        await key_client(stack, org, 2) as own,
    ):
        running = await OpenStream.open(first, "/v1/chat/completions", LONG_CHAT)
        assert_too_many(await first.post("/v1/chat/completions", json=SHORT_CHAT))
        assert (await second.post("/v1/chat/completions", json=SHORT_CHAT)).status_code == 200
        held = await OpenStream.open(own, "/v1/chat/completions", LONG_CHAT)
        assert (await own.post("/v1/chat/completions", json=SHORT_CHAT)).status_code == 200
        for stream in (running, held):
            await stream.drop()

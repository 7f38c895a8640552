"""Uploads that would take the gateway, over HTTP through the whole pipeline (sim
engine): PDFs whose text pypdf takes tens of seconds to read are refused with a 413
naming the limit, each within 30 s, while another org's answers keep streaming with
their time to first token at p50 <= 0.5 s, timed by a client process of its own; the
uploads' names are stored as shown; a user's uploads are rate limited."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from chatpipe.wiring import Stack
from conversations.store import ApiKey
from schemas.topics import Tier
from tests.support.conversations import new_conversation, new_user, sse_post
from tests.support.documents import hostile_pdf
from tests.support.files import LIGHTHOUSE, upload
from tests.support.limits import clear_of_minute_edge
from tests.support.stack import client_for

PROBE = Path(__file__).resolve().parents[1] / "support" / "ttft_probe.py"
TTFT_P50_S = 0.5
T = TypeVar("T")
REFUSED_WITHIN_S = 30.0


async def org_keys(stack: Stack, count: int) -> list[str]:
    """Keys of `count` users of one new org."""
    org = f"org-{uuid.uuid4().hex[:8]}"
    keys = [f"key-{org}-{index}" for index in range(count)]
    for index, key in enumerate(keys):
        await stack.store.add_api_key(key, ApiKey(f"user-{index}", org, Tier.PRO))
    return keys


@dataclass
class Run:
    """Uploads sent together while another org's answers stream: how each upload was
    answered, and each answer's time to first token and longest gap (seconds), before
    the uploads and while they ran."""

    refusals: list[tuple[int, str, str, float]]
    quiet: list[dict[str, float]]
    busy: list[dict[str, float]]

    @property
    def ttft_p50(self) -> float:
        return statistics.median(answer["ttft"] for answer in self.busy)

    def report(self, what: str) -> str:
        answered = [(status, code, round(took, 2)) for status, code, _, took in self.refusals]
        return (
            f"\n{what}: (status, code, s) {answered}; TTFT p50 quiet"
            f" {statistics.median(a['ttft'] for a in self.quiet):.3f} s, during the uploads"
            f" {self.ttft_p50:.3f} s over {len(self.busy)} answers (max"
            f" {max(a['ttft'] for a in self.busy):.3f} s), longest gap between deltas"
            f" {max(a['gap'] for a in self.busy):.3f} s"
        )


Answers = list[dict[str, float]]


async def beside_streams(
    stack: Stack, load: Callable[[], Awaitable[list[T]]]
) -> tuple[list[T], Answers, Answers]:
    """`load` run while another org's answers stream, timed by a client process of its
    own (`tests/support/ttft_probe.py`): four of the org's users in turn, an answer
    every 0.25 s at most, under their rate limits. What `load` gave, the answers before
    it, and the answers that ended while it ran: a gateway that stalls gives few of
    them, all slow."""
    keys = await org_keys(stack, 4)
    async with client_for(stack, keys[0]) as first:  # the stack's first turn loads
        cid = await new_conversation(first)
        warm = await sse_post(first, f"/v1/conversations/{cid}/messages",
                              {"content": "warm", "max_tokens": 4})  # fmt: skip
        assert warm.ended_with_done
    probe = await asyncio.create_subprocess_exec(
        sys.executable, str(PROBE), stack.base_url, "0.25", *keys,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert probe.stdin is not None and probe.stdout is not None
    answers = probe.stdout

    async def answer() -> dict[str, float]:
        line = await asyncio.wait_for(answers.readline(), 60)
        assert line, "the probe stopped"
        return json.loads(line)

    try:
        quiet = [await answer() for _ in range(5)]
        loaded = asyncio.create_task(load())
        busy = []  # the answers read while the load ran
        while not loaded.done():
            busy.append(await answer())
        done = await loaded
    finally:
        probe.stdin.close()
        await asyncio.wait_for(probe.wait(), 60)
    return done, quiet, busy


async def uploads_beside_streams(stack: Stack, files: list[bytes]) -> Run:
    """`files` uploaded at once by one user while another org's answers stream."""

    async def uploads() -> list[tuple[int, str, str, float]]:
        async with await new_user(stack) as uploader:
            return await asyncio.gather(*(
                timed_upload(uploader, f"bomb-{i}.pdf", data) for i, data in enumerate(files)
            ))  # fmt: skip

    return Run(*await beside_streams(stack, uploads))


async def timed_upload(
    client: httpx.AsyncClient, name: str, data: bytes
) -> tuple[int, str, str, float]:
    started = time.monotonic()
    response = await upload(client, name, data, "application/pdf")
    took = time.monotonic() - started
    error = response.json()["error"] if response.status_code != 200 else {"code": "", "message": ""}
    return response.status_code, error["code"], error["message"], took


async def test_three_hostile_uploads_are_refused_within_30_s_while_another_orgs_answers_stream(
    sim_stack: Stack,
) -> None:
    """The tester's file three times: its pages' 5 MB of content is over the cap, and
    each is refused without a page being read."""
    run = await uploads_beside_streams(sim_stack, [hostile_pdf()] * 3)
    print(run.report("three 40 KB PDFs of 5 MB content"))
    assert [(status, code) for status, code, _, _ in run.refusals] == [
        (413, "file_too_complex")
    ] * 3
    assert all("page 1's content is 5000" in message for _, _, message, _ in run.refusals)
    assert all(took < REFUSED_WITHIN_S for *_, took in run.refusals), run.refusals
    assert run.busy and run.ttft_p50 <= TTFT_P50_S


async def test_files_read_for_seconds_leave_another_orgs_answers_streaming(
    sim_stack: Stack,
) -> None:
    """Two files under every cap but the text's: each is read for seconds of CPU in its
    own process until its text passes the cap. The process runs at a lower priority,
    so on a busy machine its wall-clock limit may come first: either is a 413."""
    timeout_s = sim_stack.settings.files.file_extract_timeout_s
    run = await uploads_beside_streams(sim_stack, [hostile_pdf(500_000, pages=8)] * 2)
    print(run.report("two PDFs of 8 pages of 500 KB content"))
    for status, code, message, took in run.refusals:
        assert (status, code) in ((413, "file_text_too_long"), (413, "file_too_complex"))
        assert code == "file_text_too_long" or f"longer than {timeout_s:g} s" in message
        assert took < timeout_s + 5.0
    assert len(run.busy) >= 3 and run.ttft_p50 <= TTFT_P50_S


async def test_embedding_calls_leave_another_orgs_answers_streaming(sim_stack: Stack) -> None:
    """Four `/v1/embeddings` calls at once, each of the most texts a call may carry, each
    text near the model's longest: seconds of CPU, in the embedding model's own process
    at a lower priority, not under the gateway's GIL."""
    inputs = sim_stack.settings.embeddings.max_embedding_inputs
    model = "all-MiniLM-L6-v2"
    text = " ".join(f"keeper{i} lit the lamp" for i in range(50))  # ~250 tokens

    async def embeddings() -> list[tuple[int, float]]:
        async with await new_user(sim_stack) as caller:

            async def one(n: int) -> tuple[int, float]:
                started = time.monotonic()
                response = await caller.post("/v1/embeddings", json={
                    "model": model, "input": [f"{n} {text}"] * inputs}, timeout=120)  # fmt: skip
                return response.status_code, time.monotonic() - started

            return await asyncio.gather(*(one(n) for n in range(4)))

    calls, quiet, busy = await beside_streams(sim_stack, embeddings)
    run = Run([(status, "", "", took) for status, took in calls], quiet, busy)
    print(run.report(f"four embedding calls of {inputs} texts"))
    assert [status for status, _ in calls] == [200] * 4
    assert len(run.busy) >= 3 and run.ttft_p50 <= TTFT_P50_S


async def test_a_files_name_is_stored_and_cited_without_control_characters(
    sim_stack: Stack,
) -> None:
    owner = await new_user(sim_stack)
    async with owner:
        sent = "\x1b[31mlight\u202edm.house\u2066.md"
        stored = (await upload(owner, sent, LIGHTHOUSE.encode(), "text/markdown")).json()
        assert stored["filename"] == "[31mlightdm.house.md"
        listed = (await owner.get("/v1/files")).json()["data"]
        assert [f["filename"] for f in listed] == ["[31mlightdm.house.md"]
        cid = await new_conversation(owner)
        result = await sse_post(owner, f"/v1/conversations/{cid}/messages", {
            "content": "[[sim:reply=At dusk.]] When does Anna light the lamp?",
            "file_ids": [stored["id"]], "max_tokens": 16})  # fmt: skip
        cited = result.of("citations")[0].json()["citations"]
        assert {c["filename"] for c in cited} == {"[31mlightdm.house.md"}


async def test_uploads_past_a_users_files_per_minute_are_refused_with_retry_after(
    sim_stack: Stack,
) -> None:
    per_minute = sim_stack.settings.rate_limits.user_files_per_minute
    owner = await new_user(sim_stack)
    async with owner:
        await clear_of_minute_edge(30.0)
        for i in range(per_minute):
            response = await upload(owner, f"note-{i}.txt", b"\xff not UTF-8")  # read, refused
            assert response.status_code == 400, response.text
        free = await upload(owner, "photo.png", b"\x89PNG\r\n")  # refused before admission
        assert free.status_code == 400
        over = await upload(owner, "one-more.txt", b"fine text")
    assert over.status_code == 429, over.text
    error = over.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limited", "rate_limit_error")
    assert error["message"].startswith(f"user_files_per_minute reached: {per_minute} of")
    assert 1 <= int(over.headers["Retry-After"]) <= 60
    assert over.headers["x-ratelimit-limit-files"] == str(per_minute)
    assert over.headers["x-ratelimit-remaining-files"] == "0"
    assert "x-ratelimit-remaining-requests" in over.headers

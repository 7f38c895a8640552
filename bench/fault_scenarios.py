"""Fault scenarios on a whole pipeline of processes (`bench/process_pipeline.py`): each
breaks something on purpose while answers stream and measures what the users saw.

The tests (`tests/faults/test_*.py`) assert on the measures; `python -m bench faults`
records them in `bench/RESULTS.md`. Every answer is a sim engine answer, so the text an
uninterrupted run streams is known exactly (`workers.sim_engine.plan_reply`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.broker_link import BrokerLink
from bench.process_pipeline import Pipeline, linked_pipeline
from bench.watched_streams import Watched, token_diff, watch
from bus.replay import read_to_end
from ledger.charges import Account
from ledger.periods import period_of
from ledger.store import SQLiteLedger
from schemas import topics
from schemas.codec import CONTROL_EVENT, WORK_EVENT
from schemas.events import (
    Cancel,
    GatewayHeartbeat,
    GenerationRequest,
    UsageEvent,
    WorkAssignment,
    WorkerHeartbeat,
)
from schemas.topics import Tier
from workers.sim_engine import plan_reply

TOKENS_PER_S = 20.0
LOST_AFTER_S = 2.0
RESUME_GRACE_S = 3.0
STALL_S = 8.0
DRAIN_S = 2.0
WORKERS = ("w1", "w2")
GATEWAYS = ("g1", "g2")
SIDE_STAGES = ("scheduler", "safety", "recorder", "billing")
DEV_USER = "dev"

PIPELINE_SETTINGS: dict[str, object] = dict(
    max_slots=64,
    sim_tokens_per_s=TOKENS_PER_S,
    worker_lost_after_s=LOST_AFTER_S,
    heartbeat_interval_s=0.5,
    resume_grace_s=RESUME_GRACE_S,
    stream_stall_s=STALL_S,
    drain_timeout_s=DRAIN_S,
    user_requests_per_minute=100_000,
    org_requests_per_minute=100_000,
    user_tokens_per_minute=100_000_000,
    org_tokens_per_minute=100_000_000,
)


@dataclass
class FaultResult:
    """What one scenario's users saw."""

    scenario: str
    streams: int
    finished: int
    tokens_missing: int
    tokens_repeated: int
    max_stall_ms: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return (
            self.finished == self.streams and self.tokens_missing == 0 and self.tokens_repeated == 0
        )


@contextlib.asynccontextmanager
async def stream_pipeline(tmp_path: Path, **settings: object) -> AsyncIterator[Pipeline]:
    """Scheduler, safety, recorder, billing, two workers and two gateways, each its own
    process, on one embedded broker that they reach through a link to cut
    (`broker_cut`)."""
    async with (
        BrokerLink() as link,
        linked_pipeline(tmp_path, link, **{**PIPELINE_SETTINGS, **settings}) as pipe,
    ):
        for stage in SIDE_STAGES:
            await pipe.start(stage)
        for worker in WORKERS:
            await pipe.start(worker, "worker")
        for gateway in GATEWAYS:
            await pipe.start(gateway, "gateway")
        await pipe.wait_for_workers(*WORKERS)
        for gateway in GATEWAYS:
            await pipe.wait_for_gateway(gateway)
        yield pipe


# --- streaming many answers ---------------------------------------------------------------


async def conversations(client: httpx.AsyncClient, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        response = await client.post("/v1/conversations", json={})
        assert response.status_code == 201, response.text
        ids.append(response.json()["conversation_id"])
    return ids


def body(tokens: int, label: str) -> dict[str, Any]:
    """A message whose answer is exactly `tokens` tokens (`tokens / TOKENS_PER_S` s)."""
    return {"content": f"{label}", "max_tokens": tokens, "ignore_eos": True}


class Streams:
    """Many answers streaming at once, each through `clients` (the first one asked,
    the others resumed on in turn when a connection breaks)."""

    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        self.clients = clients
        self.watched: list[Watched] = []
        self._tasks: list[asyncio.Task[Watched]] = []
        self._first: list[asyncio.Event] = []

    async def start(self, lengths: list[int], label: str) -> None:
        cids = await conversations(self.clients[0], len(lengths))
        for i, (cid, tokens) in enumerate(zip(cids, lengths, strict=True)):
            first, seen = asyncio.Event(), Watched()
            self._first.append(first)
            self.watched.append(seen)
            self._tasks.append(
                asyncio.create_task(
                    watch(
                        self.clients,
                        cid,
                        body(tokens, f"{label} {i}"),
                        seen=seen,
                        first_delta=first,
                    )
                )
            )

    async def streaming(self, timeout_s: float = 30.0) -> set[str]:
        """Once every answer has shown its first piece: their request ids."""
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(first.wait() for first in self._first))
        return {seen.request_id for seen in self.watched}

    async def results(self, timeout_s: float = 90.0) -> list[Watched]:
        async with asyncio.timeout(timeout_s):
            return await asyncio.gather(*self._tasks)


async def requests_of(pipe: Pipeline, watched: list[Watched]) -> dict[str, GenerationRequest]:
    """The requests as the gateway queued them (the dev user is in the free tier)."""
    wanted = {w.request_id for w in watched if w.ids}
    found = await pipe.find(
        topics.requests_topic(Tier.FREE),
        GenerationRequest,
        lambda r: r.request_id in wanted,
        count=len(wanted),
    )
    return {r.request_id: r for r in found}


async def judge(
    pipe: Pipeline, scenario: str, watched: list[Watched], **details: Any
) -> FaultResult:
    """Each answer against what an uninterrupted run of its request streams."""
    requests = await requests_of(pipe, watched)
    missing = repeated = 0
    for seen in watched:
        expected = "".join(plan_reply(requests[seen.request_id]).tokens)
        lost, extra = token_diff(expected, seen.text)
        missing, repeated = missing + lost, repeated + extra
    return FaultResult(
        scenario=scenario,
        streams=len(watched),
        finished=sum(w.finished for w in watched),
        tokens_missing=missing,
        tokens_repeated=repeated,
        max_stall_ms=round(max(w.max_stall_s() for w in watched) * 1000),
        details=details,
    )


async def assignments(pipe: Pipeline, request_ids: set[str]) -> list[WorkAssignment]:
    records = await read_to_end(pipe.kafka.bootstrap_servers, topics.WORK, WORK_EVENT)
    return [
        e
        for _, _, e in records
        if isinstance(e, WorkAssignment) and e.request.request_id in request_ids
    ]


async def busiest_worker(pipe: Pipeline, watched_ids: set[str]) -> str:
    """The worker that was handed most of these requests."""
    counts = Counter(a.worker_id for a in await assignments(pipe, watched_ids))
    return counts.most_common(1)[0][0]


# --- billing --------------------------------------------------------------------------------


async def tokens_billed(pipe: Pipeline, user: str = DEV_USER) -> int:
    ledger = SQLiteLedger(pipe.tmp_path / "chatpipe.db")
    await ledger.open()
    try:
        key = period_of(time.time(), "day").key
        account = Account.user(DEV_USER, user)
        return (await ledger.used([account], "day", key))[account]
    finally:
        await ledger.close()


async def billed_once(
    pipe: Pipeline, before: int, watched: list[Watched], timeout_s: float = 20.0
) -> tuple[int, int]:
    """(tokens the ledger added, tokens the answers used): equal when every prompt and
    every generated token is billed exactly once. Waits for billing to catch up."""
    used = sum(
        w.end["usage"]["prompt_tokens"] + w.end["usage"]["completion_tokens"]
        for w in watched
        if w.end and "usage" in w.end
    )
    deadline = time.monotonic() + timeout_s
    while True:
        added = await tokens_billed(pipe) - before
        if added >= used or time.monotonic() > deadline:
            await asyncio.sleep(1.0)  # anything counted twice would arrive now
            return await tokens_billed(pipe) - before, used
        await asyncio.sleep(0.3)


# --- the scenarios ----------------------------------------------------------------------------


async def worker_crash(
    pipe: Pipeline, streams: int = 64, lost_after_s: float = LOST_AFTER_S, named: str = ""
) -> FaultResult:
    """SIGKILL the worker carrying most of `streams` answers: the scheduler hands what it
    held to the other worker, which continues each answer where it stopped. The pipeline
    loses a worker after `lost_after_s` of silence (`named`: how the scenario says so)."""
    before = await tokens_billed(pipe)
    async with pipe.http("g1") as client:
        running = Streams([client])
        await running.start([80] * streams, "crash")
        ids = await running.streaming()
        victim = await busiest_worker(pipe, ids)
        await asyncio.sleep(0.5)
        pipe.kill(victim)
        watched = await running.results()
    added, used = await billed_once(pipe, before, watched)
    moved = {a.request.request_id for a in await assignments(pipe, ids) if a.request.attempt > 0}
    await pipe.restart(victim)
    await pipe.wait_for_workers(victim)
    return await judge(
        pipe,
        f"SIGKILL one of two workers under {streams} streams{named}",
        watched,
        continued=len(moved),
        tokens_billed=added,
        tokens_used=used,
        stall_bound_ms=round((lost_after_s + 2) * 1000),
    )


async def worker_drain(pipe: Pipeline, streams: int = 16) -> FaultResult:
    """SIGTERM the worker carrying most answers: it takes no new work, lets short answers
    finish within the drain timeout, and hands the long ones to the other worker."""
    async with pipe.http("g1") as client:
        running = Streams([client])
        await running.start([20, 140] * (streams // 2), "drain")
        ids = await running.streaming()
        victim = await busiest_worker(pipe, ids)
        pipe.signal(victim)
        signalled = time.monotonic()
        exit_code = await pipe.exited(victim, timeout_s=DRAIN_S + 20)
        exited_after = time.monotonic() - signalled
        watched = await running.results()
    handed_back = {
        rid
        for h in await pipe.find(
            topics.WORKERS, WorkerHeartbeat, lambda h: h.worker_id == victim and bool(h.handed_back)
        )
        for rid in h.handed_back
    }
    await pipe.restart(victim)
    await pipe.wait_for_workers(victim)
    return await judge(
        pipe,
        f"SIGTERM (drain) one of two workers under {streams} streams",
        watched,
        exit_code=exit_code,
        exited_after_s=round(exited_after, 1),
        handed_back=len(handed_back & ids),
    )


async def gateway_death(pipe: Pipeline, streams: int = 16) -> FaultResult:
    """SIGKILL the gateway relaying `streams` answers: each client resumes on the other
    gateway with Last-Event-ID; the joined text must be the stored answer."""
    async with pipe.http("g1") as first, pipe.http("g2") as second:
        running = Streams([first, second])
        await running.start([100] * streams, "gateway")
        await running.streaming()
        await asyncio.sleep(0.5)
        pipe.kill("g1")
        watched = await running.results()
        stored_equal = 0
        for seen in watched:
            stored = await stored_answer(second, seen)
            stored_equal += stored is not None and stored["content"] == seen.text
    await pipe.restart("g1")
    await pipe.wait_for_gateway("g1")
    return await judge(
        pipe,
        f"SIGKILL the gateway relaying {streams} streams",
        watched,
        resumed=sum(w.connections > 1 for w in watched),
        stored_equal=stored_equal,
    )


async def broker_cut(pipe: Pipeline, streams: int = 16, cut_s: float = 3.0) -> FaultResult:
    """Cut every stage off the broker for `cut_s` while `streams` answers stream (every
    connection closed, new ones refused), as a broker restart or a leader moving away
    looks to its clients, while the broker keeps every record. The stages reconnect
    and every answer finishes, billed once."""
    assert pipe.link is not None, "the pipeline reaches its broker through a link"
    before = await tokens_billed(pipe)
    async with pipe.http("g1") as client:
        running = Streams([client])
        await running.start([100] * streams, "cut")
        await running.streaming()
        await asyncio.sleep(0.5)
        pipe.link.cut()
        await asyncio.sleep(cut_s)
        pipe.link.restore()
        restored = time.monotonic()
        watched = await running.results()
        finished_after = time.monotonic() - restored
    added, used = await billed_once(pipe, before, watched)
    exited = [name for name, stage in pipe.stages.items() if not stage.running]
    return await judge(
        pipe,
        f"every stage cut off the broker for {cut_s:g} s under {streams} streams",
        watched,
        last_finished_after_s=round(finished_after, 1),
        tokens_billed=added,
        tokens_used=used,
        stages_exited=len(exited),
    )


async def scheduler_restart(
    pipe: Pipeline, running: int = 16, queued: int = 8, down_s: float = 1.0
) -> FaultResult:
    """SIGKILL the scheduler while answers stream and more arrive; start it again after
    `down_s`. Running answers go on; the new ones start once it is back."""
    async with pipe.http("g1") as client:
        streams = Streams([client])
        await streams.start([100] * running, "before")
        await streams.streaming()
        pipe.kill("scheduler")
        killed = time.monotonic()
        late = Streams([client])
        await late.start([20] * queued, "during")
        await asyncio.sleep(max(0.0, down_s - (time.monotonic() - killed)))
        await pipe.restart("scheduler")
        restarted = time.monotonic()
        watched = await streams.results() + await late.results()
    first_after_restart = max(seen.deltas[0][2] for seen in late.watched) - restarted
    ids = {seen.request_id for seen in watched}
    runs = Counter((a.request.request_id, a.request.attempt) for a in await assignments(pipe, ids))
    return await judge(
        pipe,
        f"SIGKILL the scheduler under {running} streams, {queued} more "
        f"arriving, back after {down_s:g} s",
        watched,
        queued_started_within_s=round(first_after_restart, 2),
        dispatched_twice=sum(n > 1 for n in runs.values()),
    )


async def stored_answer(client: httpx.AsyncClient, seen: Watched) -> dict[str, Any] | None:
    """The answer as `GET /v1/conversations/{id}` shows it now."""
    detail = (await client.get(f"/v1/conversations/{seen.conversation_id}")).json()
    return next((m for m in detail["messages"] if m["message_id"] == seen.ids["message_id"]), None)


async def stored_once_ended(
    client: httpx.AsyncClient, seen: Watched, timeout_s: float = 10.0
) -> dict[str, Any] | None:
    """The stored answer once it is no longer in progress (the recorder stores an answer
    no gateway relayed to its end a moment after that end)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stored = await stored_answer(client, seen)
        if stored is None or stored["status"] != "in_progress" or time.monotonic() > deadline:
            return stored
        await asyncio.sleep(0.2)


async def usage_of(pipe: Pipeline, request_id: str, timeout_s: float = 20.0) -> UsageEvent:
    """The last usage event of the request's attempts."""
    [usage] = await pipe.find(
        topics.USAGE, UsageEvent, lambda u: u.request_id == request_id, timeout_s=timeout_s
    )
    return usage


async def cancels_of(pipe: Pipeline, request_id: str) -> list[Cancel]:
    records = await read_to_end(pipe.kafka.bootstrap_servers, topics.CONTROL, CONTROL_EVENT)
    return [e for _, _, e in records if isinstance(e, Cancel) and e.request_id == request_id]


async def delivery_topics_of(pipe: Pipeline, gateway_id: str) -> list[str]:
    """The delivery topics the gateway `gateway_id` heartbeated for, one per start, first
    first."""
    records = await read_to_end(pipe.kafka.bootstrap_servers, topics.CONTROL, CONTROL_EVENT)
    heard = (e.reply_to for _, _, e in records if isinstance(e, GatewayHeartbeat))
    return list(dict.fromkeys(t for t in heard if topics.delivering_gateway(t) == gateway_id))

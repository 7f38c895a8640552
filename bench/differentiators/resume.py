"""Resume across gateway deaths: a client streaming an answer from a gateway that is
SIGKILLed reconnects to another gateway with `Last-Event-ID` and gets the rest of the
answer, byte for byte.

    .venv/bin/python -m bench.differentiators.resume --kills 100

Each round streams a few answers from the gateway about to die (`fault_scenarios`'
pipeline of processes, sim engine), SIGKILLs it mid-answer, and lets every client resume
on the next gateway. Three gateways take turns dying; the dead one restarts in the
background while the others carry the next rounds. An answer counts as byte-exact when
it resumed, ended, and its joined text is both the stored answer and the text an
uninterrupted run streams (the sim engine's plan). The gap is what the user
waited across the death: from the last event the dying gateway delivered to the first
event after resuming (the client, `bench/watched_streams.py`, waits 0.2 s before it
reconnects).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.fault_scenarios import GATEWAYS, Streams, requests_of, stored_once_ended, stream_pipeline
from bench.metrics import percentile
from bench.process_pipeline import Pipeline
from bench.watched_streams import Watched
from workers.sim_engine import plan_reply

STREAMS_PER_KILL = 4
ANSWER_TOKENS = 60
"""3 s at the pipeline's 20 tokens/s: every answer is still streaming at the kill."""
KILL_DELAYS_S = (0.2, 0.5, 0.8, 1.1, 1.4)
"""How long after every answer's first piece the gateway dies, in turn, so that the
kill falls at different points of the answers."""
SPARE = "g3"
ROTATION = (*GATEWAYS, SPARE)
"""The gateways die in this order, each answer resuming on the next one: a third gateway
beside the pipeline's two gives the one that died two rounds to start again (a gateway
takes a few seconds), so the rounds need not wait for it."""
TABLE_HEAD = ("| figure | value | target | met |", "|---|---|---|---|")


@dataclass(frozen=True)
class ResumeStats:
    """What the users of killed gateways saw, over `kills` gateway deaths."""

    kills: int
    streams: int
    byte_exact: int
    gap_ms_p50: float | None
    gap_ms_p99: float | None
    mismatches: tuple[str, ...] = ()
    """One line per answer that was not byte-exact: where and how it differed."""
    not_cut: tuple[str, ...] = ()
    """One line per answer that ended before its gateway died (not counted above)."""

    def lines(self) -> list[str]:
        """Rows of a `figure | value | target | met` table (`TABLE_HEAD` heads it)."""
        share = 100 * self.byte_exact / self.streams if self.streams else 0.0
        exact = self.streams > 0 and self.byte_exact == self.streams
        return [
            f"| streams resumed byte-exact after their gateway's SIGKILL | "
            f"{self.byte_exact} / {self.streams} ({share:.0f} %) | 100 % | "
            f"{'yes' if exact else 'no'} |",
            f"| gateway kills mid-stream | {self.kills} | | |",
            f"| answers that ended before their gateway died (not counted) | "
            f"{len(self.not_cut)} | | |",
            f"| resume gap, last event before the kill to first after "
            f"(the client waits 0.2 s before reconnecting), p50 / p99 | "
            f"{_ms(self.gap_ms_p50)} / {_ms(self.gap_ms_p99)} ms | | |",
        ]


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


@dataclass(frozen=True)
class Outcome:
    """One answer of one round."""

    byte_exact: bool
    gap_s: float | None
    mismatch: str | None = None
    cut: bool = True
    """Its gateway died while it streamed; False: it had ended before (`mismatch` says
    when its first piece came)."""


def resume_gap_s(event_times: Sequence[float], resumed_at: float | None) -> float | None:
    """From the last event that arrived before the client's first request to resume
    (`resumed_at`) to the first that arrived after it; None when the answer never
    resumed or either side has no event. A client reads one connection at a time, so
    every event before that request came from the dead gateway."""
    if resumed_at is None:
        return None
    before = [t for t in event_times if t < resumed_at]
    after = [t for t in event_times if t >= resumed_at]
    if not before or not after:
        return None
    return min(after) - max(before)


def first_difference(expected: str, got: str) -> str | None:
    """Where `got` departs from `expected` (None when they are equal), with a little
    of each around that byte."""
    if expected == got:
        return None
    a, b = expected.encode(), got.encode()
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    return (
        f"byte {at} of {len(a)} expected / {len(b)} got: "
        f"expected {a[max(0, at - 20) : at + 20]!r}, got {b[max(0, at - 20) : at + 20]!r}"
    )


def judged(
    seen: Watched,
    resumed_at: float | None,
    stored: str | None,
    planned: str,
    killed_at: float | None = None,
) -> Outcome:
    """One answer against its stored text and the text an uninterrupted run streams;
    one that ended on its first connection before `killed_at` was never cut."""
    times = [at for _, _, at in seen.deltas]
    if seen.ended_at is not None:
        times.append(seen.ended_at)
    gap = resume_gap_s(times, resumed_at)
    rid = seen.ids.get("request_id", "?")
    ended = seen.ended_at
    if seen.connections < 2 and killed_at is not None and ended is not None and ended < killed_at:
        first = f"{times[0] - seen.started_at:.1f} s" if times else "never"
        return Outcome(
            False,
            None,
            f"{rid}: ended ({seen.end_event}) {killed_at - ended:.1f} s before its gateway "
            f"died; its first piece came after {first}",
            cut=False,
        )
    if resumed_at is None or seen.connections < 2:
        return Outcome(False, gap, f"{rid}: never resumed ({seen.connections} connection)")
    if not seen.finished:
        return Outcome(False, gap, f"{rid}: did not finish ({seen.end_event}: {seen.end})")
    for name, text in (("stored answer", stored), ("planned answer", planned)):
        if text is None:
            return Outcome(False, gap, f"{rid}: no {name}")
        differs = first_difference(text, seen.text)
        if differs is not None:
            boundary = sum(len(t.encode()) for _, t, at in seen.deltas if at < resumed_at)
            return Outcome(
                False, gap, f"{rid}: vs the {name}, {differs} (resumed at byte {boundary})"
            )
    return Outcome(True, gap)


def summary(kills: int, outcomes: Sequence[Outcome]) -> ResumeStats:
    """Over the answers their gateway's death cut; those that had ended are listed."""
    cut = [o for o in outcomes if o.cut]
    gaps_ms = [o.gap_s * 1000 for o in cut if o.gap_s is not None]
    return ResumeStats(
        kills=kills,
        streams=len(cut),
        byte_exact=sum(o.byte_exact for o in cut),
        gap_ms_p50=percentile(gaps_ms, 50) if gaps_ms else None,
        gap_ms_p99=percentile(gaps_ms, 99) if gaps_ms else None,
        mismatches=tuple(o.mismatch for o in cut if o.mismatch is not None),
        not_cut=tuple(o.mismatch or "" for o in outcomes if not o.cut),
    )


class ResumeRequests:
    """When each answer's client first asked to resume (an httpx request hook)."""

    def __init__(self) -> None:
        self.first_at: dict[str, float] = {}

    async def __call__(self, request: httpx.Request) -> None:
        parts = request.url.path.strip("/").split("/")
        if request.method == "GET" and parts[:2] == ["v1", "requests"] and parts[-1] == "events":
            self.first_at.setdefault(parts[2], time.monotonic())


async def kill_round(
    pipe: Pipeline, victim: str, survivor: str, delay_s: float
) -> tuple[list[Outcome], asyncio.Task[None]]:
    """Stream answers from `victim`, SIGKILL it `delay_s` into them and start it again
    (the task returned), and judge the answers its clients finished on `survivor`."""
    resumes = ResumeRequests()
    async with pipe.http(victim) as dying, pipe.http(survivor) as other:
        for client in (dying, other):
            client.event_hooks = {"request": [resumes], "response": []}
        running = Streams([dying, other])
        await running.start([ANSWER_TOKENS] * STREAMS_PER_KILL, f"resume via {survivor}")
        await running.streaming()
        await asyncio.sleep(delay_s)
        pipe.kill(victim)
        killed_at = time.monotonic()
        restarting = asyncio.create_task(back_up(pipe, victim))
        watched = await running.results()
        requests = await requests_of(pipe, watched)
        outcomes = []
        for seen in watched:
            stored = await stored_once_ended(other, seen) if seen.ids else None
            request = requests.get(seen.ids.get("request_id", ""))
            planned = "" if request is None else "".join(plan_reply(request).tokens)
            resumed_at = resumes.first_at.get(seen.request_id)
            content = None if stored is None else stored["content"]
            outcomes.append(judged(seen, resumed_at, content, planned, killed_at))
        return outcomes, restarting


async def back_up(pipe: Pipeline, name: str) -> None:
    await pipe.restart(name)
    await pipe.wait_for_gateway(name)


async def measure(kills: int = 100) -> ResumeStats:
    """`kills` rounds on a pipeline of its own (in a temporary directory), the gateways
    dying in turn."""
    outcomes: list[Outcome] = []
    restarting: dict[str, asyncio.Task[None]] = {}
    with tempfile.TemporaryDirectory(prefix="resume-") as tmp:
        async with stream_pipeline(Path(tmp)) as pipe:
            await pipe.start(SPARE, "gateway")
            await pipe.wait_for_gateway(SPARE)
            try:
                for round_ in range(kills):
                    victim, survivor = ROTATION[round_ % 3], ROTATION[(round_ + 1) % 3]
                    for name in (victim, survivor):
                        if name in restarting:
                            await restarting.pop(name)
                    delay = KILL_DELAYS_S[round_ % len(KILL_DELAYS_S)]
                    judged_now, restarting[victim] = await kill_round(pipe, victim, survivor, delay)
                    outcomes += judged_now
                await asyncio.gather(*restarting.values())
            finally:
                for task in restarting.values():
                    task.cancel()
                await asyncio.gather(*restarting.values(), return_exceptions=True)
    return summary(kills, outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100)
    args = parser.parse_args()
    started = time.monotonic()
    stats = asyncio.run(measure(args.kills))
    print("\n".join([*TABLE_HEAD, *stats.lines()]))
    for line in stats.mismatches:
        print(f"not byte-exact: {line}")
    for line in stats.not_cut:
        print(f"not cut: {line}")
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()

"""`python -m bench scheduler_sim`: the scheduler at scale.

    python -m bench scheduler_sim --workers 1000            # ~1.5 min
    python -m bench scheduler_sim --workers 1000 --shards 2 --kafka-seconds 0
    python -m bench scheduler_sim --workers 1000 --no-gc-freeze   # as in `chatpipe up`
    python -m bench scheduler_sim --workers 20 --waiting 200 --rate 300 --seconds 0.5 \
        --kafka-seconds 0

The real scheduler core (`scheduler/core.py`) with simulated workers: heterogeneous
slot counts (64/128/256, like vLLM's max_num_seqs), two models, heartbeats on every
end (coalesced per step) and every second, answers of varied length, cancels, worker
restarts, preemptions handed back at the worker's next heartbeat; requests from three
tiers and skewed users (a few heavy ones), prompts of varied length (short ones routed
to the small model), the waiting set held at `--waiting`, slots freeing at `--rate` a
second. The core gets the simulation's clock, which advances each step by the core's
own time in it (`CoreSim`):

- a *decision* is a request handed to a worker slot; decisions/s is decisions per
  second of that clock; capacity is decisions per second of core time (admissions,
  cancels, heartbeats and each decision cycle: what the stage's `_decide` asks the
  core after a batch);
- a decision's latency is the core time of the step that made it, p99 over every
  decision. Core time is the process's CPU time (`CORE_CLOCK`): on a shared machine
  other processes' time is not the scheduler's.

With `--shards N` the workers, the waiting set and the offered rate are split N ways
(scheduler shards by model, `scheduler/shards.py`): each shard is its own process, as a
deployment runs them, so each can use a core; their measured windows run together.

Then (unless `--kafka-seconds 0`) a smaller run through the scheduler's Kafka stage
on the embedded broker (`bench/scheduler_kafka.py`; with `--shards`, one scheduler
process per shard), its own line. The last line is `decisions/s=N p99_ms=M` of the core
run (with `--shards`, their sum and the worst shard's p99).
"""

from __future__ import annotations

import argparse
import functools
import gc
import heapq
import multiprocessing
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from scheduler.config import ALONE_GC_FREEZE_S
from scheduler.core import Dispatch, Policy, Preemption, Scheduler
from scheduler.shards import HeapFreezer
from schemas.events import ChatMessage, GenerationRequest, Role, SamplingOptions, WorkerHeartbeat
from schemas.topics import Tier

BIG, SMALL = "big", "small"
T = TypeVar("T")

TIER_MIX = ((Tier.ENTERPRISE, 0.1), (Tier.PRO, 0.3), (Tier.FREE, 0.6))
SLOT_CHOICES = (64, 128, 256)
ANSWER_TOKENS = (5.5, 0.9)
"""Answer length: lognormal (mu, sigma) tokens, capped at 4,000."""
MEAN_ANSWER_TOKENS = 367.0
"""Its mean, for the decode speed that frees slots at the offered rate."""
HEARTBEAT_S = 1.0
CANCEL_WAITING = 0.02
CANCEL_RUNNING = 0.01
RESTART_EVERY_S = 2.0
"""A worker process restarts this often (virtual seconds): what it ran goes out again."""
DEADLINE_S = {Tier.FREE: 120.0}
CORE_CALLS = (
    "on_heartbeat",
    "queue_updates",
    "schedule",
    "unread_assignments",
    "add_request",
    "on_dispatched",
    "cancel",
    "status",
    "live_workers",
    "preemptions",
    "remove_lost_workers",
    "expire",
)
"""The core's calls that `--breakdown` times one by one."""
CORE_CLOCK = time.process_time
"""The core's time: this process's CPU time, garbage collections included, so that
other processes on a shared machine (or the other shards, on fewer cores than shards)
do not count as the scheduler's."""


def policy() -> Policy:
    """A production-like policy: minimum shares, routing, a fallback; no shedding bound
    (the run holds the waiting set at its size on purpose)."""
    return Policy(
        min_share={Tier.PRO: 0.2, Tier.FREE: 0.1},
        affinity_max_load=0.9,
        fallback_models={BIG: SMALL},
        small_model=SMALL,
        simple_request_max_chars=40,
        queue_update_interval_s=1.0,
        worker_lost_after_s=5.0,
    )


@dataclass
class Arrivals:
    """The request mix: tiers, skewed users (Zipf-like), prompt and answer lengths."""

    rng: random.Random
    users: int = 20_000
    orgs: int = 2_000
    serial: int = 0

    def next(self, now: float, wall: float) -> GenerationRequest:
        self.serial += 1
        tier = self.rng.choices([t for t, _ in TIER_MIX], [w for _, w in TIER_MIX])[0]
        user = int(self.users * self.rng.paretovariate(1.2)) % self.users  # heavy head
        prompt = _prompt(min(8000, int(self.rng.lognormvariate(4.5, 1.2))))
        answer = max(1, min(4000, int(self.rng.lognormvariate(*ANSWER_TOKENS))))
        deadline = DEADLINE_S.get(tier)
        rid = f"r{self.serial}"
        return GenerationRequest.model_construct(
            request_id=rid,
            attempt=0,
            conversation_id=f"c{user}-{self.serial % 7}",
            message_id=f"m{self.serial}",
            parent_id=None,
            user_id=f"u{user}",
            org_id=f"o{user % self.orgs}",
            tier=tier,
            model=BIG,
            messages=prompt,
            sampling=_sampling(answer),
            reply_to="chat.deliver.gw",
            deadline=None if deadline is None else wall + deadline,
            cache_salt=None,
            store=True,
            requested_model=None,
            stream=None,
            created_at=wall,
        )


@functools.cache
def _prompt(chars: int) -> tuple[ChatMessage, ...]:
    return (ChatMessage(role=Role.USER, content="x" * chars),)


@functools.cache
def _sampling(max_tokens: int) -> SamplingOptions:
    return SamplingOptions(max_tokens=max_tokens)


@dataclass
class SimWorker:
    worker_id: str
    model: str
    slots: int
    partition: int
    incarnation: str = "i0"
    next_offset: int = 0
    consumed: int = 0
    running: dict[str, tuple[int, int]] = field(default_factory=dict)  # rid -> (p, offset)
    unread: list[tuple[int, str, float]] = field(default_factory=list)
    """Dispatched, not read yet: (offset, request id, service seconds)."""
    handed_back: dict[str, int] = field(default_factory=dict)
    """Preempted since the last heartbeat: request id -> its attempt."""

    def heartbeat(self, wall: float) -> WorkerHeartbeat:
        return WorkerHeartbeat.model_construct(
            worker_id=self.worker_id,
            incarnation=self.incarnation,
            model=self.model,
            partitions=(self.partition,),
            max_slots=self.slots,
            active=tuple(self.running),
            consumed={self.partition: self.consumed},
            assignments=dict(self.running),
            handed_back=tuple(self.handed_back),
            handed_back_attempts=dict(self.handed_back),
            running=len(self.running),
            waiting=0,
            peak_running=0,
            free_kv_blocks=None,
            stopping=False,
            sent_at=wall,
        )


@dataclass
class Timings:
    """Real seconds spent in the core, and each decision's latency."""

    core_s: float = 0.0
    virtual_s: float = 0.0
    decisions: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    heartbeats: int = 0
    admitted: int = 0
    preempted: int = 0
    waiting_seen: list[int] = field(default_factory=list)
    by_call: dict[str, float] = field(default_factory=dict)
    """With `--breakdown`: core seconds in each of CORE_CALLS."""

    def timed(self, call: Callable[[], T]) -> T:
        started = CORE_CLOCK()
        result = call()
        self.core_s += CORE_CLOCK() - started
        return result

    def p99_ms(self) -> float:
        return _p99(self.latencies_ms)

    def rate(self) -> float:
        """Decisions per second carried: per second of the simulated clock, which runs
        at least as fast as the core's own time."""
        return self.decisions / self.virtual_s if self.virtual_s else 0.0

    def capacity(self) -> float:
        """Decisions per second of core time: what the core carries when always busy."""
        return self.decisions / self.core_s if self.core_s else 0.0


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class CoreSim:
    """One scheduler core and its workers on a simulated clock that advances, each
    step, by the core's own time in that step (at least `tick_s`): the scheduler
    process does nothing else, so a slow step delays what comes next, as it would.

    Each step is one batch of records, as the stage reads them: the workers read what
    was dispatched to them, answers end, requests arrive (the waiting set is held at
    `waiting`), cancels, heartbeats; then the decision cycle. A decision's latency is
    the core time of its whole step: the first record of the batch waited that long.
    `rate` (decisions/s offered) sets how fast slots free: the slots' decode speed."""

    def __init__(
        self,
        workers: int,
        waiting: int,
        rate: float = 5000.0,
        seed: int = 15,
        tick_s: float = 0.002,
        gc_freeze: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        self.now = 1000.0
        self.tick_s = tick_s
        self.target_waiting = waiting
        self.core = Scheduler(policy(), clock=lambda: self.now, wall=lambda: self.now)
        self.arrivals = Arrivals(self.rng)
        self.workers = {}
        for i in range(workers):
            model = SMALL if i % 3 == 0 else BIG  # more room than simple requests need
            worker = SimWorker(f"w{i}", model, self.rng.choice(SLOT_CHOICES), i)
            self.workers[worker.worker_id] = worker
        slots = sum(w.slots for w in self.workers.values())
        self.tokens_per_s = MEAN_ANSWER_TOKENS * rate / slots
        self.ends: list[tuple[float, str, str]] = []  # (simulated end, worker, rid)
        self.cancels: list[tuple[float, str]] = []
        self.dirty: set[str] = set()
        self.beats = [(self.now + HEARTBEAT_S * i / workers, w) for i, w in enumerate(self.workers)]
        self.next_restart = self.now + RESTART_EVERY_S
        self.timings = Timings()
        self.filling = False
        self.heap = HeapFreezer(ALONE_GC_FREEZE_S if gc_freeze else 0.0, lambda: self.now)

    def run(
        self, seconds: float, warmup_s: float = 3.0, warm: Callable[[], object] = lambda: None
    ) -> Timings:
        """Warm up (fill every slot, `warmup_s` simulated), call `warm` (other shards
        wait there for each other), then measure for `seconds` of wall time."""
        for worker in self.workers.values():
            self.core.on_heartbeat(worker.heartbeat(self.now))
        self.filling = True  # every slot, as if running for a while already
        while self.step() >= self.target_waiting // 2:
            pass
        self.filling = False
        warm_until = self.now + warmup_s
        while self.now < warm_until:
            self.step()
        warm()
        self.timings = Timings()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            self.step()
        return self.timings

    def step(self) -> int:
        """One batch; returns the decisions made."""
        t = self.timings
        core_before = t.core_s
        self._workers_read()
        self._ends()
        self._restarts()
        for _ in range(max(0, self.target_waiting - self.core.waiting_count)):
            request = self.arrivals.next(self.now, self.now)
            t.timed(functools.partial(self.core.add_request, request))
            t.admitted += 1
            if self.rng.random() < CANCEL_WAITING:
                heapq.heappush(
                    self.cancels, (self.now + self.rng.uniform(0.5, 5.0), request.request_id)
                )
        while self.cancels and self.cancels[0][0] <= self.now:
            _, rid = heapq.heappop(self.cancels)
            t.timed(functools.partial(self.core.cancel, rid))
        while self.beats[0][0] <= self.now:
            at, worker_id = heapq.heappop(self.beats)
            heapq.heappush(self.beats, (at + HEARTBEAT_S, worker_id))
            self.dirty.add(worker_id)
        for worker_id in sorted(self.dirty):
            worker = self.workers[worker_id]
            heartbeat = worker.heartbeat(self.now)
            worker.handed_back.clear()  # told once
            t.timed(functools.partial(self.core.on_heartbeat, heartbeat))
        t.heartbeats += len(self.dirty)
        self.dirty.clear()
        t.waiting_seen.append(self.core.waiting_count)
        sent, preempted = t.timed(self._decide)
        step_s = t.core_s - core_before
        self._preempted(preempted)
        t.decisions += len(sent)
        t.latencies_ms.extend([step_s * 1000] * len(sent))
        self.heap.tick()  # as the stage does after each batch
        advance = max(self.tick_s, step_s)
        t.virtual_s += advance
        self.now += advance
        for dispatch, offset in sent:
            service = dispatch.request.sampling.max_tokens / self.tokens_per_s
            if self.filling:  # as if running for a while: what is left of a running answer
                mu, sigma = ANSWER_TOKENS
                service = (
                    self.rng.random()
                    * self.rng.lognormvariate(mu + sigma**2, sigma)
                    / self.tokens_per_s
                )
            elif self.rng.random() < CANCEL_RUNNING:
                service *= self.rng.random()  # cancelled while running: it ends early
            self.workers[dispatch.worker_id].unread.append(
                (offset, dispatch.request.request_id, service)
            )
        return len(sent)

    def time_each_call(self) -> None:
        """Count the core time of each of CORE_CALLS in `timings.by_call`."""
        for name in CORE_CALLS:
            setattr(
                self.core, name, functools.partial(self._timed_call, name, getattr(self.core, name))
            )

    def _timed_call(self, name: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        started = CORE_CLOCK()
        try:
            return call(*args, **kwargs)
        finally:
            by_call = self.timings.by_call
            by_call[name] = by_call.get(name, 0.0) + CORE_CLOCK() - started

    def _decide(self) -> tuple[list[tuple[Dispatch, int]], list[Preemption]]:
        """What `SchedulerStage._decide` asks the core after each batch of records, and
        its journal commit after them: each dispatch with its offset on its worker's
        `chat.work` partition, and the preemptions asked."""
        core = self.core
        core.remove_lost_workers()
        core.expire()
        sent = []
        for dispatch in core.schedule():
            worker = self.workers[dispatch.worker_id]
            core.on_dispatched(dispatch.request, dispatch.worker_id, worker.next_offset)
            sent.append((dispatch, worker.next_offset))
            worker.next_offset += 1
        preempted = core.preemptions()
        core.queue_updates()
        core.status()
        core.live_workers()
        core.unread_assignments()  # the journal's commit after the batch (_commit_journal)
        return sent, preempted

    def _preempted(self, preemptions: list[Preemption]) -> None:
        """Each worker asked stops the request and hands it back in its next heartbeat."""
        for preemption in preemptions:
            worker = self.workers[preemption.worker_id]
            request = preemption.request
            if worker.running.pop(request.request_id, None) is not None:
                worker.handed_back[request.request_id] = request.attempt
                self.dirty.add(worker.worker_id)
                self.timings.preempted += 1

    def _workers_read(self) -> None:
        """Each worker reads what was dispatched to it last tick and starts it."""
        for worker in self.workers.values():
            if not worker.unread:
                continue
            for offset, rid, service in worker.unread:
                worker.running[rid] = (worker.partition, offset)
                heapq.heappush(self.ends, (self.now + service, worker.worker_id, rid))
            worker.consumed = worker.unread[-1][0] + 1
            worker.unread.clear()

    def _ends(self) -> None:
        while self.ends and self.ends[0][0] <= self.now:
            _, worker_id, rid = heapq.heappop(self.ends)
            worker = self.workers[worker_id]
            if worker.running.pop(rid, None) is not None:
                self.dirty.add(worker_id)

    def _restarts(self) -> None:
        """Now and then a worker process restarts: what it ran is dispatched again."""
        if self.now < self.next_restart:
            return
        self.next_restart += RESTART_EVERY_S
        worker = self.rng.choice(list(self.workers.values()))
        worker.incarnation = f"i{self.now}"
        worker.running.clear()
        worker.unread.clear()
        self.dirty.add(worker.worker_id)


def report(label: str, timings: Timings) -> str:
    waiting = timings.waiting_seen
    busy = timings.core_s / timings.virtual_s if timings.virtual_s else 0.0
    return (
        f"{label}: {timings.decisions} decisions in {timings.virtual_s:.2f} s "
        f"({timings.rate():,.0f}/s), core busy {busy:.0%} "
        f"(capacity {timings.capacity():,.0f}/s); {timings.heartbeats} heartbeats, "
        f"{timings.admitted} admitted, {timings.preempted} preempted; "
        f"waiting {min(waiting)}-{max(waiting)} "
        f"(mean {statistics.fmean(waiting):,.0f}); decision latency p50 "
        f"{statistics.median(timings.latencies_ms):.2f} ms, p99 {timings.p99_ms():.2f} ms, "
        f"max {max(timings.latencies_ms):.2f} ms{_breakdown(timings)}"
    )


def _breakdown(timings: Timings) -> str:
    if not timings.by_call or not timings.core_s:
        return ""
    ranked = sorted(timings.by_call.items(), key=lambda item: -item[1])
    return "; core time by call: " + ", ".join(
        f"{name} {seconds / timings.core_s:.0%}" for name, seconds in ranked if seconds
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench scheduler_sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument(
        "--waiting", type=int, default=10_000, help="requests held waiting throughout the run"
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="wall seconds of the measured core run"
    )
    parser.add_argument(
        "--kafka-seconds",
        type=float,
        default=20.0,
        help="seconds of the run through the Kafka stage; 0: none",
    )
    parser.add_argument("--kafka-workers", type=int, default=20)
    parser.add_argument(
        "--rate",
        type=float,
        default=5000.0,
        help="decisions/s offered: slots free this fast (above what the "
        "core carries, the run measures its capacity)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="scheduler shards, each with its share of the workers, the "
        "waiting set and the rate, each its own process, measured "
        "together; decisions/s summed",
    )
    parser.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="freeze the heap every simulated second (gc.freeze, HeapFreezer), as a "
        "scheduler process of its own does by default (CHATPIPE_SCHEDULER_GC_FREEZE_S); "
        "--no-gc-freeze: as `chatpipe up`'s scheduler, never",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="time each of the core's calls too: the share of core time "
        "each takes (the timing adds a little to each call)",
    )
    parser.add_argument("--seed", type=int, default=15)
    return parser.parse_args(argv)


def cli(argv: list[str]) -> None:
    args = parse_args(argv)
    shards = max(1, args.shards)
    runs = shard_runs(args, shards)
    for shard, run in enumerate(runs):
        label = f"shard {shard + 1}/{shards} (its own process), " if shards > 1 else ""
        print(
            report(
                f"core, {label}{args.workers // shards} workers, "
                f"{args.rate / shards:,.0f}/s offered",
                run,
            ),
            flush=True,
        )
    rate = sum(run.rate() for run in runs)
    p99_ms = max(run.p99_ms() for run in runs)
    if args.kafka_seconds > 0:
        from bench.scheduler_kafka import kafka_run

        print(
            kafka_run(args.kafka_workers, args.kafka_seconds, args.seed, shards=shards), flush=True
        )
    if shards > 1:
        print(f"{shards} shards together: {rate:,.0f} decisions/s, the worst p99 {p99_ms:.2f} ms")
    print(f"decisions/s={rate:.0f} p99_ms={p99_ms:.2f}")


def _sim(args: argparse.Namespace, shard: int, shards: int) -> CoreSim:
    """Shard `shard` of `shards`: its share of the workers, the waiting set and the rate."""
    sim = CoreSim(
        args.workers // shards,
        args.waiting // shards,
        args.rate / shards,
        seed=args.seed + shard,
        gc_freeze=args.gc_freeze,
    )
    if args.breakdown:
        sim.time_each_call()
    return sim


def shard_runs(args: argparse.Namespace, shards: int) -> list[Timings]:
    """Each shard in its own (spawned) process, set as a stage process is; once all are
    warm, they measure together."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(shards)
    results = context.Queue()
    processes = [
        context.Process(
            target=_shard_process, args=(args, shard, shards, barrier, results), daemon=True
        )
        for shard in range(shards)
    ]
    for process in processes:
        process.start()
    found = dict(results.get(timeout=args.seconds + 600) for _ in processes)
    for process in processes:
        process.join()
    return [found[shard] for shard in range(shards)]


def _shard_process(
    args: argparse.Namespace, shard: int, shards: int, barrier: Any, results: Any
) -> None:
    sim = _stage_process_sim(args, shard, shards)
    results.put((shard, sim.run(args.seconds, warm=barrier.wait)))


def _stage_process_sim(args: argparse.Namespace, shard: int, shards: int) -> CoreSim:
    """The sim in a process whose collector is set as a stage process's once started
    (`chatpipe.wiring`: what start-up loaded frozen, GC_THRESHOLDS)."""
    from chatpipe.wiring import GC_THRESHOLDS

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return _sim(args, shard, shards)

"""The scheduler's decisions: pure, synchronous, no Kafka.

It holds the waiting set and the worker registry, and decides
(docs/decisions.md, *Why a scheduler*):
- strict tier priority, except that a lower tier keeps a minimum share of the
  dispatches while higher tiers are busy (credit per dispatch, so nothing starves);
- fair share inside a tier (`FairQueue`: round robin over orgs, then users), and of
  the running slots: a free slot goes to the waiting tenant holding the fewest of its
  model's, and a tenant kept waiting while another holds more than its share takes a
  slot back by preemption (`scheduler.shares`; the preempted request continues on its
  next attempt);
- capacity-aware dispatch to workers serving the request's model, keeping each
  engine's own queue empty so priority is decided here, globally;
- conversation affinity while the previous worker's load is under a bound;
- routing: simple requests to a small model, a saturated model to its fallback;
- shedding when a tier's expected wait exceeds its bound; deadlines; cancels;
- redispatch, as the next attempt, of what a lost worker held, what a draining
  worker handed back and what a partition move orphaned (the attempt continues the
  stream: `request.stream` keeps where it starts);
- restart: what the journal (`chat.work`, `scheduler/journal.py`) and the workers'
  heartbeats say was handed out is in flight again, and a request decided once is
  never queued again.

Sized for a thousand workers and ten thousand waiting requests (`python -m bench
scheduler_sim`): a decision costs O(log workers), never a scan of the waiting set or
of the workers; only the once-per-interval queue positions walk the whole queue.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from scheduler.estimates import Throughput
from scheduler.fair_queue import FairQueue
from scheduler.journal import CANCELLED, OVERLOADED
from scheduler.workers import DECISION_MEMORY, Decision, InFlight, Registry, WorkerState, remember
from schemas.events import (
    GenerationRequest,
    SchedulerClaim,
    TierStatus,
    Unserved,
    WorkAssignment,
    WorkerHeartbeat,
)
from schemas.tools import RoundsHeld
from schemas.topics import Tier

AFFINITY_MEMORY = 100_000
QUEUE_HEAD = 32
"""Waiting requests told of every change of their position; those behind them are
told once per `queue_update_interval_s`, by a sweep over the queue."""
PICK_AMONG = 8
"""A free slot goes to the first of this many waiting requests of a tier (in fair order,
of the model of its first) whose org, then user, holds the fewest of the model's slots."""
PREEMPT_WAIT_S = 10.0
"""A preemption not answered (its request still running) within this is asked again."""
QUEUE_SWEEP_MIN = 64
"""Requests the sweep walks per call at least; else its share of the queue for the time
since the last call, so that it walks the whole queue in an interval, never in one call."""
_TIERS = tuple(Tier)  # iterating the enum itself is slow
_RANK = {tier: tier.rank for tier in Tier}


@dataclass(frozen=True)
class Policy:
    min_share: dict[Tier, float] = field(default_factory=dict)
    max_wait_s: dict[Tier, float] = field(default_factory=dict)
    affinity_max_load: float = 0.9
    tier_models: dict[Tier, list[str]] = field(default_factory=dict)
    fallback_models: dict[str, str] = field(default_factory=dict)
    small_model: str | None = None
    simple_request_max_chars: int = 0
    queue_update_interval_s: float = 1.0
    worker_lost_after_s: float = 5.0
    gateway_grace_s: float = 0.0
    """A stream whose gateway went silent this long, unresumed, is cancelled; 0: never."""
    fair_preemption: bool = True
    """Preempt a running request of a tenant over its share of a model's slots for a
    tenant kept waiting (`scheduler.shares`)."""

    def allows(self, tier: Tier, model: str) -> bool:
        allowed = self.tier_models.get(tier)
        return allowed is None or model in allowed


@dataclass(frozen=True, slots=True)
class Admission:
    """What becomes of a request read from its topic: it waits (`queued`), it ends at
    once (`end_code`: cancelled before it came, refused as overloaded, or decided
    before a restart: then its `Unserved` record is in the journal already,
    `recorded`), or nothing (a copy of one waiting or handed out)."""

    request: GenerationRequest
    queued: bool = False
    end_code: str | None = None
    recorded: bool = False
    retry_after_s: float | None = None
    routed_reason: str | None = None

    @property
    def accepted(self) -> bool:
        return self.end_code is None


@dataclass(frozen=True, slots=True)
class Dispatch:
    request: GenerationRequest
    worker_id: str
    partition: int
    routed_reason: str | None = None
    incarnation: str = ""


@dataclass(frozen=True, slots=True)
class Preemption:
    """Take `request`'s slot on `worker_id` back (`Preempt` on chat.control): the worker
    hands it back, and its next attempt waits its turn again. `for_request_id` waits
    for that slot."""

    request: GenerationRequest
    worker_id: str
    for_request_id: str


@dataclass(frozen=True, slots=True)
class QueueUpdate:
    request: GenerationRequest
    position: int
    eta_ms: int | None


@dataclass(slots=True)
class _Sweep:
    """A walk over the queue in order, a few hundred requests per call: a request's
    position is where the walk found it less those ahead of it gone since."""

    order: Iterator[GenerationRequest]
    started_at: float
    walked: int = 0
    gone: int = 0


class Scheduler:
    """Waiting set + worker registry. `clock` is monotonic seconds; `wall` is epoch
    (deadlines): the adapter passes its clocks, a test its own."""

    def __init__(
        self, policy: Policy, *, clock: Callable[[], float], wall: Callable[[], float]
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._wall = wall
        self._queues: dict[Tier, FairQueue] = {tier: FairQueue() for tier in _TIERS}
        self._waiting: dict[str, GenerationRequest] = {}
        self._deadlines: list[tuple[float, str]] = []  # heap of first attempts' deadlines
        self._credit: dict[Tier, float] = {tier: 0.0 for tier in _TIERS}
        self._shown: dict[str, tuple[int, float]] = {}  # request id -> (position, when)
        self._sweep: _Sweep | None = None
        self._swept_at = self._updated_at = -math.inf
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self.throughput = Throughput(clock=clock)
        self.registry = Registry()
        self._cancelled_unseen: OrderedDict[str, None] = OrderedDict()
        self._cancelled_answers: OrderedDict[str, None] = OrderedDict()
        """Answers a client cancelled: a later tool round of one ends when it comes."""
        self._waiting_rounds = RoundsHeld()
        self._unknown: dict[str, InFlight] = {}
        self._preempting: dict[str, tuple[str, float, int]] = {}
        """Preempted request id -> (the waiting request id it is for, when asked, the
        order of the flight asked back), oldest first."""
        self._preempted_for: dict[str, str] = {}  # waiting request id -> preempted one
        self._preemptions: list[Preemption] = []
        self._shares = tuple(  # each tier with a minimum share, and the tiers above it
            (lower, share, tuple(t for t in _TIERS if _RANK[t] < _RANK[lower]))
            for lower in _TIERS
            if (share := policy.min_share.get(lower, 0.0))
        )

    # --- requests -------------------------------------------------------------------

    def add_request(self, request: GenerationRequest) -> Admission:
        """Admit (possibly routed to the small model) or shed a new request.

        A copy of a request waiting, handed out or ended already changes nothing
        (one ended before a restart is ended again: its end may not have been sent)."""
        request_id = request.request_id
        decision = self.registry.decided.get(request_id)
        if decision is not None and decision.code is not None:
            return Admission(
                request.model_copy(update={"attempt": decision.attempt}),
                end_code=decision.code,
                recorded=True,
            )
        if request_id in self._waiting or self.registry.knows(request_id):
            return Admission(request)
        if request_id in self._cancelled_unseen:
            del self._cancelled_unseen[request_id]
            return Admission(request, end_code=CANCELLED)
        if request_id != request.answer_id and request.answer_id in self._cancelled_answers:
            return Admission(request, end_code=CANCELLED)
        request, reason = self._route_simple(request)
        bound = self.policy.max_wait_s.get(request.tier)
        wait_s = None if bound is None else self.expected_wait_s(request.tier, extra=1)
        if wait_s is not None and bound is not None and wait_s > bound:
            wait_s = self.expected_wait_s(request.tier, extra=1, by_slots=True)
        if wait_s is not None and bound is not None and wait_s > bound:
            return Admission(
                request, end_code=OVERLOADED, retry_after_s=_retry_after(wait_s - bound)
            )
        self._enqueue(request)
        return Admission(request, queued=True, routed_reason=reason)

    def _enqueue(self, request: GenerationRequest, front: bool = False) -> None:
        self._queues[request.tier].push(request, front=front)
        self._waiting[request.request_id] = request
        self._waiting_rounds.hold(request)
        if request.attempt == 0 and request.deadline is not None:
            heapq.heappush(self._deadlines, (request.deadline, request.request_id))

    def _route_simple(self, request: GenerationRequest) -> tuple[GenerationRequest, str | None]:
        small, limit = self.policy.small_model, self.policy.simple_request_max_chars
        if not small or limit <= 0 or request.model == small:
            return request, None
        if not self.policy.allows(request.tier, small):
            return request, None
        if len(request.last_user_message) > limit:
            return request, None
        return _rerouted(request, small), "simple_request"

    def cancel_answer(self, answer_id: str) -> GenerationRequest | None:
        """A client's cancel, which names the answer: drop its request waiting here (a
        server-tools turn's round), as `cancel` does, and end any later round of it when
        it comes: the round running now may still pause on tool calls, and `chat.tools`
        then queues the next one, which must not reach a worker."""
        remember(self._cancelled_answers, answer_id, None, DECISION_MEMORY)
        return self.cancel(self._waiting_rounds.named(answer_id))

    def cancel(self, request_id: str) -> GenerationRequest | None:
        """Drop a waiting request; returns it, or None if it is not waiting. A cancel
        that comes before its request (after a restart both are read again, from two
        topics) is kept, and the request ends when it comes."""
        waiting = self._waiting.get(request_id)
        if waiting is None:
            if not self.registry.knows(request_id):
                remember(self._cancelled_unseen, request_id, None, DECISION_MEMORY)
            return None
        request = self._queues[waiting.tier].remove(request_id)
        self._forget(request_id)
        return request

    def ended_unserved(self, request: GenerationRequest, code: str) -> None:
        """`request` ended without a worker (its `Unserved` record is being written):
        a copy read later, or after a restart, ends the same way."""
        self.registry.drop(request.request_id)
        self.registry.decide(request.request_id, Decision(request.attempt, code))

    def _forget(self, request_id: str) -> None:
        request = self._waiting.pop(request_id, None)
        if request is not None:
            self._waiting_rounds.release(request)
        self._shown.pop(request_id, None)

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    def waiting(self) -> list[GenerationRequest]:
        """Waiting requests, highest tier first, each tier in fair order."""
        return list(self._in_order())

    def _in_order(self) -> Iterator[GenerationRequest]:
        return itertools.chain.from_iterable(self._queues[tier] for tier in _TIERS)

    def _head(self) -> list[GenerationRequest]:
        """The first QUEUE_HEAD of `_in_order()`, without copying any tier's order."""
        head: list[GenerationRequest] = []
        for tier in _TIERS:
            head += self._queues[tier].first(QUEUE_HEAD - len(head))
            if len(head) == QUEUE_HEAD:
                break
        return head

    def request(self, request_id: str) -> GenerationRequest | None:
        """The request, waiting or running, if known here."""
        flight = self.registry.flight(request_id)
        if flight is not None:
            return flight.request
        return self._waiting.get(request_id)

    def running(self) -> list[GenerationRequest]:
        """Requests handed to workers and not known to have ended (those only a heartbeat
        told of, whose request is not read back yet, are left out)."""
        return [
            flight.request
            for worker in self.registry.workers.values()
            for flight in worker.in_flight.values()
            if flight.request is not None
        ]

    def expire(self) -> list[GenerationRequest]:
        """Drop and return waiting requests whose deadline has passed. A continuation
        (attempt > 0) is exempt: its answer has started, the deadline was for the wait."""
        now = self._wall()
        expired = []
        while self._deadlines and self._deadlines[0][0] < now:
            _, request_id = heapq.heappop(self._deadlines)
            request = self._waiting.get(request_id)
            if (
                request is not None
                and request.attempt == 0
                and (cancelled := self.cancel(request_id)) is not None
            ):
                expired.append(cancelled)
        return expired

    # --- estimates ------------------------------------------------------------------

    def expected_wait_s(self, tier: Tier, extra: int = 0, *, by_slots: bool = False
                        ) -> float | None:  # fmt: skip
        """Seconds until the last of `extra` new requests of `tier` would start, at the
        recent rate of ends. `by_slots` (where it decides, as shedding does; from the
        registry's sums over the workers): those the free slots take start at once, and
        the rest wait at most as long as the slots running now take to free at the
        recent service time.

        Zero while a worker has a free slot and nothing waits; None while no throughput
        is known."""
        totals = self.registry.totals
        if not self._waiting and totals.free > 0:
            return 0.0
        ahead = sum(len(self._queues[t]) for t in _TIERS if _RANK[t] <= _RANK[tier])
        if not by_slots:
            return self.throughput.seconds_for(ahead + extra)
        return self.throughput.seconds_for(ahead + extra - totals.free, totals.busy)

    def status(self) -> dict[Tier, TierStatus]:
        statuses = {}
        for tier in _TIERS:
            wait_s = self.expected_wait_s(tier, extra=1, by_slots=True)
            bound = self.policy.max_wait_s.get(tier)
            over_s = wait_s - bound if wait_s is not None and bound is not None else 0.0
            shedding = over_s > 0
            statuses[tier] = TierStatus(
                waiting=len(self._queues[tier]),
                expected_wait_s=wait_s,
                shedding=shedding,
                retry_after_s=_retry_after(over_s) if shedding else None,
            )
        return statuses

    def queue_updates(self) -> list[QueueUpdate]:
        """Position and ETA of waiting requests: of the first QUEUE_HEAD whenever their
        position changed or their last update is older than the update interval; of
        those behind them once per interval (`_Sweep`, a share of the queue per call)."""
        now = self._clock()
        interval = self.policy.queue_update_interval_s
        each_s = self.throughput.seconds_each()
        updates: list[QueueUpdate] = []
        shown_at = self._shown.get
        for position, request in enumerate(self._head()):
            shown = shown_at(request.request_id)
            if shown is None or shown[0] != position or now - shown[1] >= interval:
                updates.append(self._show(request, position, now, each_s))
        if self._sweep is None and now - self._swept_at >= interval:
            self._sweep, self._swept_at = _Sweep(self._in_order(), now), now
        if self._sweep is not None:
            since = now - self._updated_at if self._updated_at > -math.inf else 0.0
            share = min(1.0, since / interval) if interval > 0 else 1.0
            self._sweep_on(
                max(QUEUE_SWEEP_MIN, math.ceil(share * len(self._waiting))), updates, now, each_s
            )
        self._updated_at = now
        return updates

    def _sweep_on(
        self, steps: int, updates: list[QueueUpdate], now: float, each_s: float | None
    ) -> None:
        sweep = self._sweep
        assert sweep is not None
        walked, gone, started_at = sweep.walked, sweep.gone, sweep.started_at
        waiting, shown_at = self._waiting.get, self._shown.get
        for request in itertools.islice(sweep.order, steps):
            position = walked - gone
            walked += 1
            request_id = request.request_id
            if waiting(request_id) is not request:
                gone += 1  # handed out, cancelled or queued again since
                continue
            shown = shown_at(request_id)
            if position >= QUEUE_HEAD and (shown is None or shown[1] < started_at):
                updates.append(self._show(request, position, now, each_s))
        if walked - sweep.walked < steps:
            self._sweep = None
        sweep.walked, sweep.gone = walked, gone

    def _show(
        self, request: GenerationRequest, position: int, now: float, each_s: float | None
    ) -> QueueUpdate:
        self._shown[request.request_id] = (position, now)
        return QueueUpdate(
            request, position + 1, None if each_s is None else int((position + 1) * each_s * 1000)
        )

    # --- workers --------------------------------------------------------------------

    @property
    def workers(self) -> dict[str, WorkerState]:
        return self.registry.workers

    def live_workers(self) -> dict[str, int]:
        """Model -> workers that take its work now: heartbeating (not lost), holding
        chat.work partitions, not draining."""
        return self.registry.totals.live()

    def on_heartbeat(self, heartbeat: WorkerHeartbeat) -> None:
        """Refresh the worker's capacity. What it finished frees its slot; what it
        handed back (draining) or never read (its partition moved) goes out again as
        the next attempt; what it runs unknown here (a restart) is in flight on it."""
        now = self._clock()
        settled = self.registry.on_heartbeat(heartbeat, now, self._waiting)
        for flight in settled.finished:
            self.throughput.finished(now - flight.dispatched_at)
        for flight in settled.orphaned + settled.handed_back + settled.lost:
            self._requeue(flight)

    def on_dispatched(self, request: GenerationRequest, worker_id: str, offset: int) -> None:
        """The assignment of `request` (as sent: with its stream) is on `chat.work`
        at `offset`."""
        self.registry.acknowledged(worker_id, request, offset)

    def remove_lost_workers(self) -> list[str]:
        """Forget workers whose heartbeats stopped and queue what they held again,
        first in line, as the next attempt, which continues the stream."""
        lost = self.registry.remove_lost(self._clock() - self.policy.worker_lost_after_s)
        for worker in lost:
            for flight in worker.in_flight.values():
                self._requeue(flight)
        return [w.worker_id for w in lost]

    def _requeue(self, flight: InFlight) -> None:
        if flight.request is None:
            self._unknown[flight.request_id] = flight
        else:
            self._enqueue(_next_attempt(flight.request), front=True)

    @property
    def unknown(self) -> list[InFlight]:
        """Flights to dispatch again that are known only by where their assignment is on
        `chat.work` (from a heartbeat after a restart): read each back and pass what it
        holds to `resolve_unknown`."""
        return list(self._unknown.values())

    def resolve_unknown(self, request_id: str, request: GenerationRequest | None) -> None:
        """Queue the next attempt of `request`, read back from its assignment, first in
        line; None: the assignment is not there, nothing can be dispatched."""
        if self._unknown.pop(request_id, None) is None or request is None:
            return
        if request_id not in self._waiting and not self.registry.flight(request_id):
            self._enqueue(_next_attempt(request), front=True)

    def unread_assignments(self) -> dict[int, int]:
        """Per `chat.work` partition, the first assignment in flight that its worker has
        not read yet."""
        return self.registry.unread()

    def restore(
        self, partition: int, offset: int, event: WorkAssignment | Unserved | SchedulerClaim
    ) -> None:
        """Replay one journal record after a restart (`Registry.restore`)."""
        self.registry.restore(partition, offset, event, self._clock())

    # --- decisions ------------------------------------------------------------------

    def schedule(self) -> list[Dispatch]:
        """Hand out as many waiting requests as free slots allow; where a tier's model
        has no free slot, ask for one back from a tenant over its share (`preemptions`)."""
        dispatches: list[Dispatch] = []
        blocked: set[Tier] = set()
        while True:
            tier = self._next_tier(blocked)
            if tier is None:
                return dispatches
            candidates = self._fairest(self._queues[tier])
            placed = self._place(candidates[0])  # of one model and tier: all fit, or none
            if placed is None:
                blocked.add(tier)  # its model has no free slot now: keep tier order
                if self.policy.fair_preemption:
                    self._preempt_for(candidates)
                continue
            self._queues[tier].take(placed.request.request_id)
            self._forget(placed.request.request_id)
            self._account(tier)
            dispatches.append(placed)

    def preemptions(self) -> list[Preemption]:
        """The preemptions decided since the last call (each to send once)."""
        preemptions, self._preemptions = self._preemptions, []
        return preemptions

    def _fairest(self, queue: FairQueue) -> list[GenerationRequest]:
        """The first `PICK_AMONG` waiting requests of `queue` for the model of its first,
        those whose org, then user, holds the fewest of the model's slots first (stable:
        of equals, in the queue's order)."""
        head = queue.peek()
        assert head is not None
        model = head.model
        shares = self.registry.shares
        candidates = [r for r in queue.first(PICK_AMONG) if r.model == model]
        return sorted(
            candidates,
            key=lambda r: (shares.slots(model, r.org_id), shares.slots(model, r.org_id, r.user_id)),
        )

    def _preempt_for(self, candidates: list[GenerationRequest]) -> None:
        """One preemption for the first of `candidates` (none of which found a free slot)
        that another tenant holds more than its share against, unless one is asked for
        it already."""
        now = self._clock()
        self._forget_preemptions(now)
        for request in candidates:
            asked = self._preempted_for.get(request.request_id)
            if asked is not None and self._asked_back(asked):
                return  # its slot is on its way
            victim = self.registry.shares.victim(request)
            if victim is None or self._asked_back(victim):
                continue
            flight = self.registry.flight(victim)
            worker = self.registry.holder(victim)
            if flight is None or flight.request is None or worker is None:
                continue
            self._preempting[victim] = (request.request_id, now, flight.order)
            self._preempted_for[request.request_id] = victim
            self._preemptions.append(
                Preemption(flight.request, worker.worker_id, request.request_id)
            )
            return

    def _asked_back(self, victim: str) -> bool:
        """A preemption of `victim` is under way: asked for the flight running now, within
        PREEMPT_WAIT_S (else it is forgotten, and may be asked again)."""
        asked = self._preempting.get(victim)
        if asked is None:
            return False
        flight = self.registry.flight(victim)
        if flight is not None and flight.order == asked[2]:
            return True
        self._forget_preemption(victim)
        return False

    def _forget_preemptions(self, now: float) -> None:
        """Those asked more than PREEMPT_WAIT_S ago: the oldest first, so this costs what
        it forgets (the rest are looked at when they matter, `_asked_back`)."""
        while self._preempting:
            victim, (_, asked_at, _) = next(iter(self._preempting.items()))
            if now - asked_at <= PREEMPT_WAIT_S:
                return
            self._forget_preemption(victim)

    def _forget_preemption(self, victim: str) -> None:
        waiting_id, _, _ = self._preempting.pop(victim)
        if self._preempted_for.get(waiting_id) == victim:
            del self._preempted_for[waiting_id]

    def _next_tier(self, blocked: set[Tier]) -> Tier | None:
        """The lowest tier owed a slot (full credit), else the highest with requests."""
        first = owed = None
        for tier in _TIERS:
            if tier in blocked or not self._queues[tier]:
                continue
            if first is None:
                first = tier
            if self._credit[tier] >= 1.0:
                owed = tier
        return first if owed is None else owed

    def _account(self, tier: Tier) -> None:
        """While a higher tier keeps a lower one waiting, every dispatch earns the lower
        tier its share of a slot; a full credit buys it the next one."""
        credit, queues = self._credit, self._queues
        if credit[tier] >= 1.0:
            credit[tier] -= 1.0
        for lower, share, higher in self._shares:
            if queues[lower] and (lower == tier or any(queues[t] for t in higher)):
                credit[lower] = min(1.0, credit[lower] + share)

    def _place(self, request: GenerationRequest) -> Dispatch | None:
        worker = self._pick_worker(request, request.model)
        reason = None
        fallback = self.policy.fallback_models.get(request.model)
        if worker is None and fallback and self.policy.allows(request.tier, fallback):
            worker = self._pick_worker(request, fallback)
            if worker is not None:
                request, reason = _rerouted(request, fallback), "saturated"
        if worker is None:
            return None
        partition = worker.next_partition()
        self.registry.hand_out(worker, request, partition, self._clock())
        self._remember_affinity(request.conversation_id, worker.worker_id)
        return Dispatch(request, worker.worker_id, partition, reason, worker.incarnation)

    def _pick_worker(self, request: GenerationRequest, model: str) -> WorkerState | None:
        """The conversation's previous worker while its load is under the affinity
        bound, else the worker of `model` with the most free slots."""
        previous = self.registry.workers.get(self._affinity.get(request.conversation_id, ""))
        if (
            previous is not None
            and previous.model == model
            and previous.free_slots > 0
            and previous.load < self.policy.affinity_max_load * previous.max_slots
        ):
            return previous
        return self.registry.most_free(model)

    def _remember_affinity(self, conversation_id: str, worker_id: str) -> None:
        remember(self._affinity, conversation_id, worker_id, AFFINITY_MEMORY)


def _rerouted(request: GenerationRequest, model: str) -> GenerationRequest:
    return request.model_copy(
        update={"model": model, "requested_model": request.requested_model or request.model}
    )


def _next_attempt(request: GenerationRequest) -> GenerationRequest:
    """The same request as its next attempt; `stream` stays: the attempt continues it."""
    return request.model_copy(update={"attempt": request.attempt + 1})


def _retry_after(seconds: float) -> float:
    return float(max(1, math.ceil(seconds)))

"""The scheduler's structures for scale (`python -m bench scheduler_sim`): the index of
free slots, where each request is in flight, the fair queue walked while it changes,
the deadline heap and the queue-position sweep. Each must decide exactly as a scan
over every worker and every waiting request would."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from bench.scheduler_sim import CoreSim
from bench.scheduler_sim import cli as scheduler_sim
from scheduler.core import QUEUE_HEAD
from scheduler.fair_queue import FairQueue
from scheduler.shares import Tally
from scheduler.workers import Registry
from tests.support.scheduler import (
    Clock,
    finish,
    heartbeat,
    ids,
    make_request,
    make_scheduler,
    sent,
)


def test_most_free_is_the_worker_with_most_free_slots_first_known_on_a_tie():
    registry = Registry()
    for worker_id, slots in [("a", 2), ("b", 4), ("c", 4)]:
        registry.on_heartbeat(heartbeat(worker_id, slots=slots), 0.0, ())
    assert registry.most_free("big").worker_id == "b"
    registry.hand_out(registry.workers["b"], make_request("r1"), 0, 0.0)
    assert registry.most_free("big").worker_id == "c", "b has 3 free now"
    assert registry.most_free("other") is None


@pytest.mark.parametrize(
    "change,why",
    [
        ({"stopping": True}, "stopping"),
        ({"model": "other"}, "serves another model now"),
        ({"waiting": 1}, "its engine queues work"),
        ({"slots": 1, "active": ("x",)}, "full"),
    ],
)
def test_most_free_never_returns_a_worker_whose_heartbeat_took_its_room(change, why):
    registry = Registry()
    registry.on_heartbeat(heartbeat("a", slots=8), 0.0, ())
    registry.on_heartbeat(heartbeat("b", slots=2), 0.0, ())
    registry.on_heartbeat(heartbeat("a", **{"slots": 8, **change}), 1.0, ())
    assert registry.most_free("big").worker_id == "b", why


def test_most_free_forgets_a_lost_worker_and_knows_it_again_when_it_returns():
    registry = Registry()
    registry.on_heartbeat(heartbeat("a", slots=8), 0.0, ())
    registry.on_heartbeat(heartbeat("b", slots=2), 5.0, ())
    assert [w.worker_id for w in registry.remove_lost(1.0)] == ["a"]
    assert registry.most_free("big").worker_id == "b"
    registry.on_heartbeat(heartbeat("a", slots=8), 6.0, ())
    assert registry.most_free("big").worker_id == "a"


def test_most_free_stays_right_through_many_changes():
    registry = Registry()
    for i in range(5):
        registry.on_heartbeat(heartbeat(f"w{i}", slots=3 + i), 0.0, ())
    for n in range(200):  # far more changes than workers: stale entries are rebuilt away
        worker = registry.most_free("big")
        if worker is None:
            break
        best = max(w.free_slots for w in registry.workers.values())
        assert worker.free_slots == best > 0
        registry.hand_out(worker, make_request(f"r{n}"), 0, 0.0)
        if n % 3 == 0:
            registry.drop(f"r{n}")
    assert all(w.free_slots == 0 for w in registry.workers.values())


def test_the_registry_knows_where_each_request_is_in_flight():
    core = make_scheduler()
    core.on_heartbeat(heartbeat("w1", slots=1))
    core.on_heartbeat(heartbeat("w2", slots=1))
    core.add_request(make_request("a"))
    core.add_request(make_request("b", user="b"))
    first, second = core.schedule()
    assert core.registry.flight("a").request.request_id == "a"
    finish(core, first.worker_id, [first])
    assert core.registry.flight("a") is None and core.registry.knows("a")
    assert core.registry.flight("b") is not None
    assert core.workers[second.worker_id].load == 1


def test_load_counts_a_request_both_running_and_handed_out_once():
    core = make_scheduler()
    core.on_heartbeat(heartbeat("w1", slots=3))
    core.add_request(make_request("a"))
    [d] = core.schedule()
    sent(core, d, 0)
    core.on_heartbeat(heartbeat("w1", slots=3, active=("a", "other"), consumed={0: 1, 1: 0}))
    assert core.workers["w1"].load == 2 and core.workers["w1"].free_slots == 1


def test_a_tally_s_top_is_the_most_a_scan_finds_through_many_changes():
    """The tenant holding the most of a model's slots, kept as counts change by one: its
    count is what a scan over every tenant finds, and it holds that many."""
    rng = random.Random(3)
    tally, counts = Tally(), Counter[str]()
    for _ in range(5_000):
        name = f"org{rng.randrange(12)}"
        if counts[name] and rng.random() < 0.45:
            tally.take(name)
            counts[name] -= 1
        else:
            tally.give(name)
            counts[name] += 1
        counts += Counter()  # drop the zeros
        assert bool(tally) == bool(counts)
        if counts:
            top, most = tally.top()
            assert most == max(counts.values()) == counts[top]
        assert all(tally.of(n) == counts[n] for n in (name, "never"))


def test_a_fair_queue_walk_yields_the_order_as_it_was_while_the_queue_changes():
    queue = FairQueue()
    for rid, user in [("x1", "x"), ("y1", "y"), ("x2", "x"), ("z1", "z")]:
        queue.push(make_request(rid, user=user))
    walk = iter(queue)
    assert next(walk).request_id == "x1"
    queue.pop()
    queue.push(make_request("w1", user="w"))
    queue.remove("z1")
    assert [r.request_id for r in walk] == ["y1", "x2"], (
        "the org's users were copied when the walk first reached it (no w1); z's queue "
        "when it reached z (z1 was gone by then)"
    )
    assert [r.request_id for r in queue] == ["y1", "x2", "w1"]


def test_expired_requests_come_from_the_deadline_heap_only_while_waiting():
    clock = Clock()
    core = make_scheduler(clock)
    core.on_heartbeat(heartbeat(slots=1))
    core.add_request(make_request("ran", deadline=clock.now + 1))
    core.schedule()
    core.add_request(make_request("cancelled", user="c", deadline=clock.now + 1))
    core.cancel("cancelled")
    core.add_request(make_request("late", user="l", deadline=clock.now + 2))
    clock.now += 1.5
    assert core.expire() == []
    clock.now += 1
    assert [r.request_id for r in core.expire()] == ["late"]
    assert core.waiting_count == 0


def test_requests_behind_the_head_learn_their_position_within_an_interval():
    clock = Clock()
    core = make_scheduler(clock, queue_update_interval_s=1.0)
    count = QUEUE_HEAD + 300
    for i in range(count):
        core.add_request(make_request(f"r{i}", user=f"u{i}"))
    shown: dict[str, int] = {}
    for _ in range(20):  # calls 50 ms apart: the sweep walks a share of the queue each
        for update in core.queue_updates():
            shown[update.request.request_id] = update.position
        clock.now += 0.05
    assert len(shown) == count
    assert all(shown[f"r{i}"] == i + 1 for i in range(count))
    core.on_heartbeat(heartbeat(slots=1))
    assert ids(core.schedule()) == ["r0"]
    moved = {u.request.request_id: u.position for u in core.queue_updates()}
    assert moved == {f"r{i}": i for i in range(1, QUEUE_HEAD + 1)}, (
        "within the interval only the head hears of each change"
    )


def test_unread_assignments_match_a_scan_of_every_flight_through_a_busy_run():
    """`Registry.unread` walks only the flights not started; through dispatches, ends,
    heartbeats and worker restarts it says what a scan of every flight says."""
    sim = CoreSim(workers=12, waiting=300, rate=400.0, tick_s=0.01)
    for worker in sim.workers.values():
        sim.core.on_heartbeat(worker.heartbeat(sim.now))
    checked = 0
    for _ in range(300):
        sim.step()
        scan: dict[int, int] = {}
        for worker in sim.core.workers.values():
            for flight in worker.in_flight.values():
                if flight.offset is not None and not worker.has_read(flight):
                    scan[flight.partition] = min(
                        scan.get(flight.partition, flight.offset), flight.offset
                    )
        assert sim.core.unread_assignments() == scan
        checked += bool(scan)
    assert checked > 50  # assignments not read yet were there to find


def test_slot_totals_match_a_scan_of_every_worker_through_a_busy_run():
    """The sums the status, the wait estimates and the live workers read are kept as
    workers change; through dispatches, ends, heartbeats, preemptions, worker restarts
    and a lost worker they say what a walk over every worker says."""
    sim = CoreSim(workers=12, waiting=300, rate=400.0, tick_s=0.01)
    for worker in sim.workers.values():
        sim.core.on_heartbeat(worker.heartbeat(sim.now))
    core = sim.core
    on_heartbeat = core.on_heartbeat
    silent: set[str] = set()
    core.on_heartbeat = lambda beat: None if beat.worker_id in silent else on_heartbeat(beat)
    for step in range(800):
        sim.step()
        if step == 100:
            silent.add("w3")  # its heartbeats stop: lost after worker_lost_after_s
        workers = core.workers.values()
        totals = core.registry.totals
        assert totals.free == sum(w.free_slots for w in workers)
        assert totals.busy == sum(min(w.load, w.max_slots) for w in workers)
        live: dict[str, int] = {}
        for w in workers:
            if w.partitions and not w.stopping:
                live[w.model] = live.get(w.model, 0) + 1
        assert core.live_workers() == live
    assert "w3" not in core.workers, "the lost worker was removed"


def test_scheduler_sim_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    scheduler_sim(
        [
            "--workers",
            "20",
            "--waiting",
            "200",
            "--rate",
            "300",
            "--seconds",
            "0.2",
            "--kafka-seconds",
            "0",
            "--breakdown",
        ]
    )
    *_, core, last = capsys.readouterr().out.strip().splitlines()
    shares = dict(item.rsplit(" ", 1) for item in core.split("core time by call: ")[1].split(", "))
    assert {"schedule", "on_heartbeat", "add_request"} <= set(shares)
    name_rate, name_p99 = last.split()
    assert name_rate.startswith("decisions/s=") and name_p99.startswith("p99_ms=")
    assert int(name_rate.removeprefix("decisions/s=")) > 0
    assert float(name_p99.removeprefix("p99_ms=")) > 0


def test_scheduler_sim_runs_each_shard_in_its_own_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    scheduler_sim(
        [
            "--workers",
            "20",
            "--waiting",
            "200",
            "--rate",
            "300",
            "--seconds",
            "0.2",
            "--kafka-seconds",
            "0",
            "--shards",
            "2",
            "--gc-freeze",
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    shards = [line for line in lines if "(its own process), 10 workers" in line]
    assert [line.split(",")[1] for line in shards] == [
        " shard 1/2 (its own process)",
        " shard 2/2 (its own process)",
    ]
    assert lines[-2].startswith("2 shards together: ")
    rates = [float(line.split("(")[2].split("/s")[0].replace(",", "")) for line in shards]
    assert int(lines[-1].split()[0].removeprefix("decisions/s=")) == pytest.approx(
        sum(rates), abs=2
    )

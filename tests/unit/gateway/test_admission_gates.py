"""Admission runs its gates in order behind one interface."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

import pytest

from conversations.store import ApiKey
from gateway.admission.gates import Admission, Ask, BusGate, Gate, SheddingGate
from gateway.admission.shedding import SCHEDULER_SILENT_S, Shedding
from gateway.errors import ApiError
from gateway.pipeline import Readiness
from gateway.refusals import Unavailable
from schemas.events import SchedulerStatus
from schemas.topics import Tier

OWNER = ApiKey("alice", "acme", Tier.PRO)


class Recording(Gate):
    """Passes (or refuses with `refuse`), noting each call in `calls`."""

    def __init__(self, name: str, calls: list[str], refuse: int | None = None) -> None:
        self.name, self.calls, self.refuse = name, calls, refuse

    async def check(self, ask: Ask) -> Mapping[str, str]:
        self.calls.append(f"{self.name}.check({ask.tokens})")
        if self.refuse is not None:
            raise ApiError(self.refuse, f"{self.name}_refused", "no", headers={"Retry-After": "7"})
        return {f"x-{self.name}": "ok"}

    async def settle(self, ask: Ask, actual: int) -> None:
        self.calls.append(f"{self.name}.settle({actual - ask.tokens})")

    async def standing(self, owner: ApiKey) -> Mapping[str, str]:
        return {f"x-{self.name}-standing": owner.user_id}


def admission(*gates: Gate) -> Admission:
    return Admission(list(gates), pipeline=SimpleNamespace())  # type: ignore[arg-type]


async def test_gates_run_in_order_and_settle_reaches_each() -> None:
    calls: list[str] = []
    gates = admission(Recording("one", calls), Recording("two", calls))
    ask = await gates.admit(OWNER, 10, "m")
    await gates.settle(ask, 25)
    assert calls == ["one.check(10)", "two.check(10)", "one.settle(15)", "two.settle(15)"]


async def test_a_refusal_stops_the_later_gates_so_they_charge_nothing() -> None:
    calls: list[str] = []
    gates = admission(Recording("budget", calls, refuse=429), Recording("rate", calls))
    with pytest.raises(ApiError) as refused:
        await gates.admit(OWNER, 10, "m")
    assert calls == ["budget.check(10)"]
    # A 429 says where the caller stands with the other gates; its own headers win.
    assert refused.value.headers == {"x-rate-standing": "alice", "Retry-After": "7"}


async def test_only_a_429_carries_the_standing() -> None:
    gates = admission(Recording("down", [], refuse=503), Recording("rate", []))
    with pytest.raises(ApiError) as refused:
        await gates.admit(OWNER, 10, "m")
    assert refused.value.headers == {"Retry-After": "7"}


async def test_shedding_refuses_overloaded_with_its_retry_after() -> None:
    shedding = SheddingGate(SimpleNamespace(overloaded=lambda tier, model: 2.2))
    with pytest.raises(Unavailable) as refused:
        await admission(shedding).admit(OWNER, 10, "m")
    assert (refused.value.code, refused.value.retry_after_s) == ("overloaded", 3)
    open_ = SheddingGate(SimpleNamespace(overloaded=lambda tier, model: None))
    assert await admission(open_).admit(OWNER, 10, "m") == Ask(OWNER, "m", 10)


async def test_an_unreachable_bus_is_refused_at_once_before_any_gate_charges() -> None:
    calls: list[str] = []
    down = BusGate(SimpleNamespace(unreachable=lambda: True))
    with pytest.raises(Unavailable) as refused:
        await admission(down, Recording("rate", calls)).admit(OWNER, 10, "m")
    assert (refused.value.code, refused.value.retry_after_s) == ("pipeline_unavailable", 5)
    assert calls == []
    up = BusGate(SimpleNamespace(unreachable=lambda: False))
    assert await admission(up).admit(OWNER, 10, "m") == Ask(OWNER, "m", 10)


def status(shard: str = "", models: tuple[str, ...] = (), sent_at: float = 1000.0,
           **workers: int) -> SchedulerStatus:  # fmt: skip
    return SchedulerStatus(tiers={}, shard=shard, models=models, workers=workers,
                           sent_at=sent_at)  # fmt: skip


def test_readiness_needs_the_bus_and_a_recent_scheduler_counting_a_worker_for_the_model():
    shedding = Shedding()
    assert (shedding.speaks_for("big", 1000.0), shedding.workers("big", 1000.0)) == (False, 0)
    shedding.update(status(big=2))
    shedding.update(status("small-shard", ("small",), small=0))
    now = 1000.0 + SCHEDULER_SILENT_S - 1

    def readiness(bus: bool = True, at: float = now) -> Readiness:
        models = ("big", "small")
        return Readiness(
            bus, {m: shedding.speaks_for(m, at) for m in models},
            {m: shedding.workers(m, at) for m in models}, model="big",
        )  # fmt: skip

    assert readiness().ready
    assert readiness().body() == {
        "ready": True,
        "bus": True,
        "models": {
            "big": {"scheduler": True, "workers": 2},
            "small": {"scheduler": True, "workers": 0},
        },
    }
    assert not readiness(bus=False).ready
    assert not readiness(at=1000.0 + SCHEDULER_SILENT_S + 1).ready  # the scheduler went quiet
    shedding.update(status(big=0))  # its last worker lost or draining
    assert not readiness().ready

"""Admission runs its gates in order behind one interface."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

import pytest

from conversations.store import ApiKey
from gateway.admission.gates import Admission, Ask, Gate, SheddingGate
from gateway.errors import ApiError
from gateway.refusals import Unavailable
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

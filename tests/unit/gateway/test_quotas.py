"""Quotas: which budget is exhausted, the refusal it makes, and the gate on a ledger."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from billing.core import charges_for, usage_key
from conversations.store import ApiKey
from gateway.admission.gates import Ask
from gateway.admission.quotas import Budget, QuotaGate, budgets_for, exhausted
from gateway.errors import ApiError
from ledger.charges import Account
from ledger.store import MemoryLedger
from schemas.events import UsageEvent
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier

ALICE = ApiKey("alice", "acme", Tier.FREE)
NOW = datetime(2025, 3, 7, 21, 0, tzinfo=UTC).timestamp()  # 3 h before the day ends


def test_budgets_that_are_off_do_not_apply() -> None:
    assert budgets_for(ALICE, None, None) == []
    assert budgets_for(ALICE, 100, None) == [Budget(Account.user("acme", "alice"), 100)]
    assert [b.account for b in budgets_for(ALICE, 100, 1000)] == [
        Account.user("acme", "alice"),
        Account.org("acme"),
    ]


USER, ORG = Budget(Account.user("acme", "alice"), 100), Budget(Account.org("acme"), 1000)


@pytest.mark.parametrize(
    ("case", "used", "spent"),
    [
        ("nothing used", {}, None),
        ("under both", {USER.account: 99, ORG.account: 999}, None),
        ("user budget reached", {USER.account: 100, ORG.account: 100}, USER),
        ("org budget overrun", {USER.account: 0, ORG.account: 1500}, ORG),
        ("both: the user's is named", {USER.account: 200, ORG.account: 2000}, USER),
    ],
)
def test_exhausted(case: str, used: dict[Account, int], spent: Budget | None) -> None:
    assert exhausted([USER, ORG], used) == spent, case


def gate(ledger: MemoryLedger, period: str = "day", **budgets: int | None) -> QuotaGate:
    return QuotaGate(
        ledger,
        user_budget=budgets.get("user"),
        org_budget=budgets.get("org"),
        period=period,
        clock=lambda: NOW,
    )


async def spend(ledger: MemoryLedger, tokens: int, user: str = "alice") -> None:
    event = UsageEvent(
        request_id=f"r-{user}-{tokens}",
        conversation_id="c",
        user_id=user,
        org_id="acme",
        tier=Tier.FREE,
        model="tiny-random",
        worker_id="w",
        status=RequestStatus.FINISHED_STOPPED,
        prompt_tokens=tokens,
        completion_tokens=0,
        cached_tokens=0,
        gpu_ms=1.0,
        created_at=NOW,
    )
    await ledger.record(usage_key(event), charges_for(event))


async def test_a_user_over_budget_is_refused_until_the_period_resets() -> None:
    ledger = MemoryLedger()
    await spend(ledger, 99)
    await gate(ledger, user=100).check(Ask(ALICE, "m", 10))
    await spend(ledger, 5)
    with pytest.raises(ApiError) as refused:
        await gate(ledger, user=100).check(Ask(ALICE, "m", 10))
    error = refused.value
    assert (error.status_code, error.code) == (429, "quota_exceeded")
    assert error.headers == {"Retry-After": str(3 * 3600)}
    assert error.detail == (
        "user token budget exhausted: 104 of 100 tokens used this day"
        " (2025-03-07); it resets at 2025-03-08T00:00:00Z"
    )


async def test_an_org_budget_counts_all_its_users_and_resets_monthly() -> None:
    ledger = MemoryLedger()
    await spend(ledger, 600, user="bob")
    await spend(ledger, 600, user="carol")
    with pytest.raises(ApiError) as refused:
        await gate(ledger, "month", user=1000, org=1000).check(Ask(ALICE, "m", 10))
    assert refused.value.detail.startswith("org token budget exhausted: 1200 of 1000")
    assert "resets at 2025-04-01T00:00:00Z" in refused.value.detail


async def test_no_budgets_no_ledger_read() -> None:
    class Unreadable(MemoryLedger):
        async def used(self, *args: object) -> dict[Account, int]:
            raise AssertionError("read the ledger with no budget set")

    await gate(Unreadable()).check(Ask(ALICE, "m", 10))

"""Billing: periods, the charges of a usage event, and the ledger contract (each
(request_id, attempt) counted once) on the in-memory reference and on SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from billing.core import Account, UsageTotals, charges_for, usage_key
from billing.ledger import MemoryLedger, SQLiteLedger, UsageLedger
from billing.periods import period_of
from schemas.events import UsageEvent
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def usage(request_id: str = "r1", attempt: int = 0, user: str = "alice", org: str = "acme",
          prompt: int = 10, completion: int = 5, cached: int = 4,
          created_at: str = "2025-03-07T12:00:00") -> UsageEvent:
    return UsageEvent(
        request_id=request_id, attempt=attempt, conversation_id="c1", user_id=user,
        org_id=org, tier=Tier.FREE, model="tiny", worker_id="w1",
        status=RequestStatus.FINISHED_STOPPED, prompt_tokens=prompt,
        completion_tokens=completion, cached_tokens=cached, gpu_ms=1.0,
        created_at=at(created_at),
    )


@pytest.mark.parametrize(
    ("moment", "period", "key", "start", "end"),
    [
        ("2025-03-07T12:30:00", "day", "2025-03-07", "2025-03-07T00:00:00", "2025-03-08T00:00:00"),
        ("2025-03-07T00:00:00", "day", "2025-03-07", "2025-03-07T00:00:00", "2025-03-08T00:00:00"),
        ("2025-03-07T23:59:59", "day", "2025-03-07", "2025-03-07T00:00:00", "2025-03-08T00:00:00"),
        ("2024-02-29T08:00:00", "month", "2024-02", "2024-02-01T00:00:00", "2024-03-01T00:00:00"),
        ("2025-12-31T23:00:00", "month", "2025-12", "2025-12-01T00:00:00", "2026-01-01T00:00:00"),
    ],
)
def test_periods_are_utc_days_and_months(moment: str, period: str, key: str, start: str,
                                         end: str) -> None:
    window = period_of(at(moment), period)
    assert window.key == key
    assert (window.start.timestamp(), window.end.timestamp()) == (at(start), at(end))
    assert window.seconds_left(at(moment)) == at(end) - at(moment)


def test_an_event_charges_its_user_and_org_in_its_own_day_and_month() -> None:
    charges = charges_for(usage(created_at="2025-03-31T23:59:00"))
    assert {(c.account, c.period, c.period_key) for c in charges} == {
        (Account.user("alice"), "day", "2025-03-31"),
        (Account.user("alice"), "month", "2025-03"),
        (Account.org("acme"), "day", "2025-03-31"),
        (Account.org("acme"), "month", "2025-03"),
    }
    assert {c.tokens for c in charges} == {15}  # prompt + completion; cached is in the prompt


def test_totals_count_each_attempt_once() -> None:
    totals = UsageTotals()
    first, retry = usage(attempt=0), usage(attempt=1, prompt=20, completion=0)
    assert totals.add(usage_key(first), charges_for(first))
    assert not totals.add(usage_key(first), charges_for(first))
    assert totals.add(usage_key(retry), charges_for(retry))
    assert totals.used(Account.user("alice"), "day", "2025-03-07") == 15 + 20
    assert totals.used(Account.org("acme"), "month", "2025-03") == 35
    assert totals.used(Account.user("bob"), "day", "2025-03-07") == 0


@pytest.fixture(params=["memory", "sqlite"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[UsageLedger]:
    ledger = MemoryLedger() if request.param == "memory" else SQLiteLedger(tmp_path / "db")
    await ledger.open()
    yield ledger
    await ledger.close()


async def record(ledger: UsageLedger, event: UsageEvent) -> bool:
    return await ledger.record(usage_key(event), charges_for(event))


async def test_ledger_sums_per_account_and_period(ledger: UsageLedger) -> None:
    await record(ledger, usage("r1", user="alice"))
    await record(ledger, usage("r2", user="bob"))
    await record(ledger, usage("r3", user="alice", created_at="2025-03-08T01:00:00"))
    alice, bob, acme = Account.user("alice"), Account.user("bob"), Account.org("acme")
    assert await ledger.used([alice, bob, acme], "day", "2025-03-07") == {
        alice: 15, bob: 15, acme: 30}
    assert await ledger.used([alice, acme], "month", "2025-03") == {alice: 30, acme: 45}
    assert await ledger.used([Account.user("carol")], "day", "2025-03-07") == {
        Account.user("carol"): 0}


async def test_ledger_never_counts_a_redelivery_twice(ledger: UsageLedger) -> None:
    event = usage("r1")
    assert await record(ledger, event)
    assert not await record(ledger, event)
    assert await record(ledger, usage("r1", attempt=1))
    assert (await ledger.used([Account.user("alice")], "day", "2025-03-07")
            == {Account.user("alice"): 30})


async def test_what_billing_writes_a_gateway_reads_from_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "chatpipe.db"
    billing, gateway = SQLiteLedger(path), SQLiteLedger(path)
    await billing.open()
    await gateway.open()
    try:
        await record(billing, usage("r1"))
        assert (await gateway.used([Account.org("acme")], "month", "2025-03")
                == {Account.org("acme"): 15})
    finally:
        await billing.close()
        await gateway.close()

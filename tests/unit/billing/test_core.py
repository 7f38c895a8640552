"""Billing: periods, the charges of a usage event, and what only the SQLite ledger does
(an upgraded file). The ledger contract, on every
ledger, is tests/integration/test_ledger_conformance.py."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from billing.core import charges_for, usage_key
from ledger.charges import Account, Tokens, settle
from ledger.periods import period_of
from ledger.store import SQLiteLedger, UsageLedger
from schemas.events import UsageEvent
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def usage(
    request_id: str = "r1",
    attempt: int = 0,
    user: str = "alice",
    org: str = "acme",
    prompt: int = 10,
    completion: int = 5,
    cached: int = 4,
    prior: int = 0,
    created_at: str = "2025-03-07T12:00:00",
) -> UsageEvent:
    return UsageEvent(
        request_id=request_id,
        attempt=attempt,
        conversation_id="c1",
        user_id=user,
        org_id=org,
        tier=Tier.FREE,
        model="tiny-random",
        worker_id="w1",
        status=RequestStatus.FINISHED_STOPPED,
        prompt_tokens=prompt,
        completion_tokens=completion,
        prior_completion_tokens=prior,
        cached_tokens=cached,
        gpu_ms=1.0,
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
def test_periods_are_utc_days_and_months(
    moment: str, period: str, key: str, start: str, end: str
) -> None:
    window = period_of(at(moment), period)
    assert window.key == key
    assert (window.start.timestamp(), window.end.timestamp()) == (at(start), at(end))
    assert window.seconds_left(at(moment)) == at(end) - at(moment)


def test_an_event_charges_its_user_and_org_in_its_own_day_and_month() -> None:
    bill = charges_for(usage(created_at="2025-03-31T23:59:00"))
    assert set(bill.totals) == {
        (Account.user("acme", "alice"), "day", "2025-03-31"),
        (Account.user("acme", "alice"), "month", "2025-03"),
        (Account.org("acme"), "day", "2025-03-31"),
        (Account.org("acme"), "month", "2025-03"),
    }
    assert bill.tokens.billed == 15  # prompt + completion; cached is in the prompt


def test_a_request_is_counted_once_and_each_kind_of_token_up_to_its_most() -> None:
    charged, charges = settle(charges_for(usage(completion=40, cached=0)), None)
    assert {(c.tokens, c.requests) for c in charges} == {(Tokens(10, 40, 0), 1)}
    charged, charges = settle(charges_for(usage(attempt=1, prior=40, completion=60)), charged)
    assert charged == Tokens(10, 100, 4)
    assert {(c.tokens, c.requests) for c in charges} == {(Tokens(0, 60, 4), 0)}
    assert settle(charges_for(usage(completion=80)), charged) == (charged, [])


async def record(ledger: UsageLedger, event: UsageEvent) -> bool:
    return await ledger.record(usage_key(event), charges_for(event))


async def test_an_upgraded_file_keeps_its_totals_and_counts_a_request_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chatpipe.db"
    with sqlite3.connect(path) as before:  # as the per-attempt ledger left it
        before.executescript("""
            CREATE TABLE usage_recorded (request_id TEXT NOT NULL, attempt INTEGER NOT NULL,
                recorded_at REAL NOT NULL, PRIMARY KEY (request_id, attempt));
            CREATE TABLE usage_totals (scope TEXT NOT NULL, account_id TEXT NOT NULL,
                period TEXT NOT NULL, period_key TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
                completion_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
                requests INTEGER NOT NULL, PRIMARY KEY (scope, account_id, period, period_key));
            INSERT INTO usage_recorded VALUES ('r0', 0, 0);
            INSERT INTO usage_totals VALUES ('org', 'acme', 'day', '2025-03-07', 10, 5, 4, 1);
        """)
    before.close()
    ledger = SQLiteLedger(path)
    await ledger.open()
    try:
        await record(ledger, usage("r1", completion=40))
        await record(ledger, usage("r1", attempt=1, prior=40, completion=60))
        assert await ledger.used([Account.org("acme")], "day", "2025-03-07") == {
            Account.org("acme"): 15 + 110
        }
    finally:
        await ledger.close()
    with sqlite3.connect(path) as after:
        assert after.execute(
            "SELECT requests FROM usage_totals WHERE scope = 'org' AND period = 'day'"
        ).fetchone() == (2,)
    after.close()


def test_no_choice_of_ids_makes_two_user_accounts_one() -> None:
    assert Account.user("a/b", "c") != Account.user("a", "b/c")
    assert Account.user('a", "b', "c") != Account.user("a", 'b", "c')

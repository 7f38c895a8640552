"""The usage ledger: token totals per (user | org, period), written by billing, read by
the gateway's quota check.

`SQLiteLedger` lives in the conversation store's database file (one machine:
`chatpipe up`, or a gateway and billing sharing a host). Its connection is the
store's kind (`conversations.sqlite_file`): used from worker threads under a
lock, WAL and a busy timeout so a gateway process and a billing process can
share the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Protocol

from billing.core import Account, Charge, UsageKey, UsageTotals
from billing.periods import Period
from conversations.sqlite_file import SQLiteFile, transaction


class UsageLedger(Protocol):
    async def open(self) -> None:
        """Create the schema if needed."""

    async def close(self) -> None: ...

    async def record(self, key: UsageKey, charges: Sequence[Charge]) -> bool:
        """Add `charges` atomically, once per `key`: a key seen before adds nothing and
        returns False, so a redelivered usage event is never counted twice."""

    async def used(
        self, accounts: Sequence[Account], period: Period, period_key: str
    ) -> dict[Account, int]:
        """Tokens (prompt + completion) each account used in that period; 0 when none."""


class MemoryLedger:
    """`UsageLedger` in process memory: tests, and a gateway without billing."""

    def __init__(self) -> None:
        self._totals = UsageTotals()

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def record(self, key: UsageKey, charges: Sequence[Charge]) -> bool:
        return self._totals.add(key, charges)

    async def used(
        self, accounts: Sequence[Account], period: Period, period_key: str
    ) -> dict[Account, int]:
        return {account: self._totals.used(account, period, period_key) for account in accounts}


_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage_recorded (
    request_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (request_id, attempt)
);
CREATE TABLE IF NOT EXISTS usage_totals (
    scope TEXT NOT NULL,
    account_id TEXT NOT NULL,
    period TEXT NOT NULL,
    period_key TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    PRIMARY KEY (scope, account_id, period, period_key)
);
"""

_ADD_CHARGE = """
INSERT INTO usage_totals VALUES (?, ?, ?, ?, ?, ?, ?, 1)
ON CONFLICT (scope, account_id, period, period_key) DO UPDATE SET
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    cached_tokens = cached_tokens + excluded.cached_tokens,
    requests = requests + 1
"""


class SQLiteLedger(SQLiteFile):
    """`UsageLedger` on one SQLite file (or ":memory:" for tests)."""

    async def record(self, key: UsageKey, charges: Sequence[Charge]) -> bool:
        return await self._run(lambda conn: self._record(conn, key, charges))

    async def used(
        self, accounts: Sequence[Account], period: Period, period_key: str
    ) -> dict[Account, int]:
        def select(conn: sqlite3.Connection) -> dict[Account, int]:
            used = {}
            for account in accounts:
                row = conn.execute(
                    "SELECT prompt_tokens + completion_tokens FROM usage_totals"
                    " WHERE scope = ? AND account_id = ? AND period = ? AND period_key = ?",
                    (account.scope, account.account_id, period, period_key),
                ).fetchone()
                used[account] = row[0] if row else 0
            return used

        return await self._run(select)

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        conn.executescript(_SCHEMA)

    def _record(self, conn: sqlite3.Connection, key: UsageKey, charges: Sequence[Charge]) -> bool:
        # The dedupe row and the totals commit together: a crash between them cannot
        # leave an event marked recorded but uncounted (or counted twice on replay).
        with transaction(conn):
            inserted = conn.execute(
                "INSERT OR IGNORE INTO usage_recorded VALUES (?, ?, ?)",
                (*key, self._clock()),
            ).rowcount
            for charge in charges if inserted else ():
                conn.execute(_ADD_CHARGE, (
                    charge.account.scope, charge.account.account_id, charge.period,
                    charge.period_key, charge.prompt_tokens, charge.completion_tokens,
                    charge.cached_tokens,
                ))  # fmt: skip
        return bool(inserted)

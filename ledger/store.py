"""The usage ledger: token totals per (user | org, period), written by billing, read by
the gateway's quota check.

Beside the conversation store: `SQLiteLedger` here, `CassandraLedger` in
`ledger.cassandra` (store=cassandra: any number of gateways and billing replicas).

`SQLiteLedger` lives in the conversation store's database file (one machine:
`chatpipe up`, or a gateway and billing sharing a host). Its connection is the
store's kind (`common.sqlite_file`): used from worker threads under a
lock, WAL and a busy timeout so a gateway process and a billing process can
share the file.

What each request was charged is kept in `usage_charged`, one row per request_id. It
replaced `usage_recorded`, one row per (request_id, attempt) with no token counts, which
a file from before keeps, unread: a request charged before the upgrade is charged in
full again if billing reads one of its events after it (a redelivery of the batch it
had not committed, or a later attempt's).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Protocol

from common.sqlite_file import SQLiteFile, transaction
from ledger.charges import Account, Bill, Tokens, UsageKey, UsageTotals, settle
from ledger.periods import Period


class UsageLedger(Protocol):
    async def open(self) -> None:
        """Create the schema if needed."""

    async def close(self) -> None: ...

    async def record(self, key: UsageKey, bill: Bill) -> bool:
        """Charge request `key` atomically what `bill` adds to it (`ledger.charges.settle`):
        the request counted once, its tokens up to the most any of its events reports.
        False if it adds nothing, so a redelivered or stale usage event is never
        counted twice."""

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

    async def record(self, key: UsageKey, bill: Bill) -> bool:
        return self._totals.add(key, bill)

    async def used(
        self, accounts: Sequence[Account], period: Period, period_key: str
    ) -> dict[Account, int]:
        return {account: self._totals.used(account, period, period_key) for account in accounts}


_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage_charged (
    request_id TEXT PRIMARY KEY,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    charged_at REAL NOT NULL
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

_SET_CHARGED = """
INSERT INTO usage_charged VALUES (?, ?, ?, ?, ?)
ON CONFLICT (request_id) DO UPDATE SET
    prompt_tokens = excluded.prompt_tokens,
    completion_tokens = excluded.completion_tokens,
    cached_tokens = excluded.cached_tokens,
    charged_at = excluded.charged_at
"""

_ADD_CHARGE = """
INSERT INTO usage_totals VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (scope, account_id, period, period_key) DO UPDATE SET
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    cached_tokens = cached_tokens + excluded.cached_tokens,
    requests = requests + excluded.requests
"""


class SQLiteLedger(SQLiteFile):
    """`UsageLedger` on one SQLite file (or ":memory:" for tests)."""

    async def record(self, key: UsageKey, bill: Bill) -> bool:
        return await self._run(lambda conn: self._record(conn, key, bill))

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

    def _record(self, conn: sqlite3.Connection, key: UsageKey, bill: Bill) -> bool:
        # What the request was charged is read, and its new row and the totals written,
        # in one transaction: a crash cannot leave a charge remembered but uncounted (or
        # counted twice on replay), and a second billing process waits its turn.
        with transaction(conn):
            row = conn.execute(
                "SELECT prompt_tokens, completion_tokens, cached_tokens FROM usage_charged"
                " WHERE request_id = ?",
                (key,),
            ).fetchone()
            charged, charges = settle(bill, Tokens(*row) if row else None)
            if charges:
                conn.execute(_SET_CHARGED, (key, *charged, self._clock()))
            for charge in charges:
                conn.execute(_ADD_CHARGE, (
                    charge.account.scope, charge.account.account_id, charge.period,
                    charge.period_key, *charge.tokens, charge.requests,
                ))  # fmt: skip
        return bool(charges)

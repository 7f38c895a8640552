"""The usage ledger on Cassandra: `UsageLedger` for a deployment on more than one machine
(tables and statements in `ledger.cassandra_schema`; the driver session is the
conversation store's, `conversations.cassandra_session`).

What a request was charged is one `ledger_charged` row, written only with lightweight
transactions; the totals are counters in `ledger_totals`. A counter cannot be written
in the same transaction as the row, and adding to one twice counts twice, so each
charge is first written into the row as *pending*, then counted, then cleared.
`record(key, bill)` for one usage event:

1. reads the request's row (a pending charge found there is counted first, below);
2. settles the event against what the row says was charged (`ledger.charges.settle`);
   nothing added: returns False, having written nothing;
3. LWT: the new charged tokens and this event's charges as pending, `IF` the charged
   tokens are still what step 1 read and nothing is pending (`INSERT … IF NOT EXISTS`
   for a first charge); refused (a concurrent writer got there first), back to 1;
4. adds each charge to its counter (user and org, day and month), concurrently;
5. LWT: clears the pending charge `IF` it is still this writer's.

A crash (or a failed statement) at each step, then a redelivery of the same event:

* before step 3 took effect: nothing was written; the redelivery charges the event
  once.
* after step 3, before step 4 (or a step 3 that took effect but whose answer was
  lost): the charge is pending and in no total; the redelivery counts it: once.
* during step 4: the charge is pending and in some totals; the redelivery counts all
  of it again: those totals hold that event's increase twice, the others once. A
  counter update that times out is such a case (Cassandra may have applied it).
* after step 4, before step 5: every total has it; the redelivery counts it again:
  twice.
* after step 5: nothing pending; the redelivery adds nothing.

So a charge is never lost (billing commits an event only once `record` returned), and
at worst one event's increase is counted twice. Who counts a pending charge: the same
ledger at once when the failure was its own (billing's `retried` calls `record` again);
any other writer (billing restarted, or another replica after a rebalance) once the
charge has been pending `takeover_after_s`, since until then its writer may still be
counting it: the redelivery waits, reading the row every `poll_s`. A writer stalled
longer than that between steps 3 and 5 counts it as well as the one that took it over
(twice again). Meanwhile the gateway's quota check does not see the pending charge.

Cost of an event that adds tokens: one read, two LWTs, one counter update per total;
of one that adds nothing (a redelivery, a stale attempt): one read.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from conversations.cassandra_schema import applied
from conversations.cassandra_session import CqlSession, DriverSession
from ledger import cassandra_schema as cql
from ledger.charges import Account, Bill, Charge, Tokens, UsageKey, settle
from ledger.periods import Period

TAKEOVER_AFTER_S = 60.0
"""A pending charge this old has lost its writer: six times the driver's request
timeout, with room for clocks a few seconds apart."""
POLL_S = 0.05
MAX_ROUNDS = 100
"""Rounds of one event before giving up; each is another writer's charge of the same
request taking effect (a refused claim, or a pending charge counted first)."""


@dataclass(frozen=True, slots=True)
class _Charged:
    """A request's `ledger_charged` row."""

    tokens: Tokens
    pending: str | None
    pending_id: str | None
    pending_at: float | None


class CassandraLedger:
    """`UsageLedger` on a Cassandra cluster, in the conversation store's keyspace."""

    def __init__(
        self,
        hosts: list[str],
        keyspace: str = "chatpipe",
        *,
        create_schema: bool = True,
        replication_factor: int = 1,
        clock: Callable[[], float] = time.time,
        connect: Callable[[], Awaitable[CqlSession]] | None = None,
        takeover_after_s: float = TAKEOVER_AFTER_S,
        poll_s: float = POLL_S,
    ) -> None:
        """`connect` replaces the driver (tests); by default `DriverSession.connect`."""
        self._connect = connect or (
            lambda: DriverSession.connect(
                hosts, keyspace, create_schema=create_schema,
                replication_factor=replication_factor, schema=cql,
            )
        )  # fmt: skip
        self._clock = clock
        self._takeover_after_s = takeover_after_s
        self._poll_s = poll_s
        self._session: CqlSession | None = None
        self._abandoned: set[str] = set()
        """Pending charges this ledger wrote or took and then failed to count."""

    async def open(self) -> None:
        if self._session is None:
            self._session = await self._connect()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def _db(self) -> CqlSession:
        if self._session is None:
            raise RuntimeError("CassandraLedger is not open")
        return self._session

    async def record(self, key: UsageKey, bill: Bill) -> bool:
        for _ in range(MAX_ROUNDS):
            charged = await self._read(key)
            if charged is not None and charged.pending_id is not None:
                await self._finish(key, charged)
                continue
            after, charges = settle(bill, charged.tokens if charged else None)
            if not charges:
                return False
            pending_id = uuid.uuid4().hex
            if await self._claim(key, charged, after, charges, pending_id):
                await self._count(key, pending_id, charges)
                return True
        raise RuntimeError(f"request {key}: no charge written in {MAX_ROUNDS} rounds")

    async def used(
        self, accounts: Sequence[Account], period: Period, period_key: str
    ) -> dict[Account, int]:
        rows = await asyncio.gather(*(
            self._db.run("select_total", (a.scope, a.account_id, period, period_key))
            for a in accounts
        ))  # fmt: skip
        return {
            account: (found[0]["prompt_tokens"] or 0) + (found[0]["completion_tokens"] or 0)
            if found
            else 0
            for account, found in zip(accounts, rows, strict=True)
        }

    async def _read(self, key: UsageKey) -> _Charged | None:
        rows = await self._db.run("select_charged", (key,))
        if not rows:
            return None
        row = rows[0]
        tokens = Tokens(row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"])
        return _Charged(tokens, row["pending"], row["pending_id"], row["pending_at"])

    async def _claim(
        self,
        key: UsageKey,
        charged: _Charged | None,
        after: Tokens,
        charges: list[Charge],
        pending_id: str,
    ) -> bool:
        """Step 3: True if this writer's charge is now the request's, pending."""
        now = self._clock()
        pending = (cql.charges_text(charges), pending_id, now, now)
        try:
            if charged is None:
                rows = await self._db.run("insert_charged", (key, *after, *pending))
            else:
                rows = await self._db.run(
                    "update_charged", (*after, *pending, key, *charged.tokens)
                )
        except BaseException:
            self._abandoned.add(pending_id)  # it may have taken effect all the same
            raise
        return applied(rows)

    async def _count(self, key: UsageKey, pending_id: str, charges: list[Charge]) -> None:
        """Steps 4 and 5."""
        try:
            await asyncio.gather(*(self._db.run("add_to_total", cql.total_values(charge))
                                   for charge in charges))  # fmt: skip
            await self._db.run("clear_pending", (key, pending_id))
        except BaseException:
            self._abandoned.add(pending_id)
            raise
        self._abandoned.discard(pending_id)

    async def _finish(self, key: UsageKey, charged: _Charged) -> None:
        """Count the charge pending on `charged`, once its writer has failed to: wait
        while that writer may still be counting it, then take it over."""
        while (
            charged.pending_id not in self._abandoned
            and self._clock() - (charged.pending_at or 0.0) < self._takeover_after_s
        ):
            await asyncio.sleep(self._poll_s)
            found = await self._read(key)
            if found is None or found.pending_id is None:
                return
            charged = found
        assert charged.pending is not None and charged.pending_id is not None
        mine = uuid.uuid4().hex
        if applied(
            await self._db.run("take_pending", (mine, self._clock(), key, charged.pending_id))
        ):
            self._abandoned.discard(charged.pending_id)
            await self._count(key, mine, cql.charges_of(charged.pending))


async def create_schema(hosts: list[str], keyspace: str, replication_factor: int = 1) -> None:
    """Create the ledger's tables (and the keyspace if need be; idempotent): with the
    store's, the deployment's one-off schema job."""
    session = await DriverSession.connect(
        hosts, keyspace, create_schema=True, replication_factor=replication_factor, schema=cql
    )
    await session.close()

"""One behaviour for every usage ledger (`ledger.store.UsageLedger`): each request
charged the most any of its usage events reports, once, to its user and its org per
period, however its events come (late, twice, out of order, at the same time).

Each contract test runs against:

* `memory` — `MemoryLedger`, the reference (`ledger.charges.UsageTotals`);
* `sqlite` — `SQLiteLedger` on a fresh file;
* `cassandra-emulated` — `CassandraLedger`'s own code over an in-memory emulation of its
  statements (`cassandra_emulator.EmulatedLedgerCql`): its LWT claims, pending charges
  and counters on every run;
* `cassandra` — `CassandraLedger` on a real cluster when `CASSANDRA_HOSTS` names one,
  in a keyspace of its own, dropped at the end.

Then what `CassandraLedger` promises when its writer crashes between its steps
(`ledger.cassandra`): the emulator fails a chosen statement, and the event is
delivered again. Ids are unique per test (`Names`), so tests can share a real keyspace.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio

from billing.core import charges_for, usage_key
from conversations.cassandra_session import DriverSession
from conversations.store import ApiKey
from gateway.admission.gates import Ask
from gateway.admission.quotas import QuotaGate
from gateway.errors import ApiError
from ledger import cassandra_schema
from ledger.cassandra import TAKEOVER_AFTER_S, CassandraLedger
from ledger.charges import Account
from ledger.store import MemoryLedger, SQLiteLedger, UsageLedger
from schemas.events import UsageEvent
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.cassandra_emulator import EmulatedCrash, EmulatedLedgerCql
from tests.support.conformance import CASSANDRA_HOSTS, NO_SERVER, Clock, Names

DAY, MONTH = "2025-03-07", "2025-03"


@pytest.fixture(scope="session")
def ledger_keyspace() -> Iterator[str]:
    if not CASSANDRA_HOSTS:
        pytest.skip(NO_SERVER)
    keyspace = f"chatpipe_ledger_test_{uuid.uuid4().hex[:8]}"
    yield keyspace

    async def drop() -> None:
        session = await DriverSession.connect(CASSANDRA_HOSTS, keyspace, create_schema=False,
                                              schema=cassandra_schema)  # fmt: skip
        session._session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        await session.close()

    asyncio.run(drop())


@pytest.fixture
def n() -> Names:
    return Names()


def emulated(session: EmulatedLedgerCql, clock: Clock) -> CassandraLedger:
    """A `CassandraLedger` over `session`: a billing process of its own."""

    async def connect() -> EmulatedLedgerCql:
        return session

    return CassandraLedger([], clock=clock, connect=connect, poll_s=0)


@pytest_asyncio.fixture(params=["memory", "sqlite", "cassandra-emulated", "cassandra"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[UsageLedger]:
    made: UsageLedger
    if request.param == "memory":
        made = MemoryLedger()
    elif request.param == "sqlite":
        made = SQLiteLedger(tmp_path / "chatpipe.db")
    elif request.param == "cassandra-emulated":
        made = emulated(EmulatedLedgerCql(), Clock())
    else:
        made = CassandraLedger(CASSANDRA_HOSTS, request.getfixturevalue("ledger_keyspace"))
    await made.open()
    yield made
    await made.close()


def usage(
    n: Names,
    request: str = "r1",
    attempt: int = 0,
    user: str = "alice",
    org: str = "acme",
    prompt: int = 10,
    completion: int = 5,
    cached: int = 4,
    prior: int = 0,
    created_at: str = f"{DAY}T12:00:00",
) -> UsageEvent:
    return UsageEvent(
        request_id=getattr(n, request),
        attempt=attempt,
        conversation_id="c1",
        user_id=user,
        org_id=getattr(n, org),
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


def at(moment: str) -> float:
    return datetime.fromisoformat(moment).replace(tzinfo=UTC).timestamp()


async def record(ledger: UsageLedger, event: UsageEvent) -> bool:
    return await ledger.record(usage_key(event), charges_for(event))


def alice(n: Names, org: str = "acme") -> Account:
    return Account.user(getattr(n, org), "alice")


def acme(n: Names) -> Account:
    return Account.org(n.acme)


async def day_used(ledger: UsageLedger, account: Account) -> int:
    return (await ledger.used([account], "day", DAY))[account]


# --- the contract ---------------------------------------------------------------------

# Each step: an event (as `usage` arguments) in the order billing reads it, and the
# tokens it adds to its user's day.
A0 = {"attempt": 0, "completion": 40}
A1 = {"attempt": 1, "prior": 40, "completion": 60}
ATTEMPTS = [
    ("single attempt", [(A0, 50)]),
    ("drained handoff", [(A0, 50), (A1, 60)]),
    ("crash handoff: a0 never reports", [(A1, 110)]),
    ("zombie a0 reports after a1", [(A1, 110), ({"attempt": 0, "completion": 80}, 0)]),
    ("redeliveries", [(A0, 50), (A0, 0), (A1, 60), (A1, 0)]),
    ("out of order", [(A1, 110), (A0, 0), ({"attempt": 2, "prior": 100, "completion": 20}, 20)]),
    ("prompt counted once", [({"completion": 0}, 10), ({"attempt": 1, "completion": 30}, 30)]),
]


@pytest.mark.parametrize(("case", "steps"), ATTEMPTS, ids=[case for case, _ in ATTEMPTS])
async def test_a_request_is_charged_once_the_most_any_event_reports(
    ledger: UsageLedger, n: Names, case: str, steps: list[tuple[dict, int]]
) -> None:
    for fields, added in steps:
        before = await day_used(ledger, alice(n))
        assert await record(ledger, usage(n, **fields)) == (added > 0), case
        assert await day_used(ledger, alice(n)) - before == added, case


async def test_totals_are_per_user_and_org_per_period(ledger: UsageLedger, n: Names) -> None:
    await record(ledger, usage(n, "r1", user="alice"))
    await record(ledger, usage(n, "r2", user="bob"))
    await record(ledger, usage(n, "r3", user="alice", created_at="2025-03-08T01:00:00"))
    bob = Account.user(n.acme, "bob")

    assert await ledger.used([alice(n), bob, acme(n)], "day", DAY) == {
        alice(n): 15,
        bob: 15,
        acme(n): 30,
    }
    assert await ledger.used([alice(n), acme(n)], "day", "2025-03-08") == {
        alice(n): 15,
        acme(n): 15,
    }
    assert await ledger.used([alice(n), acme(n)], "month", MONTH) == {alice(n): 30, acme(n): 45}


async def test_unknown_accounts_and_periods_used_nothing(ledger: UsageLedger, n: Names) -> None:
    nobody, no_org = Account.user(n.acme, "carol"), Account.org(n.globex)
    assert await ledger.used([nobody, no_org], "day", DAY) == {nobody: 0, no_org: 0}
    await record(ledger, usage(n))
    assert await ledger.used([nobody, acme(n)], "month", "2025-04") == {nobody: 0, acme(n): 0}
    assert await ledger.used([], "day", DAY) == {}


async def test_each_increase_goes_to_the_periods_of_its_own_event(
    ledger: UsageLedger, n: Names
) -> None:
    await record(ledger, usage(n, completion=40, created_at="2025-03-31T23:59:00"))
    await record(ledger, usage(n, attempt=1, prior=40, completion=60,
                               created_at="2025-04-01T00:01:00"))  # fmt: skip
    assert await ledger.used([acme(n)], "day", "2025-03-31") == {acme(n): 50}
    assert await ledger.used([acme(n)], "month", "2025-04") == {acme(n): 60}


async def test_the_same_user_id_in_two_orgs_is_two_users(ledger: UsageLedger, n: Names) -> None:
    await record(ledger, usage(n, "r1", org="acme"))
    await record(ledger, usage(n, "r2", org="globex"))
    assert await ledger.used([alice(n), alice(n, "globex")], "day", DAY) == {
        alice(n): 15,
        alice(n, "globex"): 15,
    }


async def test_concurrent_events_of_one_request_count_once(ledger: UsageLedger, n: Names) -> None:
    events = [usage(n, **A0), usage(n, **A1), usage(n, **A0), usage(n, **A1), usage(n, **A1)]
    changed = await asyncio.gather(*(record(ledger, event) for event in events))

    assert any(changed)
    assert await ledger.used([alice(n), acme(n)], "month", MONTH) == {alice(n): 110, acme(n): 110}


async def test_concurrent_events_of_different_requests_all_count(
    ledger: UsageLedger, n: Names
) -> None:
    events = [usage(n, f"r{i}", user=f"u{i % 3}", completion=i) for i in range(30)]
    assert all(await asyncio.gather(*(record(ledger, event) for event in events)))
    assert await day_used(ledger, acme(n)) == sum(10 + i for i in range(30))
    assert await day_used(ledger, Account.user(n.acme, "u0")) == sum(
        10 + i for i in range(0, 30, 3)
    )


@pytest_asyncio.fixture(params=["sqlite", "cassandra-emulated", "cassandra"])
async def billing_and_gateway(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[UsageLedger, UsageLedger]]:
    """Two ledgers on one store, as billing and a gateway open it in two processes."""
    pair: tuple[UsageLedger, UsageLedger]
    if request.param == "sqlite":
        pair = SQLiteLedger(tmp_path / "chatpipe.db"), SQLiteLedger(tmp_path / "chatpipe.db")
    elif request.param == "cassandra-emulated":
        session = EmulatedLedgerCql()
        pair = emulated(session, Clock()), emulated(session, Clock())
    else:
        keyspace = request.getfixturevalue("ledger_keyspace")
        pair = (
            CassandraLedger(CASSANDRA_HOSTS, keyspace),
            CassandraLedger(CASSANDRA_HOSTS, keyspace),
        )
    for ledger in pair:
        await ledger.open()
    yield pair
    for ledger in pair:
        await ledger.close()


async def test_a_gateway_refuses_what_billing_charged_elsewhere(
    billing_and_gateway: tuple[UsageLedger, UsageLedger], n: Names
) -> None:
    billing, gateway = billing_and_gateway
    owner = ApiKey("alice", n.acme, Tier.FREE)
    quota = QuotaGate(gateway, user_budget=100, org_budget=None, period="day",
                      clock=lambda: at(f"{DAY}T21:00:00"))  # fmt: skip

    await record(billing, usage(n, prompt=60, completion=30))
    await quota.check(Ask(owner, "m", 10))
    await record(billing, usage(n, attempt=1, prompt=60, prior=30, completion=20))
    with pytest.raises(ApiError) as refused:
        await quota.check(Ask(owner, "m", 10))
    assert refused.value.detail.startswith("user token budget exhausted: 110 of 100")


# --- CassandraLedger when its writer crashes between steps ----------------------------

TOTALS = ("user day", "user month", "org day", "org month")  # the order of a bill's totals

# (statement that fails, calls of it that pass first, whether it took effect,
#  what a0's 50 tokens count as in each total once the event is delivered again)
CRASHES = [
    ("select_charged", 0, False, (50, 50, 50, 50)),
    ("insert_charged", 0, False, (50, 50, 50, 50)),
    ("insert_charged", 0, True, (50, 50, 50, 50)),  # applied, answer lost
    ("add_to_total", 0, False, (50, 100, 100, 100)),  # the others were already sent
    ("add_to_total", 3, True, (100, 100, 100, 100)),
    ("clear_pending", 0, False, (100, 100, 100, 100)),
    ("clear_pending", 0, True, (50, 50, 50, 50)),
]


async def every_total(ledger: UsageLedger, n: Names) -> tuple[int, ...]:
    return tuple([(await ledger.used([account], period, key))[account]
                  for account in (alice(n), acme(n))
                  for period, key in (("day", DAY), ("month", MONTH))])  # fmt: skip


@pytest.mark.parametrize("redelivered_to", ["the same ledger", "a restarted billing"])
@pytest.mark.parametrize(
    ("statement", "skip", "took_effect", "counted"),
    CRASHES,
    ids=[f"{s}-{k}-{'after' if e else 'before'}" for s, k, e, _ in CRASHES],
)
async def test_a_crash_between_steps_counts_the_event_once_or_twice_never_not_at_all(
    n: Names,
    statement: str,
    skip: int,
    took_effect: bool,
    counted: tuple[int, ...],
    redelivered_to: str,
) -> None:
    session, clock = EmulatedLedgerCql(), Clock()
    first = emulated(session, clock)
    await first.open()
    session.crash(statement, skip=skip, after_effect=took_effect)
    with pytest.raises(EmulatedCrash):
        await record(first, usage(n, **A0))

    again = first
    if redelivered_to == "a restarted billing":
        again = emulated(session, clock)
        await again.open()
        clock.now += TAKEOVER_AFTER_S
    await record(again, usage(n, **A0))

    assert dict(zip(TOTALS, await every_total(again, n), strict=True)) == dict(
        zip(TOTALS, counted, strict=True)
    )
    assert all(row["pending"] is None for row in session.charged.values())
    assert await record(again, usage(n, **A0)) is False  # and from then on, never again
    assert dict(zip(TOTALS, await every_total(again, n), strict=True)) == dict(
        zip(TOTALS, counted, strict=True)
    )


async def test_a_charge_pending_under_a_live_writer_waits_for_it(n: Names) -> None:
    """Another billing that finds a charge pending leaves it to its writer until the
    takeover time has passed: counting it at once would count it twice."""
    session, clock = EmulatedLedgerCql(), Clock()
    first, other = emulated(session, clock), emulated(session, clock)
    await first.open()
    await other.open()
    session.crash("add_to_total", skip=3, after_effect=True)  # counted, still pending
    with pytest.raises(EmulatedCrash):
        await record(first, usage(n, **A0))

    redelivery = asyncio.create_task(record(other, usage(n, **A0)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not redelivery.done()
    assert await day_used(other, alice(n)) == 50

    clock.now += TAKEOVER_AFTER_S
    await redelivery
    assert await day_used(other, alice(n)) == 100  # taken over: counted again, as promised


async def test_a_later_event_counts_what_a_crash_left_pending(n: Names) -> None:
    """The next attempt's event, not only a redelivery, finishes a pending charge."""
    session, clock = EmulatedLedgerCql(), Clock()
    first = emulated(session, clock)
    await first.open()
    session.crash("add_to_total")
    with pytest.raises(EmulatedCrash):
        await record(first, usage(n, **A0))

    assert await record(first, usage(n, **A1)) is True
    assert await every_total(first, n) == (110, 160, 160, 160)

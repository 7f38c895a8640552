"""What a request is charged: its tokens counted once across its attempts and
redeliveries, added to its user's and its org's totals per period.

A request is charged the most any of its usage events reports (`settle`): each event
charges only the increase over what its request was charged already, so an event that
comes late, twice or out of order never counts twice. `UsageTotals` is the reference,
in memory; the ledgers in `ledger.store` do the same durably.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, NamedTuple

from ledger.periods import Period

UsageKey = str
"""The request_id: every attempt of a request, and every redelivery, shares it."""


@dataclass(frozen=True, slots=True)
class Account:
    """Who is charged: a user or an org."""

    scope: Literal["user", "org"]
    account_id: str

    @classmethod
    def user(cls, org_id: str, user_id: str) -> Account:
        """A user is one of an org's: the same user id in two orgs is two accounts (the
        id is a JSON pair, so no choice of ids makes two accounts one)."""
        return cls("user", json.dumps([org_id, user_id], ensure_ascii=False))

    @classmethod
    def org(cls, org_id: str) -> Account:
        return cls("org", org_id)


TotalsKey = tuple[Account, Period, str]
"""(account, period, period_key)."""


class Tokens(NamedTuple):
    """What an event reports for its request, what a request was charged, or what a
    charge adds."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def billed(self) -> int:
        """What budgets count."""
        return self.prompt_tokens + self.completion_tokens

    def most(self, other: Tokens) -> Tokens:
        return Tokens(*map(max, self, other))

    def minus(self, other: Tokens) -> Tokens:
        return Tokens(*(mine - theirs for mine, theirs in zip(self, other, strict=True)))


@dataclass(frozen=True, slots=True)
class Bill:
    """One usage event's report: its request's tokens in all as far as that attempt
    knows, and the totals (user and org, each period) they are charged to."""

    tokens: Tokens
    totals: tuple[TotalsKey, ...]


@dataclass(frozen=True, slots=True)
class Charge:
    """What one usage event adds to one account's totals for one period."""

    account: Account
    period: Period
    period_key: str
    tokens: Tokens
    requests: int
    """1 on a request's first charge, else 0: totals count requests, not attempts."""


def settle(bill: Bill, charged: Tokens | None) -> tuple[Tokens, list[Charge]]:
    """What `bill` charges a request already charged `charged` (None: never charged):
    the request's new charged tokens, and one charge per total of the increase (never
    negative). No charges when it adds nothing: a redelivery, or an attempt that reports
    no more than was charged already."""
    before = charged or Tokens()
    after = before.most(bill.tokens)
    added = after.minus(before)
    if charged is not None and added == Tokens():
        return before, []
    requests = int(charged is None)
    return after, [
        Charge(account, period, period_key, added, requests)
        for account, period, period_key in bill.totals
    ]


class UsageTotals:
    """Token totals per account and period, each request charged the most any of its
    events reports (in memory).

    The reference semantics of `ledger.store.UsageLedger`: the SQLite ledger
    does the same in one transaction per event, the Cassandra ledger
    (`ledger.cassandra`) with lightweight transactions and counters.
    """

    def __init__(self) -> None:
        self._charged: dict[UsageKey, Tokens] = {}
        self._tokens: dict[TotalsKey, int] = {}

    def add(self, key: UsageKey, bill: Bill) -> bool:
        """Charge what `bill` adds to request `key`; True if it changed the totals."""
        charged, charges = settle(bill, self._charged.get(key))
        if not charges:
            return False
        self._charged[key] = charged
        for charge in charges:
            slot = (charge.account, charge.period, charge.period_key)
            self._tokens[slot] = self._tokens.get(slot, 0) + charge.tokens.billed
        return True

    def used(self, account: Account, period: Period, period_key: str) -> int:
        return self._tokens.get((account, period, period_key), 0)

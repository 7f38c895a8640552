"""Billing's pure core: what a usage event charges, and totals that count each attempt once.

A usage event charges its user and its org, in the day and the month of the
event's own `created_at` (not the time billing reads it), so a replay books the
same tokens into the same periods. Tokens charged = prompt + completion; cached
prompt tokens are part of the prompt and kept separately for reporting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from billing.periods import PERIODS, Period, period_of
from schemas.events import UsageEvent

UsageKey = tuple[str, int]
"""(request_id, attempt): one usage event per attempt; a redelivery repeats the key."""


@dataclass(frozen=True, slots=True)
class Account:
    """Who is charged: a user or an org."""

    scope: Literal["user", "org"]
    account_id: str

    @classmethod
    def user(cls, user_id: str) -> Account:
        return cls("user", user_id)

    @classmethod
    def org(cls, org_id: str) -> Account:
        return cls("org", org_id)


@dataclass(frozen=True, slots=True)
class Charge:
    """Tokens one event adds to one account's total for one period."""

    account: Account
    period: Period
    period_key: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def tokens(self) -> int:
        """What budgets count."""
        return self.prompt_tokens + self.completion_tokens


def usage_key(event: UsageEvent) -> UsageKey:
    return (event.request_id, event.attempt)


def charges_for(event: UsageEvent, periods: Sequence[Period] = PERIODS) -> list[Charge]:
    """The charges of one usage event: user and org, in each period."""
    return [
        Charge(account, period, period_of(event.created_at, period).key,
               event.prompt_tokens, event.completion_tokens, event.cached_tokens)
        for account in (Account.user(event.user_id), Account.org(event.org_id))
        for period in periods
    ]


TotalsKey = tuple[Account, str, str]
"""(account, period, period_key)."""


class UsageTotals:
    """Token totals per account and period, each usage key counted once (in memory).

    The reference semantics of `billing.ledger.UsageLedger`: the SQLite ledger
    does the same in one transaction per event.
    """

    def __init__(self) -> None:
        self._seen: set[UsageKey] = set()
        self._tokens: dict[TotalsKey, int] = {}

    def add(self, key: UsageKey, charges: Iterable[Charge]) -> bool:
        """Add `charges` unless `key` was added before; True if they were added."""
        if key in self._seen:
            return False
        self._seen.add(key)
        for charge in charges:
            slot = (charge.account, charge.period, charge.period_key)
            self._tokens[slot] = self._tokens.get(slot, 0) + charge.tokens
        return True

    def used(self, account: Account, period: Period, period_key: str) -> int:
        return self._tokens.get((account, period, period_key), 0)

"""Token budgets per period, per user and per org, read from billing's ledger.

A budget is exhausted once the tokens used in the current period (UTC day or
month, `budget_period`) reach it; requests are then refused until the period
ends. The ledger counts a request once it has ended and billing has read its
usage from chat.usage, so requests already running when a budget runs out
still finish: a budget can be overrun by what was in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import ceil

from conversations.store import ApiKey
from gateway.admission.gates import NO_HEADERS, Ask, Gate
from gateway.config import QuotaConfig
from gateway.errors import ApiError
from ledger.charges import Account
from ledger.periods import Period, PeriodWindow, period_of
from ledger.store import UsageLedger


@dataclass(frozen=True, slots=True)
class Budget:
    account: Account
    tokens: int
    """Tokens allowed per period."""


def budgets_for(owner: ApiKey, user_budget: int | None, org_budget: int | None) -> list[Budget]:
    """The budgets that apply to `owner`, user first; a None budget is off."""
    budgets = [
        (Account.user(owner.org_id, owner.user_id), user_budget),
        (Account.org(owner.org_id), org_budget),
    ]
    return [Budget(account, tokens) for account, tokens in budgets if tokens is not None]


def exhausted(budgets: Sequence[Budget], used: Mapping[Account, int]) -> Budget | None:
    """The first budget whose account has used all of it, or None."""
    return next((b for b in budgets if used.get(b.account, 0) >= b.tokens), None)


def quota_exceeded(budget: Budget, used: int, window: PeriodWindow, now: float) -> ApiError:
    """429 naming the budget, how much of it is used, and when it resets."""
    resets_at = window.end.strftime("%Y-%m-%dT%H:%M:%SZ")
    message = (
        f"{budget.account.scope} token budget exhausted: {used} of {budget.tokens}"
        f" tokens used this {window.period} ({window.key}); it resets at {resets_at}"
    )
    retry_after = max(1, ceil(window.seconds_left(now)))
    return ApiError(429, "quota_exceeded", message, headers={"Retry-After": str(retry_after)})


class QuotaGate(Gate):
    """Refuses a request whose user or org has used up its budget for this period."""

    def __init__(
        self,
        ledger: UsageLedger,
        *,
        user_budget: int | None,
        org_budget: int | None,
        period: Period,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.user_budget = user_budget
        self.org_budget = org_budget
        self.period = period
        self.clock = clock

    @classmethod
    def from_config(cls, config: QuotaConfig, ledger: UsageLedger) -> QuotaGate:
        return cls(
            ledger,
            user_budget=config.user_token_budget,
            org_budget=config.org_token_budget,
            period=config.period,
        )

    async def check(self, ask: Ask) -> Mapping[str, str]:
        """Pass if every budget of the asker has tokens left; raise 429 quota_exceeded if not."""
        owner = ask.owner
        budgets = budgets_for(owner, self.user_budget, self.org_budget)
        if not budgets:
            return NO_HEADERS
        now = self.clock()
        window = period_of(now, self.period)
        used = await self.ledger.used([b.account for b in budgets], self.period, window.key)
        spent = exhausted(budgets, used)
        if spent is not None:
            raise quota_exceeded(spent, used.get(spent.account, 0), window, now)
        return NO_HEADERS

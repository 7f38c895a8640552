"""Billing's pure core: what a usage event charges, each request's tokens counted once
across its attempts and redeliveries.

A request can be run by several attempts: a worker that crashes or drains is continued
by the next attempt, which reads back the tokens already streamed. Each attempt sends a
usage event (one killed outright sends none), and any event can come late, twice or out
of order. An event's bill reports its request's tokens as far as its attempt knows:
prompt and cached tokens (each attempt prefills the same prompt; the user pays for it
once), and completion = the earlier attempts' tokens the attempt continued + its own.
The ledger charges a request the most any of its bills reports, each time only the
increase (`ledger.charges.settle`), to its user and its org, in the day and the month of
the event's own `created_at` (not the time billing reads it), so a replay books into the
same periods. Tokens charged = prompt + completion; cached prompt tokens are part of the
prompt and kept separately for reporting.
"""

from __future__ import annotations

from collections.abc import Sequence

from ledger.charges import Account, Bill, Tokens, UsageKey
from ledger.periods import PERIODS, Period, period_of
from schemas.events import UsageEvent


def usage_key(event: UsageEvent) -> UsageKey:
    return event.request_id


def charges_for(event: UsageEvent, periods: Sequence[Period] = PERIODS) -> Bill:
    """The bill of one usage event: its request's prompt, the completion tokens of the
    earlier attempts it continued + its own, and its cached tokens, charged to its user
    and org in each period of its `created_at`."""
    reported = Tokens(
        event.prompt_tokens,
        event.prior_completion_tokens + event.completion_tokens,
        event.cached_tokens,
    )
    return Bill(
        reported,
        tuple(
            (account, period, period_of(event.created_at, period).key)
            for account in (Account.user(event.org_id, event.user_id), Account.org(event.org_id))
            for period in periods
        ),
    )

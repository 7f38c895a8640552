"""Who holds a model's running slots: counts per org and per user, and the request to
preempt so that a tenant kept waiting gets its fair share.

The waiting set is fair already (`FairQueue`), but a tenant whose requests arrived while
slots were free can hold every one of them for as long as its answers run. So when a
request cannot get a slot of its model, the scheduler asks `victim` whether another
tenant holds more than its share: the org with the most slots of the model (within an
org, the user with the most) gives one back if it holds at least two more than the
waiting request's org (or user). Repeated as long as someone waits, that converges on
equal slots per org, then per user, among those who want them (max-min fairness); a
tenant alone keeps every slot (nothing waits, so nothing is preempted).

Only a request of the waiting request's tier or a lower one is preempted: tiers are the
operator's priority (`Policy.min_share` keeps lower tiers served). Nor is one whose
output is held to a JSON schema (a constrained tool call, a `response_format`): its
next attempt could not continue it (`workers.core.Attempt.resume`). The request given
back is the tenant's newest: it has done the least work, which its next attempt, on
whichever worker, prefills again before it continues the stream.

Every update and the victim's choice are O(1) in the running requests and in the
tenants running the model: the tenant holding the most slots is kept (`Tally`), not
looked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from schemas.events import GenerationRequest
from schemas.topics import Tier

_RANK = {tier: tier.rank for tier in Tier}
K = TypeVar("K")
NOT_PREEMPTABLE = -1
"""Below every tier's rank: no waiting request may preempt it."""


def preemptable(request: GenerationRequest) -> bool:
    """Whether a next attempt can continue `request` where this one stops."""
    tool_use = request.tool_use
    return not (tool_use is not None and tool_use.constrained) and not request.sampling.structured


@dataclass(frozen=True, slots=True)
class _Running:
    model: str
    org: str
    user: str
    rank: int


class RunningShares:
    """The requests running (handed out and not ended) per model, by org and user."""

    def __init__(self) -> None:
        self._of: dict[str, _Running] = {}
        self._orgs: dict[str, Tally] = {}  # model -> slots per org
        self._users: dict[tuple[str, str], Tally] = {}  # (model, org) -> slots per user
        self._newest: dict[tuple[str, str, str], dict[str, int]] = {}
        """(model, org, user) -> its running request ids, oldest first, with their tier's
        rank (`NOT_PREEMPTABLE`: never preempted)."""

    def __len__(self) -> int:
        return len(self._of)

    def add(self, request: GenerationRequest) -> None:
        request_id = request.request_id
        if request_id in self._of:
            self.remove(request_id)
        running = _Running(request.model, request.org_id, request.user_id, _RANK[request.tier])
        self._of[request_id] = running
        _give(self._orgs, running.model, running.org)
        _give(self._users, (running.model, running.org), running.user)
        key = (running.model, running.org, running.user)
        self._newest.setdefault(key, {})[request_id] = (
            running.rank if preemptable(request) else NOT_PREEMPTABLE
        )

    def remove(self, request_id: str) -> None:
        running = self._of.pop(request_id, None)
        if running is None:
            return
        model, org, user = running.model, running.org, running.user
        _take(self._orgs, model, org)
        _take(self._users, (model, org), user)
        requests = self._newest[(model, org, user)]
        del requests[request_id]
        if not requests:
            del self._newest[(model, org, user)]

    def slots(self, model: str, org: str, user: str | None = None) -> int:
        """Slots of `model` that `org` (or its `user`) holds."""
        tally = self._orgs.get(model) if user is None else self._users.get((model, org))
        return 0 if tally is None else tally.of(org if user is None else user)

    def victim(self, waiting: GenerationRequest) -> str | None:
        """The running request to preempt so that `waiting` (which found no free slot of
        its model) gets one: the newest of the tenant over its share, or None."""
        model, org, user = waiting.model, waiting.org_id, waiting.user_id
        rank = _RANK[waiting.tier]
        orgs = self._orgs.get(model)
        if not orgs:
            return None
        top_org, top = orgs.top()
        if top_org != org:
            if top < orgs.of(org) + 2:
                return None
            return self._newest_of(model, top_org, None, rank)
        users = self._users[(model, org)]
        top_user, top = users.top()
        if top_user == user or top < users.of(user) + 2:
            return None
        return self._newest_of(model, org, top_user, rank)

    def _newest_of(self, model: str, org: str, user: str | None, rank: int) -> str | None:
        """The newest request of `org` (of its `user`; else of its user with the most
        slots) on `model` in a tier ranked `rank` or lower."""
        if user is None:
            user, _ = self._users[(model, org)].top()
        requests = self._newest[(model, org, user)]
        return next((r for r in reversed(requests) if requests[r] >= rank), None)


class Tally:
    """Slots per name (an org, or an org's users), and the name holding the most: each
    name sits in the bucket of its count, so a change of one count by one, and the
    top, are O(1) however many names there are."""

    __slots__ = ("_count", "_names", "_top")

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._names: dict[int, dict[str, None]] = {}  # count -> the names holding it
        self._top = 0

    def __bool__(self) -> bool:
        return bool(self._count)

    def of(self, name: str) -> int:
        return self._count.get(name, 0)

    def top(self) -> tuple[str, int]:
        """A name holding the most, and its count (the tally is not empty)."""
        return next(iter(self._names[self._top])), self._top

    def give(self, name: str) -> None:
        count = self._count.get(name, 0)
        if count:
            self._leave(name, count)
        self._join(name, count + 1)
        self._top = max(self._top, count + 1)

    def take(self, name: str) -> None:
        count = self._count[name]
        emptied = self._leave(name, count)
        if count > 1:
            self._join(name, count - 1)
        else:
            del self._count[name]
        if emptied and count == self._top:
            self._top = count - 1 if self._count else 0  # the name is at count - 1 now

    def _join(self, name: str, count: int) -> None:
        self._count[name] = count
        names = self._names.get(count)
        if names is None:
            names = self._names[count] = {}
        names[name] = None

    def _leave(self, name: str, count: int) -> bool:
        """Out of its bucket; whether that emptied it."""
        names = self._names[count]
        del names[name]
        if names:
            return False
        del self._names[count]
        return True


def _give(tallies: dict[K, Tally], key: K, name: str) -> None:
    tally = tallies.get(key)
    if tally is None:
        tally = tallies[key] = Tally()
    tally.give(name)


def _take(tallies: dict[K, Tally], key: K, name: str) -> None:
    tally = tallies[key]
    tally.take(name)
    if not tally:
        del tallies[key]

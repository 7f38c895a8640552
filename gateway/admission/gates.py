"""Admission of a generation request: a row of cheap gates, then the input check.

Every gate has one interface (`Gate`): it judges an `Ask` (who asks, for which model,
for about how many tokens) and lets it pass, with headers for the response, or
refuses it by raising. `Admission.admit` runs the gates in order before anything
expensive (store polling, the prompt's build, the classifiers):

0. the bus (`BusGate`): refused at once while it takes no records, not left to wait;
1. shedding (`gateway.admission.shedding`): in memory, the scheduler's last word;
2. token budgets (`gateway.admission.quotas`): a ledger read that charges nothing,
   so a request refused for its budget is not charged to the rate limits;
3. concurrent generations (`gateway.admission.concurrency`): a lease per generation,
   taken at once and given back if a later gate refuses, so a request refused for
   running too many is not charged to the rate limits either;
4. rate limits (`gateway.admission.rate_limits`): charged at once, from the estimate
   (an upload, `Ask.files`, also against the files per minute).

The leases an admitted ask holds (`Ask.leases`) go to its generations as they start;
those none claims are released when the HTTP request ends (`gateway.admission.leases`).

Once the prompt is built, `settle` charges what the request costs beyond its
estimate, and `check_input` runs the input classifiers (`gateway.admission.input_check`).
A request refused after the gates (its prompt does not fit, its input is blocked, it
is too large for the bus) stays charged: it cost the work that refused it.

Each refusal is counted by tier and reason; a 429 also carries the caller's standing
with the other gates (the rate-limit headers of a budget refusal). The checks of one
request's fields against the served models and sizes (`gateway.admission.limits`) are
pure and run earlier, where each API translates its request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from conversations.store import ApiKey
from gateway.admission.headers import note_response_headers
from gateway.admission.input_check import check_input
from gateway.admission.leases import Leases, hold_until_request_ends
from gateway.errors import ApiError
from gateway.pipeline import Pipeline
from gateway.refusals import Refused, Unavailable
from moderation.policy import SafetyPolicy
from ops.metrics import admission_rejected
from schemas.topics import Tier

NO_HEADERS: Mapping[str, str] = {}


@dataclass(frozen=True, slots=True)
class Ask:
    """What a gate judges: `owner` asks `model` for a request of about `tokens` tokens
    (the prompt's estimate plus its most output) that runs `generations` at once (a
    completion's `n` choices; 0: none, an embedding or an upload), uploading `files`
    files with it (`POST /v1/files`: one, whose text `model`, the embedding model,
    embeds); the leases the gates took for its generations (`leases`), until each
    generation claims its own."""

    owner: ApiKey
    model: str
    tokens: int
    generations: int = 1
    files: int = 0
    leases: Leases = field(default_factory=Leases, compare=False)


class Gate:
    """One check of admission. `check` is the gate; `settle` and `standing` are for the
    gates that keep counts."""

    async def check(self, ask: Ask) -> Mapping[str, str]:
        """Return the headers for the response if `ask` may pass; raise `ApiError` or
        `Refused` if not."""
        raise NotImplementedError

    async def settle(self, ask: Ask, actual: int) -> None:
        """The admitted `ask` costs `actual` tokens, now that its prompt is built."""

    async def standing(self, owner: ApiKey) -> Mapping[str, str]:
        """Headers saying where `owner` stands with this gate, charging nothing."""
        return NO_HEADERS


BUS_RETRY_AFTER_S = 5
"""About how long an embedded broker takes to come back."""


class CarriesRequests(Protocol):
    def unreachable(self) -> bool: ...


class BusGate(Gate):
    """Refuses `pipeline_unavailable` (503, Retry-After) while the bus takes no records:
    its broker restarting, or this gateway's heartbeats unacknowledged lately."""

    def __init__(self, bus: CarriesRequests) -> None:
        self.bus = bus

    async def check(self, ask: Ask) -> Mapping[str, str]:
        if self.bus.unreachable():
            raise Unavailable(
                "pipeline_unavailable",
                "the pipeline's broker is not reachable now; nothing was queued",
                retry_after_s=BUS_RETRY_AFTER_S,
            )
        return NO_HEADERS


class ShedsTiers(Protocol):
    def overloaded(self, tier: Tier, model: str) -> float | None: ...


class SheddingGate(Gate):
    """Refuses `overloaded` (503, Retry-After) while the scheduler deciding for the
    model sheds the caller's tier."""

    def __init__(self, schedulers: ShedsTiers) -> None:
        self.schedulers = schedulers

    async def check(self, ask: Ask) -> Mapping[str, str]:
        tier = ask.owner.tier
        retry_after = self.schedulers.overloaded(tier, ask.model)
        if retry_after is None:
            return NO_HEADERS
        raise Unavailable(
            "overloaded",
            f"the {tier} tier is overloaded; retry in {retry_after:.0f} s",
            retry_after_s=math.ceil(retry_after),
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """The gates a request passes, in order; the input classifiers (None: no input
    check) and the pipeline their decisions are reported on."""

    gates: Sequence[Gate]
    pipeline: Pipeline
    safety: SafetyPolicy | None = None

    async def admit(
        self, owner: ApiKey, tokens: int, model: str, generations: int = 1, *, files: int = 0
    ) -> Ask:
        """The admitted ask of `owner` for `model` (charged `tokens`, running
        `generations`, uploading `files`); the first gate that refuses it raises, with its
        reason counted, and the leases the gates before it took are given back."""
        ask = Ask(owner, model, tokens, generations, files)
        try:
            for gate in self.gates:
                try:
                    note_response_headers(await gate.check(ask))
                except (ApiError, Refused) as refused:
                    admission_rejected(owner.tier, refused.code)
                    if isinstance(refused, ApiError) and refused.status_code == 429:
                        refused.headers = {
                            **await self._standing(owner, besides=gate),
                            **(refused.headers or {}),
                        }
                    raise
        except BaseException:
            await ask.leases.release()
            raise
        hold_until_request_ends(ask.leases)
        return ask

    async def settle(self, ask: Ask, actual: int) -> None:
        """Charge what the admitted `ask` costs (`actual` tokens) beyond its estimate."""
        for gate in self.gates:
            await gate.settle(ask, actual)

    async def check_input(self, owner: ApiKey, model: str, texts: Sequence[str]) -> None:
        """Refuse `content_blocked` an input the classifiers of `owner`'s tier block."""
        if self.safety is not None:
            await check_input(self.safety, self.pipeline, owner, model, texts)

    async def _standing(self, owner: ApiKey, *, besides: Gate) -> dict[str, str]:
        headers: dict[str, str] = {}
        for gate in self.gates:
            if gate is not besides:
                headers.update(await gate.standing(owner))
        return headers

"""Concurrent generations per API key: a key runs at most its limit at once, streamed or
not, queued or running; one more is refused 429 `too_many_concurrent_requests` with
`Retry-After`.

The limit is the key's own (`chatpipe keys create --max-concurrent-requests`), else its
org's (`chatpipe orgs set ORG --max-concurrent-requests`), else its tier's
(`CHATPIPE_MAX_CONCURRENT_REQUESTS`); a tier not named there has none. A request takes
one lease per generation it runs (a completion's `n` choices take `n`), all or none,
when it is admitted, and each is released when its generation ends
(`gateway.admission.leases`).

Leases are kept where the rate limits are (`rate_limit_storage`,
`gateway.admission.lease_storage`): in this process with `memory://`, in one Redis
shared by every gateway with `redis://`. Each lives `lease_ttl_s` past its last
renewal; the gateway renews the leases whose streams were read since the last round,
every third of that, so a gateway that dies, or a stream that is never closed, frees
its leases within `lease_ttl_s`. A storage that cannot be reached lets requests
through without a lease, as the rate limits do: an outage of the shared Redis must
not stop chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping

from conversations.store import ApiKey, OrgSettings
from gateway.admission.gates import NO_HEADERS, Ask, Gate
from gateway.admission.lease_storage import LeaseStorage, LeaseStorageError, lease_storage_from_uri
from gateway.admission.leases import Lease
from gateway.config import ConcurrencyConfig
from gateway.errors import ApiError
from gateway.streaming.generation import SEND_TIMEOUT_S
from ledger.charges import Account

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
"""What a refused request is told to wait: a generation of the key's may end any time."""

OrgLimits = Callable[[str], Awaitable[OrgSettings]]
"""An org's settings, by org id (the store's `get_org_settings`)."""


def lease_ttl_s(stall_s: float) -> float:
    """How long a lease outlives the last read of its stream: twice the longest a live
    stream goes unread (its stall timeout, or a slow client's send timeout)."""
    return 2 * max(stall_s, SEND_TIMEOUT_S)


def lease_key(owner: ApiKey) -> str:
    """Whose leases a request's are: its API key's (a key not from a store: its user's)."""
    return owner.key_id or Account.user(owner.org_id, owner.user_id).account_id


def too_many_concurrent(limit: int, held: int, wanted: int) -> ApiError:
    """429: the key runs its limit already (Retry-After), or the request alone needs more
    generations at once than the limit (waiting cannot help: no Retry-After)."""
    if wanted > limit:
        return ApiError(
            429,
            "too_many_concurrent_requests",
            f"this request runs {wanted} generations at once and this API key may run "
            f"{limit}; ask for fewer choices",
        )
    return ApiError(
        429,
        "too_many_concurrent_requests",
        f"this API key runs {held} of its {limit} concurrent requests; retry when one of them ends",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


class ConcurrencyGate(Gate):
    """Takes an admitted request's leases, or refuses it whole; renews the leases this
    gateway holds while their streams are read."""

    def __init__(
        self,
        config: ConcurrencyConfig,
        storage: LeaseStorage,
        orgs: OrgLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.storage = storage
        self._orgs = orgs
        self._clock = clock
        self._live: dict[str, Lease] = {}
        """The leases this gateway holds, by id."""
        self._renewed_at: dict[str, float] = {}
        self._renewing: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, config: ConcurrencyConfig, orgs: OrgLimits | None) -> ConcurrencyGate:
        return cls(config, lease_storage_from_uri(config.storage), orgs)

    @property
    def held(self) -> int:
        """How many leases this gateway holds now."""
        return len(self._live)

    async def limit(self, owner: ApiKey) -> int | None:
        """The generations `owner` may run at once: its key's limit, its org's, its
        tier's; None: no limit."""
        if owner.max_concurrent_requests is not None:
            return owner.max_concurrent_requests
        if self._orgs is not None:
            try:
                org = await self._orgs(owner.org_id)
            except Exception:
                log.warning("could not read org %s's settings; its tier's limit holds",
                            owner.org_id, exc_info=True)  # fmt: skip
            else:
                if org.max_concurrent_requests is not None:
                    return org.max_concurrent_requests
        return self.config.per_tier.get(owner.tier)

    async def check(self, ask: Ask) -> Mapping[str, str]:
        if ask.generations <= 0:
            return NO_HEADERS
        limit = await self.limit(ask.owner)
        if limit is None:
            return NO_HEADERS
        key = lease_key(ask.owner)
        ids = [uuid.uuid4().hex for _ in range(ask.generations)]
        try:
            taken = await self.storage.take(key, ids, limit, self.config.lease_ttl_s)
        except LeaseStorageError as exc:
            log.warning("lease storage unavailable, admitting without a concurrency limit: %s",
                        exc)  # fmt: skip
            return NO_HEADERS
        if not taken.taken:
            raise too_many_concurrent(limit, taken.held, ask.generations)
        ask.leases.add([self._lease(key, lease_id) for lease_id in ids])
        return NO_HEADERS

    async def adopt(self, owner: ApiKey) -> Lease | None:
        """A lease for a generation that runs already and now streams here (a resumed
        native stream): taken whatever the key holds, since the generation runs anyway;
        None when `owner` has no limit or the storage cannot be reached."""
        if await self.limit(owner) is None:
            return None
        key, lease_id = lease_key(owner), uuid.uuid4().hex
        try:
            await self.storage.take(key, [lease_id], None, self.config.lease_ttl_s)
        except LeaseStorageError as exc:
            log.warning("lease storage unavailable, a resumed stream holds no lease: %s", exc)
            return None
        lease = self._lease(key, lease_id)
        lease.claimed = True
        return lease

    async def aclose(self) -> None:
        """Stop renewing (the gateway stops); the leases still held expire in storage."""
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing
            self._renewing = None
        closing = getattr(self.storage, "aclose", None)
        if closing is not None:
            await closing()

    # --- the leases this gateway holds ------------------------------------------------

    def _lease(self, key: str, lease_id: str) -> Lease:
        lease = Lease(key, lease_id, self._free)
        self._live[lease_id] = lease
        self._renewed_at[lease_id] = self._clock()
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew_while_held(), name="lease-renewal")
        return lease

    def _forget(self, lease: Lease) -> None:
        self._live.pop(lease.lease_id, None)
        self._renewed_at.pop(lease.lease_id, None)
        renewing = self._renewing
        if not self._live and renewing is not None and renewing is not asyncio.current_task():
            renewing.cancel()  # nothing left to renew; the next lease starts it again
            self._renewing = None

    async def _free(self, lease: Lease) -> None:
        self._forget(lease)
        try:
            await self.storage.free(lease.key, [lease.lease_id])
        except LeaseStorageError as exc:
            log.warning("could not release lease %s (it expires by itself): %s",
                        lease.lease_id, exc)  # fmt: skip

    async def _renew_while_held(self) -> None:
        interval = self.config.lease_ttl_s / 3
        while self._live:
            await asyncio.sleep(interval)
            await self.renew()

    async def renew(self) -> None:
        """One round: renew the leases read since the last round (a new lease counts as
        read); forget those that have gone unread for a whole TTL, which storage has
        dropped."""
        now, ttl = self._clock(), self.config.lease_ttl_s
        due: dict[str, list[str]] = {}
        for lease in list(self._live.values()):
            if lease.active:
                lease.active = False
                due.setdefault(lease.key, []).append(lease.lease_id)
                self._renewed_at[lease.lease_id] = now
            elif now - self._renewed_at[lease.lease_id] >= ttl:
                log.warning("lease %s: its stream was not read for %.0f s; it expired",
                            lease.lease_id, ttl)  # fmt: skip
                self._forget(lease)
        try:
            await self.storage.renew(due, ttl)
        except LeaseStorageError as exc:
            log.warning("could not renew %d leases: %s", sum(map(len, due.values())), exc)

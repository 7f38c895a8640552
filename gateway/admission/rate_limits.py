"""Requests, tokens and uploaded files per minute, per user and per org, on `limits`'
async API.

Strategy: sliding window counter. Each limit keeps two counters (this window
and the last) and weighs the last by how much of it still overlaps the
trailing minute. Unlike a fixed window it allows no double burst across a
window edge; unlike a moving window (exact, but one stored entry per unit of
cost) it costs two counters per limit, which matters for token limits where one
request costs thousands. In Redis every read and charge is one Lua call, so
gateway replicas sharing `rate_limit_storage` share the limits.

A request costs 1 against the request limits and, against the token limits, an
estimate made before it runs: prompt characters / 4 + max_tokens. The gateway
charges before any expensive work: an OpenAI request's prompt is all in
the request; a native turn is charged for its new message first and, once its
prompt is built from the history, for the rest (`charge_tokens`, never refused).

An upload (`POST /v1/files`) also costs 1 against the files limits, and 0 tokens when
it is admitted: what it makes the embedding model read (its chunks' characters / 4)
is charged once its text is read, before it is embedded, as the rest of a native
turn is. The files limits are read only for an upload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from math import ceil, floor, inf
from typing import Literal, cast

from limits import RateLimitItemPerMinute
from limits.aio.storage import Storage
from limits.aio.storage.base import SlidingWindowCounterSupport
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from limits.errors import StorageError
from limits.storage import storage_from_string

from conversations.store import ApiKey
from gateway.admission.gates import Ask, Gate
from gateway.config import RateLimitConfig
from gateway.errors import ApiError
from ledger.charges import Account
from schemas.events import ChatMessage

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
UNBOUNDED = 1 << 62
"""The limit a charge that must not be refused is made under."""
Quantity = Literal["requests", "tokens", "files"]
QUANTITIES: tuple[Quantity, ...] = ("requests", "tokens", "files")


def admission_tokens(messages: Sequence[ChatMessage], max_tokens: int) -> int:
    """What a request counts against the token limits: the prompt estimated at
    4 characters a token (no tokenizer in the gateway), plus all it may generate."""
    return text_tokens([m.content for m in messages], max_tokens)


def text_tokens(texts: Iterable[str], max_tokens: int) -> int:
    """`admission_tokens` of a prompt made of `texts`."""
    return ceil(sum(len(text) for text in texts) / CHARS_PER_TOKEN) + max_tokens


@dataclass(frozen=True, slots=True)
class WindowCount:
    """One limit's sliding window as its storage reports it; times in seconds from now.

    `previous_ttl`: until the previous window stops weighing (the current window's
    end). `current_ttl`: until the current count stops weighing (one window later).
    """

    limit: int
    expiry: float
    previous_count: int = 0
    previous_ttl: float = 0.0
    current_count: int = 0
    current_ttl: float = 0.0

    @property
    def used(self) -> int:
        return floor(self.previous_count * self.previous_ttl / self.expiry) + self.current_count

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    def fits(self, cost: int) -> bool:
        return self.used + cost <= self.limit

    def wait_for(self, cost: int) -> float:
        """Seconds until `cost` fits: 0 if it does now, inf if it never can."""
        if cost > self.limit:
            return inf
        if self.fits(cost):
            return 0.0
        if self.current_count + cost <= self.limit:
            room = self.limit - cost - self.current_count
            return self._decayed(self.previous_count, self.previous_ttl, room)
        # Only once this window is the previous one does its count start to decay.
        window_end = max(0.0, self.current_ttl - self.expiry)
        return window_end + self._decayed(self.current_count, self.expiry, self.limit - cost)

    def _decayed(self, count: int, ttl: float, room: int) -> float:
        """Time until floor(count * (ttl - t) / expiry) <= room."""
        return max(0.0, ttl - (room + 1) * self.expiry / count)

    @property
    def reset_after(self) -> float:
        """Seconds until nothing counts any more (OpenAI's x-ratelimit-reset-*)."""
        if self.current_count:
            return self.current_ttl
        return self.previous_ttl if self.previous_count else 0.0

    def charged(self, cost: int) -> WindowCount:
        # A counter created by this charge lives two windows (limits' own rule).
        ttl = self.current_ttl if self.current_count else max(self.current_ttl, 2 * self.expiry)
        return replace(self, current_count=self.current_count + cost, current_ttl=ttl)


@dataclass(frozen=True, slots=True)
class Limit:
    """One of the limits on a request, named after the setting that sets it."""

    name: str
    quantity: Quantity
    per_minute: int
    identifiers: tuple[str, ...]

    @property
    def item(self) -> RateLimitItemPerMinute:
        return RateLimitItemPerMinute(self.per_minute, namespace="chatpipe")


def limits_for(config: RateLimitConfig, owner: ApiKey, *, files: bool = False) -> list[Limit]:
    """The four limits on every request, and with `files` the two on uploads."""
    # A user is one of an org's (the same id in two orgs is two users): one account id.
    user = ("user", Account.user(owner.org_id, owner.user_id).account_id)
    org = ("org", owner.org_id)
    uploads = [
        Limit("user_files_per_minute", "files", config.user_files_per_minute,
              ("files", *user)),
        Limit("org_files_per_minute", "files", config.org_files_per_minute, ("files", *org)),
    ] if files else []  # fmt: skip
    return [*uploads,
        Limit("user_requests_per_minute", "requests", config.user_requests_per_minute,
              ("requests", *user)),
        Limit("org_requests_per_minute", "requests", config.org_requests_per_minute,
              ("requests", *org)),
        Limit("user_tokens_per_minute", "tokens", config.user_tokens_per_minute,
              ("tokens", *user)),
        Limit("org_tokens_per_minute", "tokens", config.org_tokens_per_minute,
              ("tokens", *org)),
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Check:
    """A limit, its window now, and what this request would add to it."""

    limit: Limit
    window: WindowCount
    cost: int


def refusal(checks: Sequence[Check]) -> Check | None:
    """The limit that holds the request back longest, or None when all have room."""
    short = [check for check in checks if not check.window.fits(check.cost)]
    return max(short, key=lambda c: c.window.wait_for(c.cost), default=None)


def ratelimit_headers(checks: Sequence[Check]) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers, per quantity from the tighter of user and org
    (`x-ratelimit-*-files` only where the files limits were checked)."""
    headers = {}
    for quantity in QUANTITIES:
        windows = [c.window for c in checks if c.limit.quantity == quantity]
        if not windows:
            continue
        tightest = min(windows, key=lambda w: w.remaining)
        headers[f"x-ratelimit-limit-{quantity}"] = str(tightest.limit)
        headers[f"x-ratelimit-remaining-{quantity}"] = str(tightest.remaining)
        headers[f"x-ratelimit-reset-{quantity}"] = openai_duration(tightest.reset_after)
    return headers


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI writes it in x-ratelimit-reset-*: 20ms, 1s, 6m0s, 1h2m3s."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{ceil(seconds * 1000)}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{int(minutes)}m{text}"
    return f"{int(hours)}h{text}" if hours else text


def rate_limited(check: Check, headers: dict[str, str]) -> ApiError:
    """429 naming the limit; Retry-After is when the request's cost fits again."""
    limit, wait = check.limit, check.window.wait_for(check.cost)
    if wait == inf:
        # Waiting cannot help: say so rather than send a Retry-After that lies.
        message = (
            f"{limit.name} is {limit.per_minute} and this request needs {check.cost}"
            " on its own; send a shorter prompt or a smaller max_tokens"
        )
        return ApiError(429, "rate_limited", message, headers=headers)
    retry_after = max(1, ceil(wait))
    message = (
        f"{limit.name} reached: {check.window.used} of {limit.per_minute} used in the"
        f" last minute, this request needs {check.cost}; retry in {retry_after} s"
    )
    return ApiError(
        429, "rate_limited", message, headers={"Retry-After": str(retry_after), **headers}
    )


def per_process(uri: str) -> str | None:
    """Why limits kept at `uri` are not shared by several gateways (None: they are): a
    user would get each gateway's limits in full."""
    if uri.removeprefix("async+").startswith("memory://"):
        return (
            f"rate limits and concurrency leases in {uri} are this gateway's own: with N "
            "gateways a user gets N times them; set CHATPIPE_RATE_LIMIT_STORAGE="
            "redis://host:6379, shared"
        )
    return None


def storage_from_uri(uri: str) -> Storage:
    """Async `limits` storage for a `rate_limit_storage` URI (memory://, redis://host:port)."""
    uri = uri if uri.startswith("async+") else f"async+{uri}"
    # redis-py is installed (limits[redis]); limits' default async Redis client is coredis.
    options = {"implementation": "redispy"} if uri.startswith("async+redis") else {}
    storage = storage_from_string(uri, wrap_exceptions=True, **options)
    assert isinstance(storage, Storage)
    return storage


class RateLimiter(Gate):
    """Charges each admitted request to its owner's four limits (an upload to the two
    files limits too), or refuses it whole.

    Every limit is read first and the request charged only when all have room,
    so a refused request costs nothing. Two gateways may both read room and
    both charge; the storage refuses the charge that does not fit, and that
    request is refused too (the limits it was already charged keep the charge).
    A storage that cannot be reached lets requests through: an outage of the
    shared Redis must not stop chat.
    """

    def __init__(self, config: RateLimitConfig, storage: Storage) -> None:
        self.config = config
        self.storage = storage
        self.strategy = SlidingWindowCounterRateLimiter(storage)

    @classmethod
    def from_config(cls, config: RateLimitConfig) -> RateLimiter:
        return cls(config, storage_from_uri(config.storage))

    async def check(self, ask: Ask) -> Mapping[str, str]:
        return await self.acquire(ask.owner, ask.tokens, files=ask.files)

    async def settle(self, ask: Ask, actual: int) -> None:
        await self.charge_tokens(ask.owner, actual - ask.tokens)

    async def standing(self, owner: ApiKey) -> Mapping[str, str]:
        return await self.headers(owner)

    async def acquire(self, owner: ApiKey, tokens: int, *, files: int = 0) -> dict[str, str]:
        """Charge one request of `tokens` uploading `files`; its rate-limit headers. 429
        when over a limit."""
        try:
            checks = await self._checks(owner, tokens, files)
            refused = refusal(checks)
            if refused is not None:
                raise rate_limited(refused, ratelimit_headers(checks))
            for check in checks:
                if not await self.strategy.hit(
                    check.limit.item, *check.limit.identifiers, cost=check.cost
                ):
                    raced = replace(check, window=await self._window(check.limit))
                    raise rate_limited(raced, ratelimit_headers(checks))
        except StorageError as exc:
            log.warning("rate limit storage unavailable, admitting without limits: %s", exc)
            return {}
        return ratelimit_headers([replace(c, window=c.window.charged(c.cost)) for c in checks])

    async def charge_tokens(self, owner: ApiKey, tokens: int) -> None:
        """Add `tokens` to the owner's token limits whatever room they have: the rest of
        an admitted request's cost, known only once its prompt is built. It may take a
        window past its limit; the next request then waits for it."""
        if tokens <= 0:
            return
        storage = cast(SlidingWindowCounterSupport, self.storage)
        try:
            for limit in limits_for(self.config, owner):
                if limit.quantity == "tokens":
                    item = limit.item
                    await storage.acquire_sliding_window_entry(
                        item.key_for(*limit.identifiers), UNBOUNDED, item.get_expiry(), tokens
                    )
        except StorageError as exc:
            log.warning("rate limit storage unavailable, tokens not charged: %s", exc)

    async def headers(self, owner: ApiKey) -> dict[str, str]:
        """The owner's rate-limit headers now, charging nothing."""
        try:
            return ratelimit_headers(await self._checks(owner, 0))
        except StorageError:
            return {}

    async def _checks(self, owner: ApiKey, tokens: int, files: int = 0) -> list[Check]:
        limits = limits_for(self.config, owner, files=files > 0)
        windows = await asyncio.gather(*(self._window(limit) for limit in limits))
        costs = {"requests": 1, "tokens": tokens, "files": files}
        return [
            Check(limit, window, costs[limit.quantity])
            for limit, window in zip(limits, windows, strict=True)
        ]

    async def _window(self, limit: Limit) -> WindowCount:
        item = limit.item
        counts = await cast(SlidingWindowCounterSupport, self.storage).get_sliding_window(
            item.key_for(*limit.identifiers), item.get_expiry()
        )
        return WindowCount(limit.per_minute, item.get_expiry(), *counts)

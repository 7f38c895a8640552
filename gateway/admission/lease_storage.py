"""Where the leases that count an API key's concurrent generations are kept:
`MemoryLeases` in this process (`memory://`), `RedisLeases` in one Redis that every
gateway shares (`redis://host:port`): the URI of the rate limits' storage.

A key's leases are a set of ids, each with an expiry. A lease not renewed by its expiry
no longer counts, so the leases of a gateway that died free themselves. Taking counts
the live leases and adds the new ones in one step, only if they all fit: in Redis one
Lua call on the server's clock, so two gateways never both take the last lease and
their own clocks do not matter. A key's Redis entry expires with its last lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import redis.asyncio as redis
from redis.exceptions import RedisError

KEY_PREFIX = "chatpipe:leases:"
REDIS_TIMEOUT_S = 2.0
"""A Redis that does not answer within this long is treated as unreachable."""


class LeaseStorageError(Exception):
    """The storage could not be reached or did not answer."""


@dataclass(frozen=True, slots=True)
class Taken:
    """What taking leases did: `taken` all of them or none; `held`, the key's live
    leases now (with the new ones when taken)."""

    taken: bool
    held: int


class LeaseStorage(Protocol):
    async def take(self, key: str, leases: Sequence[str], limit: int | None, ttl_s: float) -> Taken:
        """Add `leases` to `key`'s, each live for `ttl_s`, if the key's live leases and
        these are at most `limit` (None: no limit); else add none."""

    async def renew(self, leases: Mapping[str, Sequence[str]], ttl_s: float) -> None:
        """Make each of the leases (by key) live for `ttl_s` from now; one that has
        expired stays gone."""

    async def free(self, key: str, leases: Sequence[str]) -> None:
        """Drop `leases` from `key`'s."""

    async def held(self, key: str) -> int:
        """How many live leases `key` holds."""


class MemoryLeases:
    """The leases of this process only, on `clock` (seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keys: dict[str, dict[str, float]] = {}

    def _live(self, key: str) -> dict[str, float]:
        now = self._clock()
        leases = self._keys.get(key, {})
        live = {lease: expiry for lease, expiry in leases.items() if expiry > now}
        if live:
            self._keys[key] = live
        else:
            self._keys.pop(key, None)
        return live

    async def take(self, key: str, leases: Sequence[str], limit: int | None, ttl_s: float) -> Taken:
        live = self._live(key)
        if limit is not None and len(live) + len(leases) > limit:
            return Taken(False, len(live))
        expiry = self._clock() + ttl_s
        live.update(dict.fromkeys(leases, expiry))
        self._keys[key] = live
        return Taken(True, len(live))

    async def renew(self, leases: Mapping[str, Sequence[str]], ttl_s: float) -> None:
        expiry = self._clock() + ttl_s
        for key, ids in leases.items():
            live = self._live(key)
            for lease in ids:
                if lease in live:
                    live[lease] = expiry

    async def free(self, key: str, leases: Sequence[str]) -> None:
        live = self._live(key)
        for lease in leases:
            live.pop(lease, None)
        if not live:
            self._keys.pop(key, None)

    async def held(self, key: str) -> int:
        return len(self._live(key))


_NOW_MS = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
"""

TAKE = (
    _NOW_MS
    + """
local held = redis.call('ZCARD', KEYS[1])
local limit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local wanted = #ARGV - 2
if limit >= 0 and held + wanted > limit then
  return {0, held}
end
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, held + wanted}
"""
)
"""KEYS: the key's leases (a sorted set, scored by expiry in ms); ARGV: the limit (-1:
none), the TTL in ms, the new leases. Returns {taken, held}."""

RENEW = (
    _NOW_MS
    + """
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i])
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 0
"""
)
"""KEYS: the key's leases; ARGV: the TTL in ms, the leases to renew (only those still
there: `XX`)."""

HELD = _NOW_MS + "return redis.call('ZCARD', KEYS[1])"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisLeases:
    """The leases of every gateway on one Redis (6 or later)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._take = client.register_script(TAKE)
        self._renew = client.register_script(RENEW)
        self._held = client.register_script(HELD)

    @classmethod
    def from_url(cls, url: str) -> RedisLeases:
        return cls(
            redis.Redis.from_url(
                url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
            )
        )

    async def take(self, key: str, leases: Sequence[str], limit: int | None, ttl_s: float) -> Taken:
        args: list[int | str] = [-1 if limit is None else limit, _ms(ttl_s), *leases]
        try:
            taken, held = cast(list[int], await self._take(keys=[KEY_PREFIX + key], args=args))
        except (RedisError, OSError) as exc:
            raise LeaseStorageError(str(exc)) from exc
        return Taken(bool(taken), int(held))

    async def renew(self, leases: Mapping[str, Sequence[str]], ttl_s: float) -> None:
        if not leases:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key, ids in leases.items():
                    await self._renew(keys=[KEY_PREFIX + key], args=[_ms(ttl_s), *ids],
                                      client=pipe)  # fmt: skip
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise LeaseStorageError(str(exc)) from exc

    async def free(self, key: str, leases: Sequence[str]) -> None:
        try:
            await self._client.zrem(KEY_PREFIX + key, *leases)
        except (RedisError, OSError) as exc:
            raise LeaseStorageError(str(exc)) from exc

    async def held(self, key: str) -> int:
        try:
            return int(cast(int, await self._held(keys=[KEY_PREFIX + key])))
        except (RedisError, OSError) as exc:
            raise LeaseStorageError(str(exc)) from exc

    async def aclose(self) -> None:
        await self._client.aclose()


def lease_storage_from_uri(uri: str) -> LeaseStorage:
    """The lease storage at `uri` (the rate limits' `rate_limit_storage`): memory://, or
    redis://, rediss:// or unix:// for one Redis."""
    uri = uri.removeprefix("async+")
    if uri.startswith("memory://"):
        return MemoryLeases()
    if uri.startswith(("redis://", "rediss://", "unix://")):
        return RedisLeases.from_url(uri)
    raise ValueError(
        f"concurrent requests are counted in memory:// or one Redis (redis://host:6379), not {uri}"
    )

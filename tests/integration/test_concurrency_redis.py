"""Concurrent generations per key counted in one Redis that several gateways share.

Runs when a `redis-server` binary is installed (`apt-get install redis-server`);
skipped otherwise. Each gate here stands for one gateway replica.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as redis

from bus.broker import free_port
from conversations.store import ApiKey
from gateway.admission.concurrency import ConcurrencyGate, lease_key
from gateway.admission.gates import Ask
from gateway.admission.lease_storage import KEY_PREFIX
from gateway.config import ConcurrencyConfig
from gateway.errors import ApiError
from schemas.topics import Tier
from tests.support.redis import REDIS_SERVER

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="no redis-server binary")


def gateway(storage: str, ttl_s: float = 60.0) -> ConcurrencyGate:
    return ConcurrencyGate.from_config(ConcurrencyConfig({Tier.PRO: 3}, storage, ttl_s), None)


def new_owner() -> ApiKey:
    return ApiKey("ann", "acme", Tier.PRO, key_id=uuid.uuid4().hex[:12])


async def take(gate: ConcurrencyGate, owner: ApiKey, generations: int = 1) -> Ask:
    ask = Ask(owner, "tiny-random", 10, generations)
    await gate.check(ask)
    return ask


async def test_two_gateways_share_one_keys_limit(redis_url: str) -> None:
    one, two = gateway(redis_url), gateway(redis_url)
    owner = new_owner()
    first = await take(one, owner, 2)
    await take(two, owner)
    for gate in (one, two):
        with pytest.raises(ApiError) as refused:
            await take(gate, owner)
        assert refused.value.code == "too_many_concurrent_requests"
        assert refused.value.headers == {"Retry-After": "1"}
    assert len((await take(two, new_owner(), 3)).leases) == 3, "another key counts apart"
    await first.leases.release()
    assert await two.storage.held(lease_key(owner)) == 1
    assert len((await take(two, owner, 2)).leases) == 2
    for gate in (one, two):
        await gate.aclose()


async def test_concurrent_gateways_never_take_more_than_the_limit(redis_url: str) -> None:
    gates = [gateway(redis_url) for _ in range(4)]
    owner = new_owner()

    async def try_once(gate: ConcurrencyGate) -> bool:
        try:
            await take(gate, owner)
            return True
        except ApiError:
            return False

    admitted = await asyncio.gather(*(try_once(gates[i % 4]) for i in range(20)))
    assert sum(admitted) == 3
    assert await gates[0].storage.held(lease_key(owner)) == 3
    for gate in gates:
        await gate.aclose()


async def test_a_lease_renewed_while_read_lives_on_and_a_dead_gateways_expire(
    redis_url: str,
) -> None:
    ttl_s = 0.6
    alive, dead, other = (gateway(redis_url, ttl_s) for _ in range(3))
    owner = new_owner()
    read = (await take(alive, owner)).leases.claim()
    assert read is not None
    await take(dead, owner, 2)
    await dead.aclose()  # it stops renewing, as a killed gateway does
    for _ in range(5):  # past two TTLs, read all along
        read.touch()
        await asyncio.sleep(ttl_s / 3)
        await alive.renew()
    assert await other.storage.held(lease_key(owner)) == 1, "only the renewed lease is left"
    assert len((await take(other, owner, 2)).leases) == 2
    await read.release()
    client = redis.Redis.from_url(redis_url)
    ttl_ms = await client.pttl(KEY_PREFIX + lease_key(owner))
    assert 0 < ttl_ms <= ttl_s * 1000, "the key's entry expires with its last lease"
    await asyncio.sleep(ttl_s + 0.2)
    assert await client.exists(KEY_PREFIX + lease_key(owner)) == 0
    await client.aclose()
    for gate in (alive, other):
        await gate.aclose()


async def test_an_unreachable_redis_admits_without_a_lease() -> None:
    gate = gateway(f"redis://127.0.0.1:{free_port()}")
    owner = new_owner()
    asks = [await take(gate, owner) for _ in range(5)]
    assert [len(ask.leases) for ask in asks] == [0] * 5
    await gate.aclose()

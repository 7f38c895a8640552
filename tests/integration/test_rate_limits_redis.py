"""Rate limits shared by several gateways through one Redis.

Runs when a `redis-server` binary is installed (`apt-get install redis-server`);
skipped otherwise. Each limiter here stands for one gateway replica.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bus.broker import free_port
from chatpipe.settings import Settings
from chatpipe.wiring import gateway_config
from conversations.store import ApiKey
from gateway.admission.rate_limits import RateLimiter
from gateway.errors import ApiError
from schemas.topics import Tier
from tests.support.redis import REDIS_SERVER

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="no redis-server binary")


def gateway(storage: str) -> RateLimiter:
    settings = Settings(
        rate_limit_storage=storage,
        user_requests_per_minute=3,
        org_requests_per_minute=100,
        user_tokens_per_minute=1000,
        org_tokens_per_minute=100_000,
    )
    return RateLimiter.from_config(gateway_config(settings).rate_limits)


def new_owner() -> ApiKey:
    return ApiKey(f"user-{uuid.uuid4().hex[:8]}", "acme", Tier.FREE)


async def test_two_gateways_share_one_users_limit(redis_url: str) -> None:
    one, two = gateway(redis_url), gateway(redis_url)
    owner = new_owner()
    assert (await one.acquire(owner, 10))["x-ratelimit-remaining-requests"] == "2"
    assert (await two.acquire(owner, 10))["x-ratelimit-remaining-requests"] == "1"
    assert (await one.acquire(owner, 10))["x-ratelimit-remaining-requests"] == "0"
    for limiter in (two, one):
        with pytest.raises(ApiError) as refused:
            await limiter.acquire(owner, 10)
        assert refused.value.code == "rate_limited"
        assert 1 <= int(refused.value.headers["Retry-After"]) <= 60
    assert (await two.acquire(new_owner(), 10))["x-ratelimit-remaining-requests"] == "2"


async def test_concurrent_gateways_never_admit_more_than_the_limit(redis_url: str) -> None:
    gateways = [gateway(redis_url) for _ in range(4)]
    owner = new_owner()

    async def try_once(limiter: RateLimiter) -> bool:
        try:
            await limiter.acquire(owner, 1)
            return True
        except ApiError:
            return False

    admitted = await asyncio.gather(*(try_once(gateways[i % 4]) for i in range(20)))
    assert sum(admitted) == 3


async def test_an_unreachable_redis_lets_requests_through() -> None:
    limiter = gateway(f"redis://127.0.0.1:{free_port()}")
    assert await limiter.acquire(new_owner(), 10) == {}

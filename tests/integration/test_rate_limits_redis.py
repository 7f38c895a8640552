"""Rate limits shared by several gateways through one Redis (DESIGN §5).

Runs when a `redis-server` binary is installed (`apt-get install redis-server`);
skipped otherwise. Each limiter here stands for one gateway replica.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from bus.broker import free_port
from chatpipe.settings import Settings
from chatpipe.wiring import gateway_config
from conversations.store import ApiKey
from gateway.admission.rate_limits import RateLimiter
from gateway.errors import ApiError
from schemas.topics import Tier

REDIS_SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="no redis-server binary")


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise AssertionError("redis-server did not start")
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


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

"""Fixtures the gateway's unit tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from limits.storage import MemoryStorage  # noqa: F401  (the storage the URI below makes)

from chatpipe.settings import Settings
from chatpipe.wiring import gateway_config
from conversations.sqlite_store import SQLiteStore
from conversations.store import ApiKey
from gateway.admission.rate_limits import RateLimiter, storage_from_uri
from gateway.app import create_app
from gateway.deps import GatewayDeps
from schemas.topics import Tier
from tests.support.gateway import (
    ScriptedPipeline,
    gateway_deps,
)


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[SQLiteStore]:
    """A SQLite store in the module's `settings`, with two keys: `key-alice` (alice of
    org-a, pro) and `key-bob` (bob of org-b, free)."""
    store = SQLiteStore(settings.storage.database_path, key_secret=b"test-key-secret")
    await store.open()
    await store.add_api_key("key-alice", ApiKey("alice", "org-a", Tier.PRO))
    await store.add_api_key("key-bob", ApiKey("bob", "org-b", Tier.FREE))
    yield store
    await store.close()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        model_name="tiny-random",
        max_model_len=2048,  # the window, whichever models this machine has built
        max_message_chars=50,
        default_max_tokens=16,
        max_tokens_limit=100,
        request_timeout_s=30.0,
        database_path=tmp_path / "chat.db",
    )


@pytest.fixture
def pipeline() -> ScriptedPipeline:
    return ScriptedPipeline()


@pytest.fixture
def deps(settings: Settings, store: SQLiteStore, pipeline: ScriptedPipeline) -> GatewayDeps:
    return gateway_deps(settings, store, pipeline, reply_wait_s=0.3)


@pytest.fixture
async def app(deps: GatewayDeps):
    yield create_app(deps)
    await deps.background.close()  # the app's lifespan does this; ASGITransport runs none


@pytest.fixture
async def client(app) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


@pytest.fixture
async def sdk(app) -> AsyncIterator[openai.AsyncOpenAI]:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app))
    async with openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="key-alice", http_client=http, max_retries=0
    ) as client:
        yield client


@pytest.fixture
def limiter(settings: Settings) -> RateLimiter:
    return RateLimiter(gateway_config(settings).rate_limits, storage_from_uri("memory://"))

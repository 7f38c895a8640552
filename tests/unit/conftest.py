"""Fixtures the gateway's unit tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from chatpipe.settings import Settings
from conversations.sqlite_store import SQLiteStore
from conversations.store import ApiKey
from schemas.topics import Tier


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

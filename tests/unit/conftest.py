"""Fixtures the unit tests share: a SQLite store in memory (the gateway's tests have their
own `store`, in gateway/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from conversations.sqlite_store import SQLiteStore


@pytest.fixture
async def store() -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(":memory:")
    await store.open()
    yield store
    await store.close()

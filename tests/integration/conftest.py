"""Fixtures the store conformance tests share: each store kind over one clock, fresh
names, and one keyspace per session on a real Cassandra."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from conversations.cassandra_session import DriverSession
from conversations.cassandra_store import CassandraStore
from conversations.sqlite_store import SQLiteStore
from conversations.store import (
    ConversationStore,
)
from tests.support.cassandra_emulator import EmulatedCql
from tests.support.conformance import CASSANDRA_HOSTS, KEY_SECRET, NO_SERVER, Clock, Names


@pytest.fixture(scope="session")
def cassandra_keyspace() -> Iterator[str]:
    if not CASSANDRA_HOSTS:
        pytest.skip(NO_SERVER)
    keyspace = f"chatpipe_test_{uuid.uuid4().hex[:8]}"
    yield keyspace
    session = asyncio.run(DriverSession.connect(CASSANDRA_HOSTS, keyspace, create_schema=False))
    session._session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    asyncio.run(session.close())


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def n() -> Names:
    return Names()


@pytest_asyncio.fixture(params=["sqlite", "cassandra-emulated", "cassandra"])
async def store(request: pytest.FixtureRequest, clock: Clock) -> AsyncIterator[ConversationStore]:
    kind = request.param
    made: ConversationStore
    if kind == "sqlite":
        made = SQLiteStore(":memory:", clock=clock, key_secret=KEY_SECRET)
    elif kind == "cassandra-emulated":
        emulator = EmulatedCql()

        async def connect() -> EmulatedCql:
            return emulator

        made = CassandraStore([], clock=clock, connect=connect, key_secret=KEY_SECRET)
    else:
        keyspace = request.getfixturevalue("cassandra_keyspace")
        made = CassandraStore(CASSANDRA_HOSTS, keyspace, clock=clock, key_secret=KEY_SECRET)
    await made.open()
    yield made
    await made.close()

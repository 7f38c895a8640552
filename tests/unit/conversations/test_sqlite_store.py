"""SQLiteStore: seq assignment, idempotency, branches, keyed-hash API keys, shared files,
files from an older release."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path

import pytest

from conversations.sqlite_store import SQLiteStore, hash_api_key
from conversations.store import ApiKey, NewMessage, OrgSettings, RequestRecord
from schemas.events import Role
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier


def user_message(message_id: str, conversation_id: str = "c1", **fields) -> NewMessage:
    return NewMessage(message_id, conversation_id, Role.USER, f"text of {message_id}", **fields)


def started(message_id: str, parent_id: str) -> tuple[NewMessage, RequestRecord]:
    """An answer as the gateway stores it on queueing, and its request."""
    request_id = f"r-{message_id}"
    message = NewMessage(message_id, "c1", Role.ASSISTANT, "", parent_id=parent_id,
                         status=RequestStatus.IN_PROGRESS, request_id=request_id)  # fmt: skip
    return message, RequestRecord(
        request_id, "c1", message_id, "u1", 0, 7, "chat.deliver.g1", org_id="o1"
    )


def assistant_message(message_id: str, parent_id: str, conversation_id: str = "c1", **fields):
    return NewMessage(
        message_id, conversation_id, Role.ASSISTANT, f"answer {message_id}",
        parent_id=parent_id, model="tiny-random", tokens=7, request_id=f"r-{message_id}", **fields,
    )  # fmt: skip


async def test_seq_counts_per_conversation_from_one(store: SQLiteStore) -> None:
    a = await store.add_message(user_message("m1"))
    b = await store.add_message(assistant_message("m2", parent_id="m1"))
    other = await store.add_message(user_message("x1", conversation_id="c2"))

    assert (a.seq, b.seq, other.seq) == (1, 2, 1)
    assert [m.message_id for m in await store.list_messages("c1")] == ["m1", "m2"]


async def test_message_round_trips_every_field(store: SQLiteStore) -> None:
    sent = assistant_message("m2", parent_id="m1", status=RequestStatus.FINISHED_LENGTH)
    stored = await store.add_message(sent)

    assert await store.get_message("m2") == stored
    assert (stored.role, stored.content, stored.parent_id, stored.model) == (
        Role.ASSISTANT, "answer m2", "m1", "tiny-random",
    )  # fmt: skip
    assert (stored.tokens, stored.status, stored.request_id) == (
        7, RequestStatus.FINISHED_LENGTH, "r-m2",
    )  # fmt: skip


async def test_add_message_is_idempotent_on_message_id(store: SQLiteStore) -> None:
    first = await store.add_message(user_message("m1"))
    again = await store.add_message(
        NewMessage("m1", "c1", Role.USER, "a different text on redelivery")
    )

    assert again == first
    assert len(await store.list_messages("c1")) == 1


async def test_concurrent_appends_get_distinct_seqs(store: SQLiteStore) -> None:
    stored = await asyncio.gather(*(store.add_message(user_message(f"m{i}")) for i in range(20)))

    assert sorted(m.seq for m in stored) == list(range(1, 21))


async def test_conversations_are_idempotent_and_listed_per_user(store: SQLiteStore) -> None:
    ticks = iter(range(100))
    store._clock = lambda: float(next(ticks))
    first = await store.create_conversation("c1", "u1", "first", org_id="o1")
    again = await store.create_conversation("c1", "u2", "other title", org_id="o2")
    await store.create_conversation("c2", "u1", org_id="o1")
    await store.create_conversation("c3", "u9", org_id="o1")
    await store.create_conversation("c4", "u1", org_id="o2")  # another org's u1

    assert again == first and first.org_id == "o1"
    assert await store.get_conversation("missing") is None
    page = await store.list_conversations("u1", org_id="o1")
    assert [c.conversation_id for c in page.conversations] == ["c2", "c1"]
    page = await store.list_conversations("u1", org_id="o2")
    assert [c.conversation_id for c in page.conversations] == ["c4"]


async def test_api_keys_are_stored_only_as_keyed_hashes(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    store = SQLiteStore(path, key_secret=b"secret-1")
    await store.open()
    await store.add_api_key("sk-secret", ApiKey("u1", "o1", Tier.PRO, created_at=5.0))
    await store.add_api_key("sk-secret", ApiKey("u2", "o2", Tier.FREE))  # keeps the first

    found = await store.find_api_key("sk-secret")
    assert found is not None and (found.user_id, found.org_id, found.created_at) == (
        "u1", "o1", 5.0)  # fmt: skip
    assert await store.find_api_key("sk-other") is None
    await store.close()

    rows = sqlite3.connect(path).execute("SELECT key_hash FROM api_keys").fetchall()
    assert rows == [(hash_api_key("sk-secret", b"secret-1"),)]
    assert rows[0][0] != hashlib.sha256(b"sk-secret").hexdigest()
    assert b"sk-secret" not in path.read_bytes()

    other_secret = SQLiteStore(path, key_secret=b"secret-2")
    await other_secret.open()
    assert await other_secret.find_api_key("sk-secret") is None  # a new secret: no key opens
    await other_secret.close()
    no_secret = SQLiteStore(path)
    await no_secret.open()
    with pytest.raises(RuntimeError, match="CHATPIPE_KEY_SECRET"):
        await no_secret.find_api_key("sk-secret")
    assert [k.user_id for k in await no_secret.list_api_keys()] == ["u1"]  # no secret needed
    await no_secret.close()


async def test_two_stores_share_one_file(tmp_path: Path) -> None:
    gateway, recorder = SQLiteStore(tmp_path / "chat.db"), SQLiteStore(tmp_path / "chat.db")
    await gateway.open()
    await recorder.open()

    writes = [gateway.add_message(user_message(f"u{i}")) for i in range(50)]
    writes += [recorder.add_message(assistant_message(f"a{i}", f"u{i}")) for i in range(50)]
    stored = await asyncio.gather(*writes)

    assert sorted(m.seq for m in stored) == list(range(1, 101))
    assert len(await gateway.list_messages("c1")) == 100
    assert await gateway.get_message("a3") == await recorder.get_message("a3")
    journal = sqlite3.connect(tmp_path / "chat.db").execute("PRAGMA journal_mode").fetchone()
    assert journal == ("wal",)
    await gateway.close()
    await recorder.close()


async def test_two_processes_finishing_one_answer_change_it_once(tmp_path: Path) -> None:
    gateway, recorder = SQLiteStore(tmp_path / "chat.db"), SQLiteStore(tmp_path / "chat.db")
    await gateway.open()
    await recorder.open()
    for i in range(20):
        await gateway.start_answer(*started(f"a{i}", "u1"))

    answers = [assistant_message(f"a{i}", "u1") for i in range(20)]
    outcomes = await asyncio.gather(
        *(gateway.finish_answer(a) for a in answers), *(recorder.finish_answer(a) for a in answers)
    )

    assert [a + b for a, b in zip(outcomes[:20], outcomes[20:], strict=True)] == [1] * 20
    assert await recorder.in_progress_requests("c1") == []
    await gateway.close()
    await recorder.close()


async def test_a_closed_store_refuses_work() -> None:
    store = SQLiteStore(":memory:")
    with pytest.raises(RuntimeError):
        await store.get_message("m1")


async def test_a_file_from_an_older_release_gains_the_new_columns_and_tables(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE conversations (conversation_id TEXT PRIMARY KEY, user_id TEXT NOT NULL,
            title TEXT NOT NULL, created_at REAL NOT NULL);
        CREATE TABLE messages (conversation_id TEXT NOT NULL, seq INTEGER NOT NULL,
            message_id TEXT NOT NULL UNIQUE, role TEXT NOT NULL, content TEXT NOT NULL,
            tokens INTEGER NOT NULL, parent_id TEXT, model TEXT, status TEXT NOT NULL,
            request_id TEXT, created_at REAL NOT NULL, PRIMARY KEY (conversation_id, seq));
        INSERT INTO conversations VALUES ('c1', 'u1', 'kept', 1.0);
        INSERT INTO messages VALUES ('c1', 1, 'm1', 'user', 'hi', 0, NULL, NULL,
            'finished_stopped', NULL, 2.0);
    """)
    old.commit()
    old.close()

    store = SQLiteStore(path, key_secret=b"s")
    await store.open()
    [message] = await store.list_messages("c1")
    conversation = await store.get_conversation("c1")
    added = await store.add_message(assistant_message("a1", "m1", prompt_tokens=5))
    await store.start_answer(*started("a2", "m1"))
    request = await store.get_request("r-a2")
    await store.close()

    assert (message.content, message.prompt_tokens, message.cached_tokens) == ("hi", 0, 0)
    assert conversation is not None and (conversation.title, conversation.auto_title) == (
        "kept",
        "",
    )
    assert (added.seq, added.prompt_tokens) == (2, 5)
    assert request is not None and request.message_id == "a2"


async def test_an_older_file_gets_orgs_for_its_rows_and_its_sha256_keys_revoked(
    tmp_path: Path,
) -> None:
    """Rows from before orgs were kept take the one org their user had keys in (none, or
    several: nobody's); sha256 keys can never open under HMAC and list as revoked."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    sha = hashlib.sha256(b"old-key").hexdigest()
    old.executescript(f"""
        CREATE TABLE conversations (conversation_id TEXT PRIMARY KEY, user_id TEXT NOT NULL,
            title TEXT NOT NULL, created_at REAL NOT NULL, auto_title TEXT NOT NULL DEFAULT '');
        CREATE INDEX conversations_by_user ON conversations (user_id, created_at);
        CREATE TABLE requests (request_id TEXT PRIMARY KEY, conversation_id TEXT NOT NULL,
            message_id TEXT NOT NULL, user_id TEXT NOT NULL, answers_partition INTEGER NOT NULL,
            answers_offset INTEGER NOT NULL, reply_to TEXT NOT NULL, created_at REAL NOT NULL);
        CREATE TABLE api_keys (key_hash TEXT PRIMARY KEY, user_id TEXT NOT NULL,
            org_id TEXT NOT NULL, tier TEXT NOT NULL, created_at REAL NOT NULL);
        INSERT INTO api_keys VALUES ('{sha}', 'dev', 'dev', 'free', 1.0);
        INSERT INTO api_keys VALUES ('{"b" * 64}', 'ann', 'o1', 'pro', 1.0);
        INSERT INTO api_keys VALUES ('{"c" * 64}', 'ann', 'o2', 'pro', 1.0);
        INSERT INTO conversations VALUES ('c1', 'dev', 'mine', 1.0, '');
        INSERT INTO conversations VALUES ('c2', 'ann', 'whose?', 1.0, '');
        INSERT INTO requests VALUES ('r1', 'c1', 'm1', 'dev', 0, 5, 'chat.deliver.g', 1.0);
    """)
    old.commit()
    old.close()

    store = SQLiteStore(path, key_secret=b"s")
    await store.open()
    dev, ann = await store.get_conversation("c1"), await store.get_conversation("c2")
    request = await store.get_request("r1")
    keys = await store.list_api_keys()
    found = await store.find_api_key("old-key")
    await store.close()

    assert dev is not None and dev.org_id == "dev"
    assert ann is not None and ann.org_id == ""
    assert request is not None and request.org_id == "dev"
    assert sorted(k.key_id for k in keys) == sorted([sha[:12], "b" * 12, "c" * 12])
    assert all(k.revoked_at is not None for k in keys)
    assert found is None


async def test_an_older_file_gains_the_concurrency_limits_of_keys_and_orgs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE api_keys (key_hash TEXT PRIMARY KEY, user_id TEXT NOT NULL,
            org_id TEXT NOT NULL, tier TEXT NOT NULL, created_at REAL NOT NULL,
            name TEXT NOT NULL DEFAULT '', expires_at REAL, revoked_at REAL,
            key_id TEXT NOT NULL DEFAULT '');
        CREATE TABLE org_settings (org_id TEXT PRIMARY KEY,
            response_cache INTEGER NOT NULL DEFAULT 0);
        INSERT INTO org_settings VALUES ('acme', 1);
    """)
    old.commit()
    old.close()

    store = SQLiteStore(path, key_secret=b"s")
    await store.open()
    kept = await store.get_org_settings("acme")
    await store.add_api_key("sk-new", ApiKey("u1", "acme", Tier.PRO, max_concurrent_requests=2))
    key = await store.find_api_key("sk-new")
    await store.set_org_settings(OrgSettings("acme", True, max_concurrent_requests=7))
    changed = await store.get_org_settings("acme")
    await store.close()

    assert kept == OrgSettings("acme", response_cache=True, max_concurrent_requests=None)
    assert key is not None and key.max_concurrent_requests == 2
    assert changed.max_concurrent_requests == 7

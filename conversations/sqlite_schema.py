"""The SQLite store's tables, their upgrades, and row <-> record mapping."""

from __future__ import annotations

import sqlite3

from conversations.store import (
    KEY_ID_CHARS,
    ApiKey,
    CachedResponse,
    Conversation,
    StoredMessage,
)
from schemas.events import Role
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    auto_title TEXT NOT NULL DEFAULT '',
    org_id TEXT NOT NULL DEFAULT ''
);
DROP INDEX IF EXISTS conversations_by_user;
CREATE INDEX IF NOT EXISTS conversations_by_owner
    ON conversations (org_id, user_id, created_at);
CREATE TABLE IF NOT EXISTS messages (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message_id TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    parent_id TEXT,
    model TEXT,
    status TEXT NOT NULL,
    request_id TEXT,
    created_at REAL NOT NULL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    alias TEXT,
    PRIMARY KEY (conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS branch_choices (
    conversation_id TEXT NOT NULL,
    parent_key TEXT NOT NULL,
    child_id TEXT NOT NULL,
    PRIMARY KEY (conversation_id, parent_key)
);
CREATE TABLE IF NOT EXISTS summaries (
    conversation_id TEXT NOT NULL,
    through_message_id TEXT NOT NULL,
    content TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (conversation_id, through_message_id)
);
CREATE TABLE IF NOT EXISTS embeddings (
    conversation_id TEXT NOT NULL,
    model TEXT NOT NULL,
    message_id TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (conversation_id, model, message_id)
);
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    answers_partition INTEGER NOT NULL,
    answers_offset INTEGER NOT NULL,
    reply_to TEXT NOT NULL,
    created_at REAL NOT NULL,
    org_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS requests_by_conversation ON requests (conversation_id);
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    org_id TEXT NOT NULL,
    tier TEXT NOT NULL,
    created_at REAL NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    expires_at REAL,
    revoked_at REAL,
    key_id TEXT NOT NULL DEFAULT '',
    max_concurrent_requests INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS api_keys_by_id ON api_keys (key_id);
CREATE TABLE IF NOT EXISTS files (
    file_id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    filename TEXT NOT NULL,
    content_type TEXT NOT NULL,
    purpose TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    chunk_count INTEGER NOT NULL,
    embedding_model TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (org_id, user_id, created_at);
CREATE TABLE IF NOT EXISTS file_chunks (
    file_id TEXT NOT NULL,
    chunk_index INTEGER NOT NULL,
    content TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (file_id, chunk_index)
);
CREATE TABLE IF NOT EXISTS citations (
    conversation_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    citations TEXT NOT NULL,
    PRIMARY KEY (conversation_id, message_id)
);
CREATE TABLE IF NOT EXISTS tool_steps (
    conversation_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    steps TEXT NOT NULL,
    PRIMARY KEY (conversation_id, message_id)
);
CREATE TABLE IF NOT EXISTS org_settings (
    org_id TEXT PRIMARY KEY,
    response_cache INTEGER NOT NULL DEFAULT 0,
    max_concurrent_requests INTEGER
);
CREATE TABLE IF NOT EXISTS response_cache (
    cache_key TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    model TEXT NOT NULL,
    content TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS response_cache_by_expiry ON response_cache (expires_at);
"""

# The owner's org of a row from before orgs were kept: the one org its user had keys
# in; a user with keys in several orgs (or none) leaves it '' — nobody's.
_ORG_OF_USER = (
    "UPDATE {table} SET org_id = (SELECT MIN(k.org_id) FROM api_keys k"
    " WHERE k.user_id = {table}.user_id) WHERE org_id = '' AND (SELECT COUNT(DISTINCT"
    " k.org_id) FROM api_keys k WHERE k.user_id = {table}.user_id) = 1"
)

# Key rows of an earlier chatpipe hold a plain sha256 of the key, which no HMAC equals:
# they can never open again. They are kept, listed as revoked under an id taken from
# the hash, so `chatpipe keys list` still shows whom to give a new key.
_OLD_KEYS = (
    f"UPDATE api_keys SET key_id = substr(key_hash, 1, {KEY_ID_CHARS}),"
    " revoked_at = COALESCE(revoked_at, CAST(strftime('%s', 'now') AS REAL))"
    " WHERE key_id = ''"
)

# Columns added since the first release: (table, column, definition, what then fills
# them in on the rows already there, or None).
ADDED_COLUMNS = (
    ("conversations", "auto_title", "TEXT NOT NULL DEFAULT ''", None),
    ("messages", "prompt_tokens", "INTEGER NOT NULL DEFAULT 0", None),
    ("messages", "cached_tokens", "INTEGER NOT NULL DEFAULT 0", None),
    ("conversations", "org_id", "TEXT NOT NULL DEFAULT ''",
     _ORG_OF_USER.format(table="conversations")),
    ("requests", "org_id", "TEXT NOT NULL DEFAULT ''", _ORG_OF_USER.format(table="requests")),
    ("api_keys", "name", "TEXT NOT NULL DEFAULT ''", None),
    ("api_keys", "expires_at", "REAL", None),
    ("api_keys", "revoked_at", "REAL", None),
    ("api_keys", "key_id", "TEXT NOT NULL DEFAULT ''", _OLD_KEYS),
    ("messages", "alias", "TEXT", None),
    ("api_keys", "max_concurrent_requests", "INTEGER", None),
    ("org_settings", "max_concurrent_requests", "INTEGER", None),
)  # fmt: skip

CONVERSATION_COLUMNS = "conversation_id, user_id, title, created_at, auto_title, org_id"

MESSAGE_COLUMNS = (
    "message_id, conversation_id, seq, role, content, parent_id, model, tokens,"
    " status, request_id, created_at, prompt_tokens, cached_tokens, alias"
)

REQUEST_COLUMNS = (
    "request_id, conversation_id, message_id, user_id, answers_partition, answers_offset,"
    " reply_to, created_at, org_id"
)

API_KEY_COLUMNS = (
    "key_id, user_id, org_id, tier, name, created_at, expires_at, revoked_at,"
    " max_concurrent_requests"
)

FILE_COLUMNS = (
    "file_id, org_id, user_id, filename, content_type, purpose, size_bytes, chunk_count,"
    " embedding_model, created_at"
)
"""The fields of `StoredFile`, in order."""
CACHED_RESPONSE_COLUMNS = (
    "cache_key, org_id, model, content, prompt_tokens, completion_tokens, status,"
    " created_at, expires_at"
)


def create_schema(conn: sqlite3.Connection) -> None:
    """Add the columns a file from an older release lacks (filling them in on its rows),
    then create missing tables and indexes."""
    has_keys = bool(_columns(conn, "api_keys"))
    for table, column, definition, fill in ADDED_COLUMNS:
        existing = _columns(conn, table)
        if existing and column not in existing:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
            if fill is not None and has_keys:
                conn.execute(fill)
    conn.executescript(SCHEMA)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def conversation_row(row: tuple) -> Conversation:
    conversation_id, user_id, title, created_at, auto_title, org_id = row
    return Conversation(conversation_id, user_id, title, created_at, auto_title, org_id)


def api_key_row(row: tuple) -> ApiKey:
    """A row of `API_KEY_COLUMNS`."""
    key_id, user_id, org_id, tier, name, created_at, expires_at, revoked_at, concurrent = row
    return ApiKey(user_id, org_id, Tier(tier), created_at, key_id, name, expires_at, revoked_at,
                  concurrent)  # fmt: skip


def cached_response_row(row: tuple) -> CachedResponse:
    """A row of `CACHED_RESPONSE_COLUMNS`."""
    key, org_id, model, content, prompt_tokens, completion_tokens, status, created, expires = row
    return CachedResponse(
        key,
        org_id,
        model,
        content,
        prompt_tokens,
        completion_tokens,
        RequestStatus(status),
        created,
        expires,
    )


def message_values(message: StoredMessage) -> tuple:
    """The values of `MESSAGE_COLUMNS`, in order."""
    return (
        message.message_id, message.conversation_id, message.seq, message.role.value,
        message.content, message.parent_id, message.model, message.tokens,
        message.status.value, message.request_id, message.created_at,
        message.prompt_tokens, message.cached_tokens, message.alias,
    )  # fmt: skip


def message_row(row: tuple) -> StoredMessage:
    (message_id, conversation_id, seq, role, content, parent_id, model, tokens,
     status, request_id, created_at, prompt_tokens, cached_tokens, alias) = row  # fmt: skip
    return StoredMessage(
        message_id=message_id,
        conversation_id=conversation_id,
        seq=seq,
        role=Role(role),
        content=content,
        parent_id=parent_id,
        model=model,
        tokens=tokens,
        status=RequestStatus(status),
        request_id=request_id,
        created_at=created_at,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        alias=alias,
    )

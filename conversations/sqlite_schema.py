"""The SQLite store's tables, their upgrades, and row <-> record mapping."""

from __future__ import annotations

import sqlite3

from conversations.store import Conversation, StoredMessage
from schemas.events import Role
from schemas.lifecycle import RequestStatus

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    auto_title TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS conversations_by_user ON conversations (user_id, created_at);
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
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS requests_by_conversation ON requests (conversation_id);
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    org_id TEXT NOT NULL,
    tier TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""

# Columns added since the first release: (table, column, definition).
ADDED_COLUMNS = (
    ("conversations", "auto_title", "TEXT NOT NULL DEFAULT ''"),
    ("messages", "prompt_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("messages", "cached_tokens", "INTEGER NOT NULL DEFAULT 0"),
)

CONVERSATION_COLUMNS = "conversation_id, user_id, title, created_at, auto_title"

MESSAGE_COLUMNS = (
    "message_id, conversation_id, seq, role, content, parent_id, model, tokens,"
    " status, request_id, created_at, prompt_tokens, cached_tokens"
)

REQUEST_COLUMNS = (
    "request_id, conversation_id, message_id, user_id, answers_partition, answers_offset,"
    " reply_to, created_at"
)


def create_schema(conn: sqlite3.Connection) -> None:
    """Create missing tables, then add columns a file from an older release lacks."""
    for table, column, definition in ADDED_COLUMNS:
        existing = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if existing and column not in existing:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
    conn.executescript(SCHEMA)


def conversation_row(row: tuple) -> Conversation:
    conversation_id, user_id, title, created_at, auto_title = row
    return Conversation(conversation_id, user_id, title, created_at, auto_title)


def message_values(message: StoredMessage) -> tuple:
    """The values of `MESSAGE_COLUMNS`, in order."""
    return (
        message.message_id, message.conversation_id, message.seq, message.role.value,
        message.content, message.parent_id, message.model, message.tokens,
        message.status.value, message.request_id, message.created_at,
        message.prompt_tokens, message.cached_tokens,
    )  # fmt: skip


def message_row(row: tuple) -> StoredMessage:
    (message_id, conversation_id, seq, role, content, parent_id, model, tokens,
     status, request_id, created_at, prompt_tokens, cached_tokens) = row  # fmt: skip
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
    )

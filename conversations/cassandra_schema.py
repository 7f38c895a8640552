"""The Cassandra store's keyspace, tables, statements and row mapping (no I/O).

A table per query, each read from one partition:

* `conversations` by conversation_id: get, ownership checks (LWT `IF org_id = ?
  AND user_id = ?`: the same user id may exist in two orgs).
* `conversations_by_owner`: one owner's list, partitioned by (org_id, user_id),
  clustered newest first; a copy of the title fields, written with the
  conversation. (It replaces `conversations_by_user`, keyed by user alone, which a
  keyspace of an earlier chatpipe keeps, unused.)
* `messages`: one partition per conversation, clustered by `seq`. Two static
  (per-partition) columns: `last_seq`, the seq counter that message inserts
  claim with a conditional batch (see `CassandraStore.add_message`), and
  `selected`, parent key -> selected child, so one partition read returns
  the whole tree.
* `message_ids`: message_id -> (conversation_id, seq), for `get_message` and
  idempotent inserts (`IF NOT EXISTS`).
* `summaries`, `embeddings`, `citations`: one partition per conversation.
* `files` by file_id, `files_by_owner` (one owner's list, newest first, a copy of
  the file's fields) and `file_chunks` (one partition per file, clustered by chunk
  index): a user's documents (`conversations.files`).
* `requests` by request_id: the request behind an answer (`start_answer`); a
  conversation's are found through its messages' `request_id` when it is deleted.
* `api_keys` by key hash (HMAC-SHA256, see `store.hash_api_key`): the lookup of
  every authenticated request; `chatpipe keys list` reads the whole table.
  `api_key_ids`: key_id -> key hash, for `chatpipe keys revoke KEY_ID`.
* `org_settings` by org_id (`chatpipe orgs`); `response_cache` by cache key, each row
  written with a TTL (its `expires_at`, which reads also check: the store's clock).

A keyspace made by an earlier chatpipe gains the newer columns (`UPGRADES`, `ALTER
TABLE … ADD IF NOT EXISTS`, Cassandra 4.1 or later). Its rows have no org: such
conversations and requests are nobody's, and its API keys (a plain sha256 with no
key_id) never open again; they are listed as revoked.

`created_at` is a `double` (epoch seconds, as in the records) so cursors and
records round-trip exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conversations.store import (
    ApiKey,
    Conversation,
    StoredMessage,
    Summary,
    TurnUsage,
    derived_key_id,
)
from schemas.events import Role
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier

Row = Mapping[str, Any]

CONVERSATION_COLUMNS = "conversation_id, user_id, title, auto_title, created_at, org_id"
MESSAGE_COLUMNS = (
    "conversation_id, seq, message_id, role, content, parent_id, model, tokens, status,"
    " request_id, created_at, prompt_tokens, cached_tokens, alias"
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
_FILE_FIELDS = """
    filename text,
    content_type text,
    purpose text,
    size_bytes bigint,
    chunk_count int,
    embedding_model text,"""
CACHED_RESPONSE_COLUMNS = (
    "cache_key, org_id, model, content, prompt_tokens, completion_tokens, status,"
    " created_at, expires_at"
)

TABLES = (
    """CREATE TABLE IF NOT EXISTS {ks}.conversations (
    conversation_id text PRIMARY KEY,
    org_id text,
    user_id text,
    title text,
    auto_title text,
    created_at double)""",
    """CREATE TABLE IF NOT EXISTS {ks}.conversations_by_owner (
    org_id text,
    user_id text,
    created_at double,
    conversation_id text,
    title text,
    auto_title text,
    PRIMARY KEY ((org_id, user_id), created_at, conversation_id)
) WITH CLUSTERING ORDER BY (created_at DESC, conversation_id ASC)""",
    """CREATE TABLE IF NOT EXISTS {ks}.messages (
    conversation_id text,
    seq int,
    last_seq int STATIC,
    selected map<text, text> STATIC,
    message_id text,
    role text,
    content text,
    parent_id text,
    model text,
    tokens int,
    status text,
    request_id text,
    created_at double,
    prompt_tokens int,
    cached_tokens int,
    alias text,
    PRIMARY KEY (conversation_id, seq)
) WITH CLUSTERING ORDER BY (seq ASC)""",
    """CREATE TABLE IF NOT EXISTS {ks}.message_ids (
    message_id text PRIMARY KEY,
    conversation_id text,
    seq int)""",
    """CREATE TABLE IF NOT EXISTS {ks}.summaries (
    conversation_id text,
    through_message_id text,
    content text,
    created_at double,
    PRIMARY KEY (conversation_id, through_message_id))""",
    """CREATE TABLE IF NOT EXISTS {ks}.embeddings (
    conversation_id text,
    model text,
    message_id text,
    vector blob,
    PRIMARY KEY (conversation_id, model, message_id))""",
    """CREATE TABLE IF NOT EXISTS {ks}.requests (
    request_id text PRIMARY KEY,
    conversation_id text,
    message_id text,
    org_id text,
    user_id text,
    answers_partition int,
    answers_offset bigint,
    reply_to text,
    created_at double)""",
    """CREATE TABLE IF NOT EXISTS {ks}.api_keys (
    key_hash text PRIMARY KEY,
    key_id text,
    user_id text,
    org_id text,
    tier text,
    name text,
    created_at double,
    expires_at double,
    revoked_at double,
    max_concurrent_requests int)""",
    """CREATE TABLE IF NOT EXISTS {ks}.api_key_ids (
    key_id text PRIMARY KEY,
    key_hash text)""",
    """CREATE TABLE IF NOT EXISTS {ks}.files (
    file_id text PRIMARY KEY,
    org_id text,
    user_id text,"""
    + _FILE_FIELDS
    + """
    created_at double)""",
    """CREATE TABLE IF NOT EXISTS {ks}.files_by_owner (
    org_id text,
    user_id text,
    created_at double,
    file_id text,"""
    + _FILE_FIELDS
    + """
    PRIMARY KEY ((org_id, user_id), created_at, file_id)
) WITH CLUSTERING ORDER BY (created_at DESC, file_id ASC)""",
    """CREATE TABLE IF NOT EXISTS {ks}.file_chunks (
    file_id text,
    chunk_index int,
    content text,
    vector blob,
    PRIMARY KEY (file_id, chunk_index))""",
    """CREATE TABLE IF NOT EXISTS {ks}.citations (
    conversation_id text,
    message_id text,
    citations text,
    PRIMARY KEY (conversation_id, message_id))""",
    """CREATE TABLE IF NOT EXISTS {ks}.tool_steps (
    conversation_id text,
    message_id text,
    steps text,
    PRIMARY KEY (conversation_id, message_id))""",
    """CREATE TABLE IF NOT EXISTS {ks}.org_settings (
    org_id text PRIMARY KEY,
    response_cache boolean,
    max_concurrent_requests int)""",
    """CREATE TABLE IF NOT EXISTS {ks}.response_cache (
    cache_key text PRIMARY KEY,
    org_id text,
    model text,
    content text,
    prompt_tokens int,
    completion_tokens int,
    status text,
    created_at double,
    expires_at double)""",
)

# Columns a keyspace made by an earlier chatpipe lacks (no-ops on a new one).
UPGRADES = (
    "ALTER TABLE {ks}.conversations ADD IF NOT EXISTS org_id text",
    "ALTER TABLE {ks}.requests ADD IF NOT EXISTS org_id text",
    "ALTER TABLE {ks}.api_keys ADD IF NOT EXISTS key_id text",
    "ALTER TABLE {ks}.api_keys ADD IF NOT EXISTS name text",
    "ALTER TABLE {ks}.api_keys ADD IF NOT EXISTS expires_at double",
    "ALTER TABLE {ks}.api_keys ADD IF NOT EXISTS revoked_at double",
    "ALTER TABLE {ks}.messages ADD IF NOT EXISTS alias text",
    "ALTER TABLE {ks}.api_keys ADD IF NOT EXISTS max_concurrent_requests int",
    "ALTER TABLE {ks}.org_settings ADD IF NOT EXISTS max_concurrent_requests int",
)

_PAGE = (
    f"SELECT {CONVERSATION_COLUMNS} FROM {{ks}}.conversations_by_owner"
    " WHERE org_id = ? AND user_id = ?"
)

STATEMENTS = {
    # conversations
    "insert_conversation": f"INSERT INTO {{ks}}.conversations ({CONVERSATION_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "insert_conversation_by_owner": f"INSERT INTO {{ks}}.conversations_by_owner"
    f" ({CONVERSATION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
    "select_conversation": f"SELECT {CONVERSATION_COLUMNS} FROM {{ks}}.conversations"
    " WHERE conversation_id = ?",
    "page_first": _PAGE + " LIMIT ?",
    "page_ties": _PAGE + " AND created_at = ? AND conversation_id > ? LIMIT ?",
    "page_older": _PAGE + " AND created_at < ? LIMIT ?",
    "rename": "UPDATE {ks}.conversations SET title = ? WHERE conversation_id = ?"
    " IF org_id = ? AND user_id = ?",
    "rename_by_owner": "UPDATE {ks}.conversations_by_owner SET title = ?"
    " WHERE org_id = ? AND user_id = ? AND created_at = ? AND conversation_id = ? IF EXISTS",
    "auto_title": "UPDATE {ks}.conversations SET auto_title = ? WHERE conversation_id = ?"
    " IF EXISTS",
    "auto_title_by_owner": "UPDATE {ks}.conversations_by_owner SET auto_title = ?"
    " WHERE org_id = ? AND user_id = ? AND created_at = ? AND conversation_id = ? IF EXISTS",
    "delete_conversation": "DELETE FROM {ks}.conversations WHERE conversation_id = ?"
    " IF org_id = ? AND user_id = ?",
    "delete_conversation_by_owner": "DELETE FROM {ks}.conversations_by_owner"
    " WHERE org_id = ? AND user_id = ? AND created_at = ? AND conversation_id = ?",
    "delete_messages": "DELETE FROM {ks}.messages WHERE conversation_id = ?",
    "delete_message_id": "DELETE FROM {ks}.message_ids WHERE message_id = ?",
    "delete_summaries": "DELETE FROM {ks}.summaries WHERE conversation_id = ?",
    "delete_embeddings": "DELETE FROM {ks}.embeddings WHERE conversation_id = ?",
    "delete_request": "DELETE FROM {ks}.requests WHERE request_id = ?",
    # one message's (delete_messages)
    "delete_summary": "DELETE FROM {ks}.summaries"
    " WHERE conversation_id = ? AND through_message_id = ?",
    "select_embedding_keys": "SELECT model, message_id FROM {ks}.embeddings"
    " WHERE conversation_id = ?",
    "delete_embedding": "DELETE FROM {ks}.embeddings"
    " WHERE conversation_id = ? AND model = ? AND message_id = ?",
    "delete_message_citations": "DELETE FROM {ks}.citations"
    " WHERE conversation_id = ? AND message_id = ?",
    "delete_message_tool_steps": "DELETE FROM {ks}.tool_steps"
    " WHERE conversation_id = ? AND message_id = ?",
    "remove_choices": "UPDATE {ks}.messages SET selected = selected - ? WHERE conversation_id = ?",
    # messages
    "select_last_seq": "SELECT last_seq FROM {ks}.messages WHERE conversation_id = ? LIMIT 1",
    "insert_message": f"INSERT INTO {{ks}}.messages ({MESSAGE_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "claim_seq": "UPDATE {ks}.messages SET last_seq = ?, selected[?] = ?"
    " WHERE conversation_id = ? IF last_seq = ?",
    "insert_message_id": "INSERT INTO {ks}.message_ids (message_id, conversation_id, seq)"
    " VALUES (?, ?, ?) IF NOT EXISTS",
    "select_message_id": "SELECT conversation_id, seq FROM {ks}.message_ids WHERE message_id = ?",
    "select_message": f"SELECT {MESSAGE_COLUMNS} FROM {{ks}}.messages"
    " WHERE conversation_id = ? AND seq = ?",
    "select_messages": f"SELECT {MESSAGE_COLUMNS}, selected FROM {{ks}}.messages"
    " WHERE conversation_id = ?",
    "delete_message": "DELETE FROM {ks}.messages WHERE conversation_id = ? AND seq = ?",
    # a condition, so of two writers only one finishes it, and a deleted row stays gone
    "finish_answer": "UPDATE {ks}.messages SET content = ?, tokens = ?, prompt_tokens = ?,"
    " cached_tokens = ?, model = ?, status = ? WHERE conversation_id = ? AND seq = ?"
    " IF status = ?",
    # a condition, so a conversation deleted meanwhile is not brought back
    "add_choices": "UPDATE {ks}.messages SET selected = selected + ? WHERE conversation_id = ?"
    " IF last_seq > 0",
    # requests
    "insert_request": f"INSERT INTO {{ks}}.requests ({REQUEST_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "select_request": f"SELECT {REQUEST_COLUMNS} FROM {{ks}}.requests WHERE request_id = ?",
    # context
    "insert_summary": "INSERT INTO {ks}.summaries"
    " (conversation_id, through_message_id, content, created_at) VALUES (?, ?, ?, ?)",
    "select_summaries": "SELECT conversation_id, through_message_id, content, created_at"
    " FROM {ks}.summaries WHERE conversation_id = ?",
    "insert_embedding": "INSERT INTO {ks}.embeddings (conversation_id, model, message_id,"
    " vector) VALUES (?, ?, ?, ?)",
    "select_embeddings": "SELECT message_id, vector FROM {ks}.embeddings"
    " WHERE conversation_id = ? AND model = ?",
    # API keys
    "insert_api_key": f"INSERT INTO {{ks}}.api_keys (key_hash, {API_KEY_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "insert_api_key_id": "INSERT INTO {ks}.api_key_ids (key_id, key_hash) VALUES (?, ?)"
    " IF NOT EXISTS",
    "select_api_key": f"SELECT key_hash, {API_KEY_COLUMNS} FROM {{ks}}.api_keys WHERE key_hash = ?",
    "select_api_keys": f"SELECT key_hash, {API_KEY_COLUMNS} FROM {{ks}}.api_keys",
    "select_api_key_id": "SELECT key_hash FROM {ks}.api_key_ids WHERE key_id = ?",
    # a condition, so a key row deleted meanwhile is not brought back as a stub
    "revoke_api_key": "UPDATE {ks}.api_keys SET revoked_at = ? WHERE key_hash = ? IF EXISTS",
    # files
    "insert_file": f"INSERT INTO {{ks}}.files ({FILE_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "insert_file_by_owner": f"INSERT INTO {{ks}}.files_by_owner ({FILE_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "select_file": f"SELECT {FILE_COLUMNS} FROM {{ks}}.files WHERE file_id = ?",
    "select_files_by_owner": f"SELECT {FILE_COLUMNS} FROM {{ks}}.files_by_owner"
    " WHERE org_id = ? AND user_id = ?",
    "delete_file": "DELETE FROM {ks}.files WHERE file_id = ? IF org_id = ? AND user_id = ?",
    "delete_file_by_owner": "DELETE FROM {ks}.files_by_owner"
    " WHERE org_id = ? AND user_id = ? AND created_at = ? AND file_id = ?",
    "insert_file_chunk": "INSERT INTO {ks}.file_chunks (file_id, chunk_index, content, vector)"
    " VALUES (?, ?, ?, ?)",
    "select_file_chunks": "SELECT file_id, chunk_index, content, vector FROM {ks}.file_chunks"
    " WHERE file_id = ?",
    "delete_file_chunks": "DELETE FROM {ks}.file_chunks WHERE file_id = ?",
    "insert_citations": "INSERT INTO {ks}.citations (conversation_id, message_id, citations)"
    " VALUES (?, ?, ?)",
    "select_citations": "SELECT message_id, citations FROM {ks}.citations"
    " WHERE conversation_id = ?",
    "delete_citations": "DELETE FROM {ks}.citations WHERE conversation_id = ?",
    "insert_tool_steps": "INSERT INTO {ks}.tool_steps (conversation_id, message_id, steps)"
    " VALUES (?, ?, ?)",
    "select_tool_steps": "SELECT message_id, steps FROM {ks}.tool_steps WHERE conversation_id = ?",
    "delete_tool_steps": "DELETE FROM {ks}.tool_steps WHERE conversation_id = ?",
    # orgs and the response cache
    "insert_org_settings": "INSERT INTO {ks}.org_settings (org_id, response_cache,"
    " max_concurrent_requests) VALUES (?, ?, ?)",
    "select_org_settings": "SELECT org_id, response_cache, max_concurrent_requests"
    " FROM {ks}.org_settings WHERE org_id = ?",
    "select_all_org_settings": "SELECT org_id, response_cache, max_concurrent_requests"
    " FROM {ks}.org_settings",
    "insert_cached_response": f"INSERT INTO {{ks}}.response_cache ({CACHED_RESPONSE_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?",
    "select_cached_response": f"SELECT {CACHED_RESPONSE_COLUMNS} FROM {{ks}}.response_cache"
    " WHERE cache_key = ?",
}


def keyspace_cql(keyspace: str, replication_factor: int = 1) -> str:
    """CREATE KEYSPACE with SimpleStrategy; create a multi-datacenter keyspace yourself."""
    _check_name(keyspace)
    return (
        f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication ="
        f" {{'class': 'SimpleStrategy', 'replication_factor': {int(replication_factor)}}}"
    )


def schema_cql(keyspace: str, replication_factor: int = 1) -> list[str]:
    """Every statement that creates the keyspace and its tables, then adds the columns an
    older keyspace lacks, in order (idempotent)."""
    _check_name(keyspace)
    return [keyspace_cql(keyspace, replication_factor)] + [
        t.format(ks=keyspace) for t in (*TABLES, *UPGRADES)
    ]


def statements(keyspace: str) -> dict[str, str]:
    """The store's statements (name -> CQL with `?` markers) for `keyspace`."""
    _check_name(keyspace)
    return {name: cql.format(ks=keyspace) for name, cql in STATEMENTS.items()}


def _check_name(keyspace: str) -> None:
    if not (keyspace.isidentifier() and keyspace.isascii() and len(keyspace) <= 48):
        raise ValueError(f"invalid Cassandra keyspace name {keyspace!r}")


# --- rows -> records ------------------------------------------------------------------


def applied(rows: Sequence[Row]) -> bool:
    """Whether a conditional (LWT) statement took effect."""
    return bool(rows and rows[0].get("[applied]"))


def conversation_of(row: Row) -> Conversation:
    return Conversation(
        conversation_id=row["conversation_id"],
        user_id=row["user_id"],
        title=row["title"] or "",
        created_at=row["created_at"],
        auto_title=row["auto_title"] or "",
        org_id=row.get("org_id") or "",
    )


def conversation_values(conversation: Conversation) -> tuple:
    """The values of `CONVERSATION_COLUMNS`, in order."""
    c = conversation
    return (c.conversation_id, c.user_id, c.title, c.auto_title, c.created_at, c.org_id)


def api_key_values(key_hash: str, key: ApiKey) -> tuple:
    """The values of `insert_api_key`: the hash, then `API_KEY_COLUMNS` in order."""
    k = key
    return (key_hash, k.key_id, k.user_id, k.org_id, k.tier.value, k.name, k.created_at,
            k.expires_at, k.revoked_at, k.max_concurrent_requests)  # fmt: skip


def api_key_of(row: Row) -> ApiKey:
    """A key's row. One from an earlier chatpipe (no key_id: a sha256 no HMAC equals)
    shows as revoked, under an id taken from its hash."""
    old = not row.get("key_id")
    revoked_at = row.get("revoked_at")
    return ApiKey(
        user_id=row["user_id"],
        org_id=row["org_id"],
        tier=Tier(row["tier"]),
        created_at=row["created_at"],
        key_id=derived_key_id(row["key_hash"]) if old else row["key_id"],
        name=row.get("name") or "",
        expires_at=row.get("expires_at"),
        revoked_at=row["created_at"] if old and revoked_at is None else revoked_at,
        max_concurrent_requests=row.get("max_concurrent_requests"),
    )


def message_values(message: StoredMessage) -> tuple:
    """The values of `MESSAGE_COLUMNS`, in order."""
    m = message
    return (
        m.conversation_id, m.seq, m.message_id, m.role.value, m.content, m.parent_id, m.model,
        m.tokens, m.status.value, m.request_id, m.created_at, m.prompt_tokens, m.cached_tokens,
        m.alias,
    )  # fmt: skip


def message_of(row: Row) -> StoredMessage:
    return StoredMessage(
        message_id=row["message_id"],
        conversation_id=row["conversation_id"],
        seq=row["seq"],
        role=Role(row["role"]),
        content=row["content"] or "",
        parent_id=row["parent_id"],
        model=row["model"],
        tokens=row["tokens"] or 0,
        status=RequestStatus(row["status"]),
        request_id=row["request_id"],
        created_at=row["created_at"],
        prompt_tokens=row["prompt_tokens"] or 0,
        cached_tokens=row["cached_tokens"] or 0,
        alias=row.get("alias"),
    )


def messages_of(rows: Sequence[Row]) -> list[StoredMessage]:
    """The messages of a partition read, in seq order, one per message_id.

    A partition holding only static columns reads as one row with no `seq`;
    it is skipped. Should a writer have died between storing a message and
    indexing its id, a redelivery stores it again: the first copy is kept.
    """
    seen: set[str] = set()
    messages = []
    for row in sorted((r for r in rows if r.get("seq") is not None), key=lambda r: r["seq"]):
        if row["message_id"] not in seen:
            seen.add(row["message_id"])
            messages.append(message_of(row))
    return messages


def choices_of(rows: Sequence[Row]) -> dict[str, str]:
    """The `selected` static map of a partition read (parent key -> child id)."""
    return dict(rows[0].get("selected") or {}) if rows else {}


def usage_of(messages: list[StoredMessage]) -> list[TurnUsage]:
    return [
        TurnUsage(m.message_id, m.seq, m.model, m.prompt_tokens, m.cached_tokens, m.tokens)
        for m in messages
        if m.role == Role.ASSISTANT
    ]


def summaries_of(rows: Sequence[Row]) -> list[Summary]:
    found = [
        Summary(r["conversation_id"], r["through_message_id"], r["content"], r["created_at"])
        for r in rows
    ]
    return sorted(found, key=lambda s: (s.created_at, s.through_message_id))

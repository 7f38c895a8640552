"""An in-memory stand-in for the Cassandra cluster behind `CassandraStore`.

It implements the store's named statements (`cassandra_schema.STATEMENTS`)
with Cassandra's semantics where the store relies on them: lightweight
transactions answer `[applied]` and, when refused, the current values;
a conditional batch is all or nothing; static columns belong to the
partition and read back on every row (or alone, with a null `seq`, on a
partition without rows); an empty map reads back as None. Each call yields
to the event loop first, so concurrent callers interleave between
statements as they would against a server.

It checks that every call binds as many values as its CQL has markers. It
cannot check the CQL itself: that takes a server (CASSANDRA_HOSTS).

`EmulatedLedgerCql` does the same for the usage ledger's statements
(`ledger.cassandra_schema.STATEMENTS`): counters, LWTs, and failures on purpose.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from conversations import cassandra_schema as cql
from ledger import cassandra_schema as ledger_cql
from tests.support.cassandra_files_emulator import EmulatedFilesCql

Row = dict[str, Any]
MESSAGE_COLUMNS = [c.strip() for c in cql.MESSAGE_COLUMNS.split(",")]
CONVERSATION_COLUMNS = [c.strip() for c in cql.CONVERSATION_COLUMNS.split(",")]
REQUEST_COLUMNS = [c.strip() for c in cql.REQUEST_COLUMNS.split(",")]
API_KEY_COLUMNS = [c.strip() for c in cql.API_KEY_COLUMNS.split(",")]
CACHED_RESPONSE_COLUMNS = [c.strip() for c in cql.CACHED_RESPONSE_COLUMNS.split(",")]
Owner = tuple[str, str]  # (org_id, user_id): the partition key of conversations_by_owner


class _Partition:
    def __init__(self) -> None:
        self.last_seq: int | None = None
        self.selected: dict[str, str] = {}
        self.rows: dict[int, Row] = {}


class EmulatedCql(EmulatedFilesCql):
    """`CqlSession` over Python dicts (the file tables: `EmulatedFilesCql`)."""

    def __init__(self) -> None:
        super().__init__()
        self.conversations: dict[str, Row] = {}
        self.by_owner: dict[Owner, dict[tuple[float, str], Row]] = defaultdict(dict)
        self.messages: dict[str, _Partition] = {}
        self.message_ids: dict[str, Row] = {}
        self.summaries: dict[str, dict[str, Row]] = defaultdict(dict)
        self.embeddings: dict[str, dict[tuple[str, str], bytes]] = defaultdict(dict)
        self.requests: dict[str, Row] = {}
        self.api_keys: dict[str, Row] = {}
        self.api_key_ids: dict[str, Row] = {}
        self.org_settings: dict[str, Row] = {}
        self.response_cache: dict[str, Row] = {}
        self.calls: list[str] = []
        self.closed = False

    async def run(self, name: str, values: tuple) -> list[Row]:
        await asyncio.sleep(0)
        self._check(name, values)
        self.calls.append(name)
        return getattr(self, f"_{name}")(*values)

    async def batch(self, statements: list[tuple[str, tuple]]) -> list[Row]:
        await asyncio.sleep(0)
        for name, values in statements:
            self._check(name, values)
        self.calls.append("batch:" + ",".join(name for name, _ in statements))
        claims = [values for name, values in statements if name == "claim_seq"]
        for _, _, _, conversation_id, expected in claims:
            current = self.messages.get(conversation_id, _Partition()).last_seq
            if current != expected:
                return [{"[applied]": False, "conversation_id": conversation_id,
                         "last_seq": current}]  # fmt: skip
        for name, values in statements:
            getattr(self, f"_{name}")(*values)
        return [{"[applied]": True}] if claims else []

    async def close(self) -> None:
        self.closed = True

    @staticmethod
    def _check(name: str, values: tuple) -> None:
        markers = cql.STATEMENTS[name].count("?")
        assert len(values) == markers, f"{name}: {len(values)} values for {markers} markers"

    # --- conversations ------------------------------------------------------------

    def _insert_conversation(self, *values: Any) -> list[Row]:
        row = dict(zip(CONVERSATION_COLUMNS, values, strict=True))
        return _insert_if_not_exists(self.conversations, row["conversation_id"], row)

    def _insert_conversation_by_owner(self, *values: Any) -> list[Row]:
        row = dict(zip(CONVERSATION_COLUMNS, values, strict=True))
        owner = (row["org_id"], row["user_id"])
        self.by_owner[owner][(row["created_at"], row["conversation_id"])] = row
        return []

    def _select_conversation(self, conversation_id: str) -> list[Row]:
        found = self.conversations.get(conversation_id)
        return [dict(found)] if found else []

    def _listed(self, org_id: str, user_id: str) -> list[Row]:
        rows = self.by_owner.get((org_id, user_id), {}).values()
        return [
            dict(r) for r in sorted(rows, key=lambda r: (-r["created_at"], r["conversation_id"]))
        ]

    def _page_first(self, org_id: str, user_id: str, limit: int) -> list[Row]:
        return self._listed(org_id, user_id)[:limit]

    def _page_ties(
        self, org_id: str, user_id: str, created_at: float, after: str, limit: int
    ) -> list[Row]:
        rows = self._listed(org_id, user_id)
        return [r for r in rows if r["created_at"] == created_at and r["conversation_id"] > after][
            :limit
        ]

    def _page_older(self, org_id: str, user_id: str, created_at: float, limit: int) -> list[Row]:
        return [r for r in self._listed(org_id, user_id) if r["created_at"] < created_at][:limit]

    def _owned(self, conversation_id: str, org_id: str, user_id: str) -> tuple[Row | None, bool]:
        """The row, and whether `IF org_id = ? AND user_id = ?` holds on it."""
        found = self.conversations.get(conversation_id)
        return found, found is not None and (found["org_id"], found["user_id"]) == (
            org_id, user_id)  # fmt: skip

    def _rename(self, title: str, conversation_id: str, org_id: str, user_id: str) -> list[Row]:
        found, owned = self._owned(conversation_id, org_id, user_id)
        if not owned:
            return [_refused_owner(found)]
        assert found is not None
        found["title"] = title
        return [{"[applied]": True}]

    def _by_owner_row(
        self, org_id: str, user_id: str, created_at: float, conversation_id: str
    ) -> Row | None:
        return self.by_owner.get((org_id, user_id), {}).get((created_at, conversation_id))

    def _rename_by_owner(self, title: str, *key: Any) -> list[Row]:
        found = self._by_owner_row(*key)
        if found is not None:
            found["title"] = title
        return [{"[applied]": found is not None}]

    def _auto_title(self, title: str, conversation_id: str) -> list[Row]:
        found = self.conversations.get(conversation_id)
        if found is not None:
            found["auto_title"] = title
        return [{"[applied]": found is not None}]

    def _auto_title_by_owner(self, title: str, *key: Any) -> list[Row]:
        found = self._by_owner_row(*key)
        if found is not None:
            found["auto_title"] = title
        return [{"[applied]": found is not None}]

    def _delete_conversation(self, conversation_id: str, org_id: str, user_id: str) -> list[Row]:
        found, owned = self._owned(conversation_id, org_id, user_id)
        if not owned:
            return [_refused_owner(found)]
        del self.conversations[conversation_id]
        return [{"[applied]": True}]

    def _delete_conversation_by_owner(
        self, org_id: str, user_id: str, created_at: float, cid: str
    ) -> list[Row]:
        self.by_owner.get((org_id, user_id), {}).pop((created_at, cid), None)
        return []

    def _delete_messages(self, conversation_id: str) -> list[Row]:
        self.messages.pop(conversation_id, None)
        return []

    def _delete_message_id(self, message_id: str) -> list[Row]:
        self.message_ids.pop(message_id, None)
        return []

    def _delete_request(self, request_id: str) -> list[Row]:
        self.requests.pop(request_id, None)
        return []

    def _delete_summaries(self, conversation_id: str) -> list[Row]:
        self.summaries.pop(conversation_id, None)
        return []

    def _delete_embeddings(self, conversation_id: str) -> list[Row]:
        self.embeddings.pop(conversation_id, None)
        return []

    def _delete_summary(self, conversation_id: str, through: str) -> list[Row]:
        self.summaries.get(conversation_id, {}).pop(through, None)
        return []

    def _select_embedding_keys(self, conversation_id: str) -> list[Row]:
        stored = self.embeddings.get(conversation_id, {})
        return [{"model": model, "message_id": mid} for model, mid in stored]

    def _delete_embedding(self, conversation_id: str, model: str, message_id: str) -> list[Row]:
        self.embeddings.get(conversation_id, {}).pop((model, message_id), None)
        return []

    def _delete_message_citations(self, conversation_id: str, message_id: str) -> list[Row]:
        self.citations.get(conversation_id, {}).pop(message_id, None)
        return []

    def _delete_message_tool_steps(self, conversation_id: str, message_id: str) -> list[Row]:
        self.tool_steps.get(conversation_id, {}).pop(message_id, None)
        return []

    def _remove_choices(self, parents: set[str], conversation_id: str) -> list[Row]:
        partition = self.messages.get(conversation_id)
        if partition is not None:
            for parent in parents:
                partition.selected.pop(parent, None)
        return []

    # --- messages -----------------------------------------------------------------

    def _select_last_seq(self, conversation_id: str) -> list[Row]:
        partition = self.messages.get(conversation_id)
        return [{"last_seq": partition.last_seq}] if partition else []

    def _insert_message(self, *values: Any) -> list[Row]:
        row = dict(zip(MESSAGE_COLUMNS, values, strict=True))
        partition = self.messages.setdefault(row["conversation_id"], _Partition())
        partition.rows[row["seq"]] = row
        return []

    def _claim_seq(
        self, last_seq: int, key: str, child: str, cid: str, _expected: Any
    ) -> list[Row]:
        partition = self.messages.setdefault(cid, _Partition())
        partition.last_seq = last_seq
        partition.selected[key] = child
        return []

    def _insert_message_id(self, message_id: str, conversation_id: str, seq: int) -> list[Row]:
        found = self.message_ids.get(message_id)
        if found is not None:
            return [{"[applied]": False, "message_id": message_id, **found}]
        self.message_ids[message_id] = {"conversation_id": conversation_id, "seq": seq}
        return [{"[applied]": True}]

    def _select_message_id(self, message_id: str) -> list[Row]:
        found = self.message_ids.get(message_id)
        return [dict(found)] if found else []

    def _select_message(self, conversation_id: str, seq: int) -> list[Row]:
        partition = self.messages.get(conversation_id)
        row = partition.rows.get(seq) if partition else None
        return [dict(row)] if row else []

    def _select_messages(self, conversation_id: str) -> list[Row]:
        partition = self.messages.get(conversation_id)
        if partition is None:
            return []
        static = {"selected": dict(partition.selected) or None}
        if not partition.rows:
            return [{**dict.fromkeys(MESSAGE_COLUMNS), "conversation_id": conversation_id,
                     **static}]  # fmt: skip
        return [{**row, **static} for _, row in sorted(partition.rows.items())]

    def _delete_message(self, conversation_id: str, seq: int) -> list[Row]:
        partition = self.messages.get(conversation_id)
        if partition is not None:
            partition.rows.pop(seq, None)
        return []

    def _finish_answer(self, *values: Any) -> list[Row]:
        *final, conversation_id, seq, expected = values
        row = self.messages.get(conversation_id, _Partition()).rows.get(seq)
        if row is None or row["status"] != expected:
            return [{"[applied]": False, "status": row["status"] if row else None}]
        columns = ("content", "tokens", "prompt_tokens", "cached_tokens", "model", "status")
        row.update(zip(columns, final, strict=True))
        return [{"[applied]": True}]

    def _add_choices(self, choices: dict[str, str], conversation_id: str) -> list[Row]:
        partition = self.messages.get(conversation_id)
        if partition is None or not (partition.last_seq or 0) > 0:
            return [{"[applied]": False, "last_seq": partition.last_seq if partition else None}]
        partition.selected.update(choices)
        return [{"[applied]": True}]

    # --- requests, context and keys -----------------------------------------------

    def _insert_request(self, *values: Any) -> list[Row]:
        row = dict(zip(REQUEST_COLUMNS, values, strict=True))
        return _insert_if_not_exists(self.requests, row["request_id"], row)

    def _select_request(self, request_id: str) -> list[Row]:
        found = self.requests.get(request_id)
        return [dict(found)] if found else []

    def _insert_summary(self, cid: str, through: str, content: str, created: float) -> list[Row]:
        self.summaries[cid][through] = {"conversation_id": cid, "through_message_id": through,
                                        "content": content, "created_at": created}  # fmt: skip
        return []

    def _select_summaries(self, conversation_id: str) -> list[Row]:
        return [dict(r) for _, r in sorted(self.summaries.get(conversation_id, {}).items())]

    def _insert_embedding(self, cid: str, model: str, message_id: str, vector: bytes) -> list[Row]:
        self.embeddings[cid][(model, message_id)] = vector
        return []

    def _select_embeddings(self, conversation_id: str, model: str) -> list[Row]:
        stored = self.embeddings.get(conversation_id, {})
        return [{"message_id": mid, "vector": v} for (m, mid), v in stored.items() if m == model]

    def _insert_api_key(self, key_hash: str, *values: Any) -> list[Row]:
        row = {"key_hash": key_hash, **dict(zip(API_KEY_COLUMNS, values, strict=True))}
        return _insert_if_not_exists(self.api_keys, key_hash, row)

    def _insert_api_key_id(self, key_id: str, key_hash: str) -> list[Row]:
        row = {"key_id": key_id, "key_hash": key_hash}
        return _insert_if_not_exists(self.api_key_ids, key_id, row)

    def _select_api_key(self, key_hash: str) -> list[Row]:
        found = self.api_keys.get(key_hash)
        return [dict(found)] if found else []

    def _select_api_keys(self) -> list[Row]:
        return [dict(row) for row in self.api_keys.values()]

    def _select_api_key_id(self, key_id: str) -> list[Row]:
        found = self.api_key_ids.get(key_id)
        return [{"key_hash": found["key_hash"]}] if found else []

    def _revoke_api_key(self, revoked_at: float, key_hash: str) -> list[Row]:
        found = self.api_keys.get(key_hash)
        if found is not None:
            found["revoked_at"] = revoked_at
        return [{"[applied]": found is not None}]

    # --- orgs and the response cache ------------------------------------------------

    def _insert_org_settings(
        self, org_id: str, response_cache: bool, max_concurrent_requests: int | None
    ) -> list[Row]:
        self.org_settings[org_id] = {
            "org_id": org_id,
            "response_cache": response_cache,
            "max_concurrent_requests": max_concurrent_requests,
        }
        return []

    def _select_org_settings(self, org_id: str) -> list[Row]:
        found = self.org_settings.get(org_id)
        return [dict(found)] if found else []

    def _select_all_org_settings(self) -> list[Row]:
        return [dict(row) for row in self.org_settings.values()]

    def _insert_cached_response(self, *values: Any) -> list[Row]:
        *columns, ttl_s = values
        assert isinstance(ttl_s, int) and ttl_s > 0, f"USING TTL {ttl_s!r}: a positive int"
        row = dict(zip(CACHED_RESPONSE_COLUMNS, columns, strict=True))
        self.response_cache[row["cache_key"]] = row  # an upsert; expiry: the store checks
        return []

    def _select_cached_response(self, cache_key: str) -> list[Row]:
        found = self.response_cache.get(cache_key)
        return [dict(found)] if found else []


def _refused_owner(found: Row | None) -> Row:
    """A refused `IF org_id = ? AND user_id = ?`: the current values of both."""
    return {"[applied]": False, "org_id": found["org_id"] if found else None,
            "user_id": found["user_id"] if found else None}  # fmt: skip


def _insert_if_not_exists(table: dict[str, Row], key: str, row: Row) -> list[Row]:
    """`INSERT … IF NOT EXISTS`: refused, it answers the row already stored."""
    found = table.get(key)
    if found is not None:
        return [{"[applied]": False, **found}]
    table[key] = row
    return [{"[applied]": True}]


# --- the usage ledger -----------------------------------------------------------------


class EmulatedCrash(RuntimeError):
    """A statement that failed on purpose (`EmulatedLedgerCql.crash`)."""


_CHARGED = ("prompt_tokens", "completion_tokens", "cached_tokens")
_PENDING = ("pending", "pending_id", "pending_at")
_COUNTERS = ("prompt_tokens", "completion_tokens", "cached_tokens", "requests")


class EmulatedLedgerCql:
    """`CqlSession` of the usage ledger (`ledger.cassandra_schema.STATEMENTS`) over Python
    dicts, with Cassandra's semantics where the ledger relies on them: lightweight
    transactions answer `[applied]` and, when refused, the current values of the columns
    they test (an `UPDATE … IF` on a missing row answers `[applied]` alone); counters
    start at null, so an update of one makes its row; a row never counted reads as no
    row. Each call yields to the event loop first, so concurrent callers interleave
    between statements. `crash` makes a chosen call fail, before or after it takes effect,
    as a crash of the writer would."""

    def __init__(self) -> None:
        self.charged: dict[str, Row] = {}
        self.totals: dict[tuple[str, str, str, str], Row] = {}
        self.calls: list[str] = []
        self.closed = False
        self._crashes: dict[str, tuple[int, bool]] = {}

    def crash(self, name: str, *, skip: int = 0, after_effect: bool = False) -> None:
        """The call of statement `name` after the next `skip` ones raises `EmulatedCrash`,
        having taken effect if `after_effect` (an answer lost on the way back)."""
        self._crashes[name] = (skip, after_effect)

    async def run(self, name: str, values: tuple) -> list[Row]:
        await asyncio.sleep(0)
        markers = ledger_cql.STATEMENTS[name].count("?")
        assert len(values) == markers, f"{name}: {len(values)} values for {markers} markers"
        self.calls.append(name)
        crash = self._crashes.get(name)
        if crash is not None and crash[0] > 0:
            self._crashes[name] = (crash[0] - 1, crash[1])
        elif crash is not None:
            del self._crashes[name]
            if crash[1]:
                getattr(self, f"_{name}")(*values)
            raise EmulatedCrash(f"{name} failed on purpose")
        return getattr(self, f"_{name}")(*values)

    async def batch(self, statements: list[tuple[str, tuple]]) -> list[Row]:
        raise AssertionError("the ledger runs no batch")

    async def close(self) -> None:
        self.closed = True

    def _select_charged(self, request_id: str) -> list[Row]:
        found = self.charged.get(request_id)
        return [dict(found)] if found else []

    def _insert_charged(self, request_id: str, *values: Any) -> list[Row]:
        row = dict(zip((*_CHARGED, *_PENDING, "charged_at"), values, strict=True))
        return _insert_if_not_exists(self.charged, request_id, row)

    def _update_charged(self, *values: Any) -> list[Row]:
        *new, request_id, prompt, completion, cached = values
        found = self.charged.get(request_id)
        tested = (*_CHARGED, "pending_id")
        if found is None:
            return [{"[applied]": False}]
        if tuple(found[c] for c in tested) != (prompt, completion, cached, None):
            return [{"[applied]": False, **{c: found[c] for c in tested}}]
        found.update(zip((*_CHARGED, *_PENDING, "charged_at"), new, strict=True))
        return [{"[applied]": True}]

    def _take_pending(
        self, pending_id: str, pending_at: float, request_id: str, expected: str
    ) -> list[Row]:
        return self._if_pending(request_id, expected, pending_id=pending_id,
                                pending_at=pending_at)  # fmt: skip

    def _clear_pending(self, request_id: str, expected: str) -> list[Row]:
        return self._if_pending(request_id, expected, **dict.fromkeys(_PENDING))

    def _if_pending(self, request_id: str, expected: str, **changes: Any) -> list[Row]:
        found = self.charged.get(request_id)
        if found is None:
            return [{"[applied]": False}]
        if found["pending_id"] != expected:
            return [{"[applied]": False, "pending_id": found["pending_id"]}]
        found.update(changes)
        return [{"[applied]": True}]

    def _add_to_total(self, *values: Any) -> list[Row]:
        *added, scope, account_id, period, period_key = values
        row = self.totals.setdefault((scope, account_id, period, period_key),
                                     dict.fromkeys(_COUNTERS))  # fmt: skip
        for column, amount in zip(_COUNTERS, added, strict=True):
            row[column] = (row[column] or 0) + amount
        return []

    def _select_total(self, *key: str) -> list[Row]:
        found = self.totals.get(key)  # type: ignore[arg-type]
        return [{"prompt_tokens": found["prompt_tokens"],
                 "completion_tokens": found["completion_tokens"]}] if found else []  # fmt: skip

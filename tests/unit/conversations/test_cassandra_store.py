"""The Cassandra store's parts that need no server: CQL text, binding, row mapping,
seq claims and the driver-to-asyncio bridge. (Its behaviour as a store is in
tests/integration/test_store_conformance.py.)"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import astuple, fields

import pytest

from conversations import cassandra_schema as cql
from conversations.cassandra_session import bind_values, bridge, parse_hosts
from conversations.cassandra_store import claim_seq
from conversations.store import ApiKey, Conversation, RequestRecord, StoredMessage
from schemas.events import Role
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier

UNSET = object()


def message(message_id: str = "m1", seq: int = 1, **fields) -> StoredMessage:
    values = dict(
        message_id=message_id, conversation_id="c1", seq=seq, role=Role.ASSISTANT,
        content="hi", parent_id="u1", model="tiny-random", tokens=3,
        status=RequestStatus.FINISHED_STOPPED, request_id="r1", created_at=12.5,
        prompt_tokens=40, cached_tokens=32,
    )  # fmt: skip
    values.update(fields)
    return StoredMessage(**values)


def row_of(stored: StoredMessage, **extra) -> dict:
    columns = [c.strip() for c in cql.MESSAGE_COLUMNS.split(",")]
    return {**dict(zip(columns, cql.message_values(stored), strict=True)), **extra}


# --- CQL text -------------------------------------------------------------------------


def test_schema_creates_keyspace_then_every_table_idempotently() -> None:
    statements = cql.schema_cql("chat_ks", replication_factor=3)

    assert statements[0] == (
        "CREATE KEYSPACE IF NOT EXISTS chat_ks WITH replication ="
        " {'class': 'SimpleStrategy', 'replication_factor': 3}"
    )
    created = statements[1 : 1 + len(cql.TABLES)]
    tables = [re.search(r"TABLE IF NOT EXISTS (\S+) \(", s).group(1) for s in created]
    assert tables == [
        "chat_ks.conversations", "chat_ks.conversations_by_owner", "chat_ks.messages",
        "chat_ks.message_ids", "chat_ks.summaries", "chat_ks.embeddings", "chat_ks.requests",
        "chat_ks.api_keys", "chat_ks.api_key_ids", "chat_ks.files", "chat_ks.files_by_owner",
        "chat_ks.file_chunks", "chat_ks.citations", "chat_ks.tool_steps", "chat_ks.org_settings",
        "chat_ks.response_cache",
    ]  # fmt: skip
    upgrades = statements[1 + len(cql.TABLES) :]
    assert upgrades and all(
        re.fullmatch(r"ALTER TABLE chat_ks\.\w+ ADD IF NOT EXISTS \w+ \w+", s) for s in upgrades
    ), upgrades


def test_upgrades_add_only_columns_the_tables_have() -> None:
    """An older keyspace ends up with the columns a new one is created with."""
    ddl = {re.search(r"chat\.(\w+)", s).group(1): s for s in cql.schema_cql("chat")[1:]
           if s.startswith("CREATE")}  # fmt: skip
    for upgrade in cql.UPGRADES:
        table, column, kind = re.fullmatch(
            r"ALTER TABLE \{ks\}\.(\w+) ADD IF NOT EXISTS (\w+) (\w+)", upgrade
        ).groups()
        assert f"\n    {column} {kind}" in ddl[table], upgrade


def test_tables_are_keyed_for_their_queries() -> None:
    ddl = {re.search(r"chat\.(\w+)", s).group(1): s for s in cql.schema_cql("chat")[1:]
           if s.startswith("CREATE")}  # fmt: skip

    assert "PRIMARY KEY (conversation_id, seq)" in ddl["messages"]
    assert "last_seq int STATIC" in ddl["messages"]
    assert "selected map<text, text> STATIC" in ddl["messages"]
    by_owner = ddl["conversations_by_owner"]
    assert "PRIMARY KEY ((org_id, user_id), created_at, conversation_id)" in by_owner
    assert "CLUSTERING ORDER BY (created_at DESC, conversation_id ASC)" in by_owner
    assert "key_hash text PRIMARY KEY" in ddl["api_keys"]
    assert "key_id text PRIMARY KEY" in ddl["api_key_ids"]
    assert "created_at double" in ddl["conversations"]
    assert "request_id text PRIMARY KEY" in ddl["requests"]
    assert "answers_offset bigint" in ddl["requests"]  # a Kafka offset is 64-bit
    assert "org_id text PRIMARY KEY" in ddl["org_settings"]
    assert "cache_key text PRIMARY KEY" in ddl["response_cache"]
    assert cql.STATEMENTS["insert_cached_response"].endswith("USING TTL ?")


@pytest.mark.parametrize("name", ["chat;DROP", "1abc", "a b", "ké", "x" * 49])
def test_keyspace_names_are_checked(name: str) -> None:
    with pytest.raises(ValueError):
        cql.statements(name)
    with pytest.raises(ValueError):
        cql.schema_cql(name)


def test_statements_name_the_keyspace_and_use_markers_only() -> None:
    statements = cql.statements("chat")

    assert set(statements) == set(cql.STATEMENTS)
    for name, text in statements.items():
        assert "{" not in text and "chat." in text, name
        assert "'" not in text, f"{name}: literal values belong in bound markers"


def test_writes_that_need_a_condition_have_one() -> None:
    statements = cql.statements("chat")
    conditions = {name: text.split(" IF ", 1)[1] for name, text in statements.items()
                  if " IF " in text}  # fmt: skip

    assert conditions == {
        "insert_conversation": "NOT EXISTS",
        "rename": "org_id = ? AND user_id = ?",
        "rename_by_owner": "EXISTS",
        "auto_title": "EXISTS",
        "auto_title_by_owner": "EXISTS",
        "delete_conversation": "org_id = ? AND user_id = ?",
        "claim_seq": "last_seq = ?",
        "finish_answer": "status = ?",
        "insert_request": "NOT EXISTS",
        "insert_message_id": "NOT EXISTS",
        "add_choices": "last_seq > 0",
        "insert_api_key": "NOT EXISTS",
        "insert_api_key_id": "NOT EXISTS",
        "revoke_api_key": "EXISTS",
        "insert_file": "NOT EXISTS",
        "delete_file": "org_id = ? AND user_id = ?",
    }


def test_record_values_match_their_insert_markers() -> None:
    statements = cql.statements("chat")
    conversation = Conversation("c1", "u1", "t", 1.0, "auto", "o1")
    request = RequestRecord("r1", "c1", "m1", "u1", 3, 42, "chat.deliver.gw-1", 1.0, "o1")
    key = ApiKey("u1", "o1", Tier.PRO, 1.0, "k1", "ci", 2.0)

    assert len(cql.message_values(message())) == statements["insert_message"].count("?")
    assert len(astuple(request)) == statements["insert_request"].count("?")
    assert cql.REQUEST_COLUMNS.split(", ") == [f.name for f in fields(RequestRecord)]
    assert len(cql.conversation_values(conversation)) == statements["insert_conversation"].count(
        "?"
    )
    assert len(cql.api_key_values("h", key)) == statements["insert_api_key"].count("?")


# --- binding and hosts ----------------------------------------------------------------


def test_inserts_leave_none_unset_and_conditions_keep_null() -> None:
    assert bind_values("insert_message", ("c1", None, 3), UNSET) == ("c1", UNSET, 3)
    assert bind_values("claim_seq", (1, "", "m1", "c1", None), UNSET) == (1, "", "m1", "c1", None)


def test_parse_hosts() -> None:
    assert parse_hosts(["a", "b"]) == (["a", "b"], 9042)
    assert parse_hosts(["a:9043", "b:9043"]) == (["a", "b"], 9043)
    with pytest.raises(ValueError):
        parse_hosts(["a:9042", "b:9043"])


# --- rows -> records ------------------------------------------------------------------


def test_message_rows_round_trip() -> None:
    stored = message()

    assert cql.message_of(row_of(stored)) == stored


def test_null_columns_read_as_defaults() -> None:
    stored = message(parent_id=None, model=None, request_id=None, tokens=0, prompt_tokens=0,
                     cached_tokens=0, content="")  # fmt: skip
    row = row_of(stored, tokens=None, prompt_tokens=None, cached_tokens=None, content=None)

    assert cql.message_of(row) == stored


def test_partition_reads_skip_static_only_rows_sort_and_dedupe() -> None:
    static_only = {**dict.fromkeys(row_of(message())), "conversation_id": "c1", "selected": None}
    rows = [
        row_of(message("m3", 3), selected={"": "m1"}),
        row_of(message("m1", 1), selected={"": "m1"}),
        row_of(message("m1", 2), selected={"": "m1"}),  # a copy left by a writer that died
    ]

    assert cql.messages_of([static_only]) == []
    assert [(m.message_id, m.seq) for m in cql.messages_of(rows)] == [("m1", 1), ("m3", 3)]
    assert cql.choices_of(rows) == {"": "m1"}
    assert cql.choices_of([static_only]) == {} and cql.choices_of([]) == {}


def test_applied_reads_the_lwt_flag() -> None:
    assert cql.applied([{"[applied]": True}])
    assert not cql.applied([{"[applied]": False, "user_id": "u9"}])
    assert not cql.applied([])


def test_conversation_and_summary_rows() -> None:
    row = {"conversation_id": "c1", "user_id": "u1", "title": None, "auto_title": None,
           "created_at": 5.0, "org_id": "o1"}  # fmt: skip
    older = {**row, "org_id": None}  # a row from before orgs: nobody's
    summaries = [
        {"conversation_id": "c1", "through_message_id": "b", "content": "x", "created_at": 2.0},
        {"conversation_id": "c1", "through_message_id": "a", "content": "y", "created_at": 1.0},
    ]

    assert cql.conversation_of(row) == Conversation("c1", "u1", "", 5.0, "", "o1")
    assert cql.conversation_of(older).org_id == ""
    assert [s.through_message_id for s in cql.summaries_of(summaries)] == ["a", "b"]


def test_api_key_rows_round_trip_and_old_rows_read_revoked() -> None:
    key = ApiKey("u1", "o1", Tier.PRO, 5.0, "k1", "ci", expires_at=9.0)
    columns = ["key_hash", *cql.API_KEY_COLUMNS.split(", ")]
    row = dict(zip(columns, cql.api_key_values("a" * 64, key), strict=True))
    old = {
        "key_hash": "b" * 64,
        "user_id": "u2",
        "org_id": "o2",
        "tier": "free",
        "created_at": 3.0,
    }  # an earlier chatpipe's sha256 row: none of the newer columns

    assert cql.api_key_of(row) == key
    assert cql.api_key_of(old) == ApiKey("u2", "o2", Tier.FREE, 3.0, "b" * 12,
                                         revoked_at=3.0)  # fmt: skip


def test_usage_lists_answers_only() -> None:
    user = message("u1", 1, role=Role.USER, prompt_tokens=0, cached_tokens=0)
    usage = cql.usage_of([user, message("a1", 2)])

    assert [(u.message_id, u.prompt_tokens, u.cached_tokens, u.completion_tokens)
            for u in usage] == [("a1", 40, 32, 3)]  # fmt: skip


# --- seq claims -----------------------------------------------------------------------


class Partition:
    """A `last_seq` that other writers advance between our read and our claim."""

    def __init__(self, last_seq: int | None, rivals: int = 0) -> None:
        self.last_seq = last_seq
        self.rivals = rivals
        self.tries: list[tuple[int, int | None]] = []

    async def try_claim(self, seq: int, expected: int | None) -> tuple[bool, int | None]:
        self.tries.append((seq, expected))
        if self.rivals:
            self.rivals -= 1
            self.last_seq = (self.last_seq or 0) + 1  # a rival won this round
        if self.last_seq != expected:
            return False, self.last_seq
        self.last_seq = seq
        return True, seq


async def test_first_claim_of_a_new_conversation_takes_one() -> None:
    partition = Partition(None)

    assert await claim_seq(partition.try_claim, None) == 1
    assert partition.tries == [(1, None)]


async def test_a_refused_claim_retries_after_the_winner() -> None:
    partition = Partition(4, rivals=2)

    assert await claim_seq(partition.try_claim, 4) == 7
    assert partition.tries == [(5, 4), (6, 5), (7, 6)]


async def test_a_stale_read_costs_one_round() -> None:
    partition = Partition(9)

    assert await claim_seq(partition.try_claim, 2) == 10
    assert partition.tries == [(3, 2), (10, 9)]


async def test_claims_give_up_after_the_limit() -> None:
    partition = Partition(0, rivals=10)

    with pytest.raises(RuntimeError):
        await claim_seq(partition.try_claim, 0, max_claims=3)


# --- driver bridge --------------------------------------------------------------------


class FakeResponseFuture:
    """Pages delivered from another thread, as the driver's I/O thread does."""

    def __init__(self, pages: list[list[dict]], error: Exception | None = None) -> None:
        self.pages = pages
        self.error = error
        self.has_more_pages = len(pages) > 1

    def add_callbacks(self, callback, errback) -> None:
        self.callback, self.errback = callback, errback
        threading.Thread(target=self._deliver).start()

    def start_fetching_next_page(self) -> None:
        self.pages.pop(0)
        self.has_more_pages = len(self.pages) > 1
        threading.Thread(target=self._deliver).start()

    def _deliver(self) -> None:
        if self.error is not None:
            self.errback(self.error)
        else:
            self.callback(self.pages[0])


async def test_bridge_collects_every_page() -> None:
    future = FakeResponseFuture([[{"a": 1}, {"a": 2}], [{"a": 3}], [{"a": 4}]])

    rows = await bridge(future, asyncio.get_running_loop())

    assert rows == [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}]


async def test_bridge_raises_the_driver_error() -> None:
    future = FakeResponseFuture([[]], error=TimeoutError("write timeout"))

    with pytest.raises(TimeoutError, match="write timeout"):
        await bridge(future, asyncio.get_running_loop())


def test_cql_parses_with_cqlsh_grammar() -> None:
    """Syntax only, with cqlsh's own grammar (`pip install cqlsh`); a server checks the rest."""
    grammar = pytest.importorskip("cqlshlib.cql3handling", reason="cqlsh is not installed")

    def parses(text: str) -> bool:
        text = text.replace("?", "0") + " ;"  # cqlsh never prepares: no bind markers
        tokens = grammar.CqlRuleSet.cql_massage_tokens(grammar.CqlRuleSet.lex(text))
        return grammar.CqlRuleSet.cql_whole_parse_tokens(tokens, srcstr=text) is not None

    statements = cql.statements("chat")
    claim = f"BEGIN BATCH {statements['insert_message']}; {statements['claim_seq']}; APPLY BATCH"
    assert not parses("UPDATE chat.t SET WHERE k = ?")  # the check can fail
    assert all(parses(text) for text in cql.schema_cql("chat"))
    assert [name for name, text in statements.items() if not parses(text)] == []
    assert parses(claim)

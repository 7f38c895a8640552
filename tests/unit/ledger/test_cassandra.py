"""The Cassandra ledger's parts that need no server: its CQL text, the values its code
binds, and its wiring (`build_ledger`, `chatpipe store create-schema`). Its behaviour as
a ledger is in tests/integration/test_ledger_conformance.py."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from chatpipe.cli import app
from chatpipe.settings import Settings
from chatpipe.wiring import build_ledger
from ledger import cassandra_schema as cql
from ledger.cassandra import CassandraLedger
from ledger.charges import Account, Charge, Tokens


def ddl() -> dict[str, str]:
    return {re.search(r"chat\.(\w+) \(", s).group(1): s for s in cql.schema_cql("chat")[1:]}


def test_schema_creates_the_keyspace_then_the_ledger_tables_idempotently() -> None:
    statements = cql.schema_cql("chat_ks", replication_factor=3)

    assert statements[0] == (
        "CREATE KEYSPACE IF NOT EXISTS chat_ks WITH replication ="
        " {'class': 'SimpleStrategy', 'replication_factor': 3}"
    )
    assert [
        re.match(r"CREATE TABLE IF NOT EXISTS (\S+) \(", s).group(1) for s in statements[1:]
    ] == ["chat_ks.ledger_charged", "chat_ks.ledger_totals"]


def test_tables_are_keyed_for_their_queries() -> None:
    tables = ddl()

    assert "request_id text PRIMARY KEY" in tables["ledger_charged"]
    assert "PRIMARY KEY ((scope, account_id, period, period_key)))" in tables["ledger_totals"]
    assert re.findall(r"WHERE (.*)", cql.STATEMENTS["select_charged"]) == ["request_id = ?"]
    for name in ("select_total", "add_to_total"):
        where = cql.STATEMENTS[name].split(" WHERE ")[1]
        assert where == "scope = ? AND account_id = ? AND period = ? AND period_key = ?", name


def test_totals_are_counters_and_charged_tokens_64_bit() -> None:
    tables = ddl()
    columns = dict(re.findall(r"\n    (\w+) (text|counter)", tables["ledger_totals"]))

    assert {c for c, kind in columns.items() if kind == "counter"} == {
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "requests",
    }
    assert {c for c, kind in columns.items() if kind != "counter"} == {
        "scope",
        "account_id",
        "period",
        "period_key",
    }
    for column in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        assert f"{column} bigint" in tables["ledger_charged"], column


def test_statements_name_the_keyspace_and_use_markers_only() -> None:
    statements = cql.statements("chat")

    assert set(statements) == set(cql.STATEMENTS)
    for name, text in statements.items():
        assert "{" not in text and "chat.ledger_" in text, name
        assert "'" not in text, f"{name}: literal values belong in bound markers"


@pytest.mark.parametrize("name", ["chat;DROP", "1abc", "a b", "x" * 49])
def test_keyspace_names_are_checked(name: str) -> None:
    with pytest.raises(ValueError):
        cql.statements(name)
    with pytest.raises(ValueError):
        cql.schema_cql(name)


def test_every_write_of_a_charged_row_is_conditional() -> None:
    conditions = {name: text.split(" IF ", 1)[1] for name, text in cql.STATEMENTS.items()
                  if " IF " in text}  # fmt: skip

    assert conditions == {
        "insert_charged": "NOT EXISTS",
        "update_charged": "prompt_tokens = ? AND completion_tokens = ? AND cached_tokens = ?"
        " AND pending_id = null",
        "take_pending": "pending_id = ?",
        "clear_pending": "pending_id = ?",
    }


# What `CassandraLedger` binds to each statement; the emulator checks the same on each call.
MARKERS = {
    "select_charged": 1,
    "insert_charged": 8,
    "update_charged": 11,
    "take_pending": 4,
    "clear_pending": 2,
    "add_to_total": 8,
    "select_total": 4,
}


def test_every_statement_has_the_markers_its_caller_binds() -> None:
    charge = Charge(Account.org("acme"), "day", "2025-03-07", Tokens(10, 5, 4), 1)

    assert {name: text.count("?") for name, text in cql.STATEMENTS.items()} == MARKERS
    assert len(cql.total_values(charge)) == MARKERS["add_to_total"]


def test_a_pending_charge_reads_back_as_written() -> None:
    charges = [
        Charge(Account.user("acme", "zoë"), "month", "2025-03", Tokens(10, 5, 4), 1),
        Charge(Account.org("acme"), "day", "2025-03-07", Tokens(0, 60, 0), 0),
    ]
    assert cql.charges_of(cql.charges_text(charges)) == charges


def test_cql_parses_with_cqlsh_grammar() -> None:
    """Syntax only, with cqlsh's own grammar (`pip install cqlsh`); a server checks the rest."""
    grammar = pytest.importorskip("cqlshlib.cql3handling", reason="cqlsh is not installed")

    def parses(text: str) -> bool:
        text = text.replace("?", "0") + " ;"
        tokens = grammar.CqlRuleSet.cql_massage_tokens(grammar.CqlRuleSet.lex(text))
        return grammar.CqlRuleSet.cql_whole_parse_tokens(tokens, srcstr=text) is not None

    assert not parses("UPDATE chat.t SET WHERE k = ?")  # the check can fail
    assert all(parses(text) for text in cql.schema_cql("chat"))
    assert [name for name, text in cql.statements("chat").items() if not parses(text)] == []


# --- wiring -----------------------------------------------------------------------------


class _Session:
    async def close(self) -> None:
        pass


async def test_store_cassandra_gets_the_cassandra_ledger_in_the_stores_keyspace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(store="cassandra", cassandra_hosts=["db1:9042", "db2:9042"],
                        cassandra_keyspace="prod", cassandra_replication_factor=3,
                        cassandra_create_schema=False)  # fmt: skip
    ledger = build_ledger(settings)
    assert isinstance(ledger, CassandraLedger)

    connected = []

    async def connect(*args, **kwargs) -> _Session:
        connected.append((args, kwargs))
        return _Session()

    monkeypatch.setattr("ledger.cassandra.DriverSession.connect", connect)
    assert connected == []  # built, not connected: `open` connects
    await ledger.open()
    await ledger.close()
    assert connected == [
        (
            (["db1:9042", "db2:9042"], "prod"),
            {"create_schema": False, "replication_factor": 3, "schema": cql},
        )
    ]


def test_create_schema_makes_the_ledger_tables_beside_the_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = []

    def creator(what: str):
        async def create(hosts: list[str], keyspace: str, replication_factor: int) -> None:
            made.append((what, hosts, keyspace, replication_factor))

        return create

    monkeypatch.setattr("conversations.cassandra_store.create_schema", creator("store"))
    monkeypatch.setattr("ledger.cassandra.create_schema", creator("ledger"))
    monkeypatch.setenv("CHATPIPE_STORE", "cassandra")
    monkeypatch.setenv("CHATPIPE_CASSANDRA_HOSTS", '["db1"]')
    monkeypatch.setenv("CHATPIPE_CASSANDRA_KEYSPACE", "prod")

    result = CliRunner().invoke(app, ["store", "create-schema"])
    assert result.exit_code == 0, result.output
    assert made == [("store", ["db1"], "prod", 1), ("ledger", ["db1"], "prod", 1)]

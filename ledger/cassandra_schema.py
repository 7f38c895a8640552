"""The usage ledger's tables and statements on Cassandra (no I/O), in the conversation
store's keyspace, every table prefixed `ledger_`.

* `ledger_charged` by request_id: what the request was charged (each kind of token, up
  to the most any of its events reports), and the charge its last writer took but has
  not yet added to the totals (`pending`, JSON; `pending_id`, who holds it; `pending_at`,
  since when). Written only with lightweight transactions (`ledger.cassandra`).
* `ledger_totals` by (scope, account_id, period, period_key): counters, one partition
  per account and period, so a quota check reads one row per account.
"""

from __future__ import annotations

import json

from conversations.cassandra_schema import _check_name, keyspace_cql
from ledger.charges import Account, Charge, Tokens

TABLES = (
    """CREATE TABLE IF NOT EXISTS {ks}.ledger_charged (
    request_id text PRIMARY KEY,
    prompt_tokens bigint,
    completion_tokens bigint,
    cached_tokens bigint,
    pending text,
    pending_id text,
    pending_at double,
    charged_at double)""",
    """CREATE TABLE IF NOT EXISTS {ks}.ledger_totals (
    scope text,
    account_id text,
    period text,
    period_key text,
    prompt_tokens counter,
    completion_tokens counter,
    cached_tokens counter,
    requests counter,
    PRIMARY KEY ((scope, account_id, period, period_key)))""",
)

_CHARGED = "prompt_tokens, completion_tokens, cached_tokens"
_TOTAL = "WHERE scope = ? AND account_id = ? AND period = ? AND period_key = ?"

STATEMENTS = {
    "select_charged": f"SELECT {_CHARGED}, pending, pending_id, pending_at"
    " FROM {ks}.ledger_charged WHERE request_id = ?",
    # a request's first charge
    "insert_charged": f"INSERT INTO {{ks}}.ledger_charged (request_id, {_CHARGED}, pending,"
    " pending_id, pending_at, charged_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    # a later one, over exactly what was read, and only once the last charge is counted
    "update_charged": "UPDATE {ks}.ledger_charged SET prompt_tokens = ?, completion_tokens = ?,"
    " cached_tokens = ?, pending = ?, pending_id = ?, pending_at = ?, charged_at = ?"
    " WHERE request_id = ? IF prompt_tokens = ? AND completion_tokens = ? AND cached_tokens = ?"
    " AND pending_id = null",
    # a charge whose writer is gone, taken over by whoever finds it
    "take_pending": "UPDATE {ks}.ledger_charged SET pending_id = ?, pending_at = ?"
    " WHERE request_id = ? IF pending_id = ?",
    "clear_pending": "UPDATE {ks}.ledger_charged SET pending = null, pending_id = null,"
    " pending_at = null WHERE request_id = ? IF pending_id = ?",
    "add_to_total": "UPDATE {ks}.ledger_totals SET prompt_tokens = prompt_tokens + ?,"
    " completion_tokens = completion_tokens + ?, cached_tokens = cached_tokens + ?,"
    f" requests = requests + ? {_TOTAL}",
    "select_total": f"SELECT prompt_tokens, completion_tokens FROM {{ks}}.ledger_totals {_TOTAL}",
}


def schema_cql(keyspace: str, replication_factor: int = 1) -> list[str]:
    """The keyspace (if the store has not made it) and the ledger's tables (idempotent)."""
    return [keyspace_cql(keyspace, replication_factor)] + [t.format(ks=keyspace) for t in TABLES]


def statements(keyspace: str) -> dict[str, str]:
    """The ledger's statements (name -> CQL with `?` markers) for `keyspace`."""
    _check_name(keyspace)
    return {name: text.format(ks=keyspace) for name, text in STATEMENTS.items()}


def charges_text(charges: list[Charge]) -> str:
    """`pending`: the charges of one event, as JSON."""
    return json.dumps([
        [c.account.scope, c.account.account_id, c.period, c.period_key, *c.tokens, c.requests]
        for c in charges
    ], ensure_ascii=False)  # fmt: skip


def charges_of(text: str) -> list[Charge]:
    charges = []
    for scope, account_id, period, period_key, prompt, completion, cached, requests in json.loads(
        text
    ):
        tokens = Tokens(prompt, completion, cached)
        charges.append(Charge(Account(scope, account_id), period, period_key, tokens, requests))
    return charges


def total_values(charge: Charge) -> tuple:
    """The values of `add_to_total`."""
    c = charge
    return (*c.tokens, c.requests, c.account.scope, c.account.account_id, c.period,
            c.period_key)  # fmt: skip

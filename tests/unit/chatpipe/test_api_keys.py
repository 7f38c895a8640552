"""Tenant provisioning: `chatpipe keys create / list / revoke` on a real SQLite file, the
key check (revoked, expired) with an injected clock, keyed hashing, where the key
secret comes from, and who owns a live request."""

from __future__ import annotations

import asyncio
import calendar
import hashlib
import json
import os
import re
import sqlite3
import stat
import time
from pathlib import Path

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from chatpipe.api_keys import (
    cli_settings,
    development_secret,
    development_settings,
    new_key,
    require_key_secret,
    secret_file,
)
from chatpipe.cli import KEY_FIELDS, app
from chatpipe.settings import Settings
from conversations.sqlite_store import SQLiteStore
from conversations.store import ApiKey, hash_api_key
from gateway.edge.auth import check_key
from gateway.errors import ApiError
from gateway.streaming.generation import LiveRequests
from schemas.events import ChatMessage, GenerationRequest, Role, SamplingOptions
from schemas.topics import Tier

SECRET = "unit-key-secret"


@pytest.fixture
def database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SQLite file the CLI works on, with CHATPIPE_KEY_SECRET set."""
    path = tmp_path / "keys.db"
    monkeypatch.setenv("CHATPIPE_DATABASE_PATH", str(path))
    monkeypatch.setenv("CHATPIPE_KEY_SECRET", SECRET)
    monkeypatch.delenv("CHATPIPE_STORE", raising=False)
    return path


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def create(*args: str) -> tuple[str, str]:
    """`keys create` → (its output, the key on its last line)."""
    code, out, err = cli("keys", "create", *args)
    assert code == 0, out + err
    return out, out.splitlines()[-1]


def listed() -> list[dict]:
    code, out, err = cli("keys", "list", "--json")
    assert code == 0, out + err
    return json.loads(out)


def find(path: Path, key: str, secret: bytes = SECRET.encode()) -> ApiKey | None:
    async def lookup() -> ApiKey | None:
        store = SQLiteStore(path, key_secret=secret)
        await store.open()
        try:
            return await store.find_api_key(key)
        finally:
            await store.close()

    return asyncio.run(lookup())


# --- the CLI ------------------------------------------------------------------------------


def test_create_prints_the_key_once_alone_on_the_last_line(database: Path) -> None:
    before = time.time()
    out, key = create("--user", "alice", "--org", "acme", "--tier", "pro", "--name", "laptop")

    key_id, secret = re.fullmatch(r"cp-([0-9a-f]{12})-([A-Za-z0-9_-]{43})", key).groups()
    assert out.count(key) == 1 and out.count(secret) == 1
    assert key_id in out.splitlines()[0]
    found = find(database, key)
    assert found is not None
    assert (found.key_id, found.user_id, found.org_id, found.tier, found.name) == (
        key_id, "alice", "acme", Tier.PRO, "laptop")  # fmt: skip
    assert before <= found.created_at <= time.time()
    assert (found.expires_at, found.revoked_at) == (None, None)
    assert key.encode() not in database.read_bytes() and secret.encode() not in (
        database.read_bytes())  # fmt: skip


def test_list_shows_every_key_without_secrets(database: Path) -> None:
    _, first = create("--user", "alice", "--org", "acme", "--tier", "free")
    _, second = create("--user", "alice", "--org", "globex", "--tier", "enterprise",
                       "--name", "ci", "--expires-in", "30")  # fmt: skip

    rows = listed()
    code, table, _ = cli("keys", "list")

    assert [list(row) for row in rows] == [list(KEY_FIELDS)] * 2
    assert KEY_FIELDS == ("id", "user", "org", "tier", "name", "created", "expires",
                          "max_concurrent", "revoked")  # fmt: skip
    one, two = rows
    assert (one["id"], one["user"], one["org"], one["tier"], one["name"]) == (
        first.split("-")[1], "alice", "acme", "free", "")  # fmt: skip
    assert (two["id"], two["org"], two["tier"], two["name"]) == (
        second.split("-")[1], "globex", "enterprise", "ci")  # fmt: skip
    assert one["expires"] is None and one["revoked"] is False
    created, expires = (calendar.timegm(time.strptime(two[f], "%Y-%m-%dT%H:%M:%SZ"))
                        for f in ("created", "expires"))  # fmt: skip
    assert expires - created == pytest.approx(30 * 86_400, abs=1)
    assert code == 0 and table.splitlines()[0].split() == list(KEY_FIELDS)
    for key in (first, second):
        secret = key.split("-", 2)[2]
        assert secret not in table and secret not in json.dumps(rows)


def test_revoke_marks_the_key_revoked_at_once(database: Path) -> None:
    _, key = create("--user", "bob", "--org", "acme", "--tier", "pro")
    _, kept = create("--user", "bob", "--org", "acme", "--tier", "pro")
    key_id = key.split("-")[1]

    code, out, _ = cli("keys", "revoke", key_id)

    assert code == 0 and key_id in out
    revoked = find(database, key)
    assert revoked is not None and revoked.refusal(time.time()) is not None
    other = find(database, kept)
    assert other is not None and other.refusal(time.time()) is None
    assert [row["revoked"] for row in listed()] == [True, False]
    assert cli("keys", "revoke", key_id)[0] == 0  # again: still revoked
    code, _, err = cli("keys", "revoke", "no-such-id")
    assert code == 1 and "no-such-id" in err


def test_a_key_created_to_expire_expires(database: Path) -> None:
    _, key = create("--user", "carol", "--org", "acme", "--tier", "free",
                    "--expires-in", "0.5")  # fmt: skip

    found = find(database, key)

    assert found is not None and found.expires_at is not None
    assert found.expires_at - found.created_at == pytest.approx(43_200)
    assert found.refusal(found.expires_at - 1) is None
    assert found.refusal(found.expires_at) == "this API key has expired"


@pytest.mark.parametrize("args", [
    ["--user", "", "--org", "acme", "--tier", "pro"],
    ["--user", "u", "--org", " ", "--tier", "pro"],
    ["--user", "u", "--org", "acme", "--tier", "gold"],
    ["--user", "u", "--org", "acme", "--tier", "pro", "--expires-in", "0"],
    ["--user", "u", "--org", "acme", "--tier", "pro", "--expires-in", "-1"],
    ["--user", "u", "--org", "acme", "--tier", "pro", "--expires-in", "1e8"],  # year 275817
    ["--user", "u", "--org", "acme", "--tier", "pro", "--expires-in", "inf"],
    ["--user", "u", "--org", "acme", "--tier", "pro", "--expires-in", "nan"],
    ["--user", "u", "--tier", "pro"],
])  # fmt: skip
def test_create_refuses_bad_arguments(database: Path, args: list[str]) -> None:
    assert cli("keys", "create", *args)[0] != 0
    assert listed() == []


def test_create_needs_the_key_secret(database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHATPIPE_KEY_SECRET")

    code, out, err = cli("keys", "create", "--user", "u", "--org", "o", "--tier", "pro")

    assert code == 1 and "CHATPIPE_KEY_SECRET" in err and "cp-" not in out
    assert listed() == []  # listing needs no secret


def test_the_cli_uses_the_secret_chatpipe_up_keeps_beside_its_database(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CHATPIPE_KEY_SECRET")
    up_secret = development_secret(database)  # as `chatpipe up` made it

    _, key = create("--user", "u", "--org", "o", "--tier", "pro")

    assert find(database, key, up_secret) is not None
    assert find(database, key, SECRET.encode()) is None


# --- keyed hashes -----------------------------------------------------------------------


def test_a_stored_hash_is_an_hmac_that_changes_with_the_secret(database: Path) -> None:
    _, key = create("--user", "dave", "--org", "acme", "--tier", "pro")

    [(stored,)] = sqlite3.connect(database).execute("SELECT key_hash FROM api_keys").fetchall()

    assert stored != hashlib.sha256(key.encode()).hexdigest()
    assert stored == hash_api_key(key, SECRET.encode())
    assert hash_api_key(key, b"another secret") != stored
    assert find(database, key, b"another secret") is None  # a rotated secret: no key opens


def test_new_keys_are_random_with_their_id_inside() -> None:
    (id1, key1), (id2, key2) = new_key(), new_key()

    assert id1 != id2 and key1 != key2
    assert key1.startswith(f"cp-{id1}-") and len(key1.split("-", 2)[2]) == 43


# --- the key check (pure, clock injected) -----------------------------------------------


def test_the_check_refuses_unknown_revoked_and_expired_keys() -> None:
    key = ApiKey("u", "o", Tier.PRO, created_at=100.0, key_id="k", expires_at=200.0)

    assert check_key(key, now=199.999) == key
    for found, now, message in [
        (None, 150.0, "unknown API key"),
        (key, 200.0, "this API key has expired"),
        (key, 10_000.0, "this API key has expired"),
        (ApiKey("u", "o", Tier.PRO, revoked_at=150.0), 0.0, "this API key has been revoked"),
    ]:  # fmt: skip
        with pytest.raises(ApiError) as refused:
            check_key(found, now)
        assert (refused.value.status_code, refused.value.code) == (401, "invalid_api_key")
        assert refused.value.detail == message
    assert ApiKey("u", "o", Tier.PRO).refusal(now=1e12) is None  # no expiry: never expires


# --- where the key secret comes from ----------------------------------------------------


def test_chatpipe_up_keeps_one_secret_beside_its_database(tmp_path: Path) -> None:
    database = tmp_path / "sub" / "chat.db"
    settings = Settings(database_path=database)

    first = development_settings(settings)
    again = development_settings(Settings(database_path=database))

    path = secret_file(database)
    assert path == tmp_path / "sub" / "chat.db.key-secret"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert first.gateway.key_secret is not None and again.gateway.key_secret is not None
    assert (
        first.gateway.key_secret.get_secret_value() == again.gateway.key_secret.get_secret_value()
    )
    assert first.gateway.key_secret.get_secret_value() == path.read_text().strip()
    assert len(first.gateway.key_secret.get_secret_value()) >= 43
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no draft left behind


def test_a_configured_secret_wins_and_no_file_is_made(tmp_path: Path) -> None:
    settings = Settings(database_path=tmp_path / "chat.db", key_secret=SecretStr("set"))

    assert development_settings(settings) is settings
    assert cli_settings(settings) is settings
    assert not secret_file(tmp_path / "chat.db").exists()


def test_without_a_secret_cassandra_and_a_gateway_alone_refuse(tmp_path: Path) -> None:
    cassandra = Settings(store="cassandra", cassandra_hosts=["db"])
    with pytest.raises(SystemExit, match="CHATPIPE_KEY_SECRET"):
        development_settings(cassandra)
    with pytest.raises(SystemExit, match="CHATPIPE_KEY_SECRET"):
        require_key_secret(Settings(database_path=tmp_path / "c.db"), "chatpipe gateway")
    with pytest.raises(SystemExit, match="CHATPIPE_KEY_SECRET"):
        require_key_secret(Settings(key_secret=SecretStr("")), "chatpipe gateway")
    require_key_secret(Settings(key_secret=SecretStr("x")), "chatpipe gateway")
    assert not secret_file(tmp_path / "c.db").exists()  # a gateway alone never makes one


def test_the_cli_makes_no_secret_file(tmp_path: Path) -> None:
    settings = Settings(database_path=tmp_path / "chat.db")

    assert cli_settings(settings).gateway.key_secret is None
    assert not secret_file(tmp_path / "chat.db").exists()


# --- live requests are owned by (org, user) ---------------------------------------------


def test_a_live_request_is_its_owners_in_its_org_only() -> None:
    live = LiveRequests()
    request = GenerationRequest(
        request_id="r1", conversation_id="c1", message_id="m1", user_id="alice",
        org_id="acme", tier=Tier.PRO, model="tiny-random",
        messages=(ChatMessage(role=Role.USER, content="hi"),), sampling=SamplingOptions(),
        reply_to="chat.deliver.gw", cache_salt="acme",
    )  # fmt: skip
    live.add(request)

    assert live.owned("r1", "acme", "alice") == request
    assert live.owned("r1", "globex", "alice") is None  # the same user id, another org
    assert live.owned("r1", "acme", "mallory") is None
    assert live.owned("r2", "acme", "alice") is None


# --- the development user -----------------------------------------------------------------


async def test_each_new_dev_key_revokes_the_previous_ones(tmp_path: Path) -> None:
    from chatpipe.wiring import DEV_USER, ensure_dev_key

    store = SQLiteStore(tmp_path / "chat.db", key_secret=b"s")
    await store.open()
    settings = Settings(database_path=tmp_path / "chat.db")
    await store.add_api_key("users-own", ApiKey(DEV_USER, DEV_USER, Tier.PRO, name="mine"))
    try:
        first = await ensure_dev_key(store, settings)  # a random key, as `chatpipe up` makes
        second = await ensure_dev_key(store, settings)
        chosen = settings.replace(**{"dev_api_key": "chosen"})
        assert await ensure_dev_key(store, chosen) == "chosen"
        assert await ensure_dev_key(store, chosen) == "chosen"  # the same key: kept

        keys = {key: await store.find_api_key(key) for key in (first, second, "chosen")}
        own = await store.find_api_key("users-own")
    finally:
        await store.close()

    assert first != second and first.startswith("cp-dev-")
    assert [(k.user_id, k.org_id) for k in keys.values() if k] == [(DEV_USER, DEV_USER)] * 3
    assert [k.refusal(time.time()) is None for k in keys.values() if k] == [False, False, True]
    assert own is not None and own.revoked_at is None  # not a development key


async def test_a_gateway_alone_refuses_to_start_without_a_key_secret(tmp_path: Path) -> None:
    from chatpipe.wiring import run_stage

    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_path=tmp_path / "c.db",
                        dev_api_key="dev-key")  # fmt: skip
    with pytest.raises(SystemExit, match="chatpipe gateway: set CHATPIPE_KEY_SECRET"):
        await run_stage("gateway", settings)
    assert not (tmp_path / "c.db").exists() and not secret_file(tmp_path / "c.db").exists()


def test_orgs_set_turns_the_response_cache_on_and_off_and_list_shows_it(
    database: Path,
) -> None:
    assert cli("orgs", "set", "acme", "--response-cache")[:2] == (
        0,
        "org 'acme': response cache on, max concurrent requests of the tier\n",
    )
    assert cli("orgs", "set", "globex")[:2] == (
        0,
        "org 'globex': response cache off, max concurrent requests of the tier\n",
    )
    code, out, _ = cli("orgs", "list", "--json")
    assert code == 0 and json.loads(out) == [
        {"org": "acme", "response_cache": True, "max_concurrent_requests": None},
        {"org": "globex", "response_cache": False, "max_concurrent_requests": None},
    ]
    cli("orgs", "set", "acme", "--no-response-cache")
    assert cli("orgs", "list")[1] == (
        "acme  response_cache=off  max_concurrent_requests=tier\n"
        "globex  response_cache=off  max_concurrent_requests=tier\n"
    )
    assert cli("orgs", "set", " ")[0] != 0


def test_orgs_set_changes_only_the_settings_it_names(database: Path) -> None:
    cli("orgs", "set", "acme", "--response-cache")
    assert cli("orgs", "set", "acme", "--max-concurrent-requests", "5")[:2] == (
        0,
        "org 'acme': response cache on, max concurrent requests 5\n",
    )
    assert cli("orgs", "set", "acme", "--no-response-cache")[1] == (
        "org 'acme': response cache off, max concurrent requests 5\n"
    )
    assert cli("orgs", "set", "acme", "--max-concurrent-requests", "tier")[1] == (
        "org 'acme': response cache off, max concurrent requests of the tier\n"
    )
    for bad in ("0", "-2", "many", "1.5"):
        code, out, err = cli("orgs", "set", "acme", "--max-concurrent-requests", bad)
        assert code != 0 and "--max-concurrent-requests" in out + err, bad
    code, out, _ = cli("orgs", "list", "--json")
    assert json.loads(out) == [
        {"org": "acme", "response_cache": False, "max_concurrent_requests": None}
    ]


def test_a_key_created_with_its_own_concurrency_limit_keeps_and_lists_it(
    database: Path,
) -> None:
    _, own = create("--user", "ann", "--org", "acme", "--tier", "pro",
                    "--max-concurrent-requests", "3")  # fmt: skip
    _, plain = create("--user", "ann", "--org", "acme", "--tier", "pro")

    found, default = find(database, own), find(database, plain)
    assert found is not None and found.max_concurrent_requests == 3
    assert default is not None and default.max_concurrent_requests is None
    assert [row["max_concurrent"] for row in listed()] == [3, None]
    code, out, err = cli("keys", "create", "--user", "u", "--org", "o", "--tier", "pro",
                         "--max-concurrent-requests", "0")  # fmt: skip
    assert code != 0 and "--max-concurrent-requests" in out + err

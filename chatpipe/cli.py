"""`chatpipe` command line: run the whole product or one stage."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from chatpipe.settings import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
topics_app = typer.Typer(no_args_is_help=True, help="Kafka topic provisioning.")
app.add_typer(topics_app, name="topics")
store_app = typer.Typer(no_args_is_help=True, help="Conversation store provisioning.")
app.add_typer(store_app, name="store")

# Every stage a deployment runs as its own process (docker-compose.yml, k8s/).
STAGES = ("gateway", "scheduler", "worker", "safety", "recorder", "billing")


def _settings(**overrides: object) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


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
    asyncio.run(wiring.run_all(settings))


def _run_stage(stage: str, **overrides: object) -> None:
    from chatpipe import wiring

    asyncio.run(wiring.run_stage(stage, _settings(**overrides)))


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


@app.command("settings")
def show_settings() -> None:
    """Every setting (environment variable, default, meaning) as a Markdown table."""
    from chatpipe.settings import settings_table

    typer.echo(settings_table())


@topics_app.command("create")
def topics_create() -> None:
    """Create every shared topic (idempotent)."""
    from bus.topics import ensure_topics

    settings = Settings()
    if not settings.kafka_bootstrap_servers:
        raise typer.BadParameter("set KAFKA_BOOTSTRAP_SERVERS")
    created = asyncio.run(ensure_topics(settings.kafka_bootstrap_servers, settings))
    typer.echo(f"created: {', '.join(created) or 'nothing (all exist)'}")


@store_app.command("create-schema")
def store_create_schema() -> None:
    """Create the conversation store's schema (idempotent).

    With Cassandra, the one-off job of a deployment whose stages run with
    CHATPIPE_CASSANDRA_CREATE_SCHEMA=false.
    """
    settings = Settings()
    if settings.store == "cassandra":
        from conversations.cassandra_store import create_schema

        asyncio.run(create_schema(settings.cassandra_hosts, settings.cassandra_keyspace,
                                  settings.cassandra_replication_factor))  # fmt: skip
        typer.echo(f"schema ready in keyspace {settings.cassandra_keyspace}")
        return
    from conversations.sqlite_store import SQLiteStore

    async def create() -> None:
        store = SQLiteStore(settings.database_path)
        await store.open()
        await store.close()

    asyncio.run(create())
    typer.echo(f"schema ready in {settings.database_path}")


@app.command("make-tiny-model")
def make_tiny_model(
    out: Annotated[Path, typer.Option(help="directory to write")] = Settings.model_fields[
        "model"
    ].default,
) -> None:
    """Build the tiny random-weight Llama and its tokenizer used by tests and `make run`."""
    from chatpipe.tiny_model import build_tiny_model

    build_tiny_model(out)
    typer.echo(f"tiny model written to {out}")


@app.command()
def chat(
    url: Annotated[str, typer.Option(help="the gateway")] = "http://127.0.0.1:8000",
    api_key: Annotated[str | None, typer.Option(envvar="CHATPIPE_API_KEY",
                                                help="printed by `chatpipe up`")] = None,
    model: Annotated[str | None, typer.Option(help="default: the gateway's")] = None,
    conversation: Annotated[str | None, typer.Option(help="continue this conversation")] = None,
) -> None:
    """Chat in the terminal with a running gateway; /help lists the commands."""
    from chatpipe.terminal import run_terminal

    key = api_key or typer.prompt("API key", hide_input=True)
    raise typer.Exit(run_terminal(url, key, model, conversation))


if __name__ == "__main__":
    app()

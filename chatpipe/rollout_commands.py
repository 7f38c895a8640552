"""`chatpipe rollout`: set or roll back a model alias's weighted versions on every gateway
at once (a record on `chat.rollout`, which each gateway reads live), show them, and
compare the versions from what the topics recorded.

Weights are checked here against CHATPIPE_SERVED_MODELS, as the gateways check them: a
bad one exits 2 with the reason and writes nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from chatpipe.analytics_commands import DATA_HELP, DB_HELP, locations, period_of, read_topics
from chatpipe.settings import Settings
from gateway.rollout import RolloutError, check_weights, parse_weights, rollback_weights
from schemas import topics
from schemas.events import RolloutSet

rollout_app = typer.Typer(
    no_args_is_help=True, help="Model aliases' weighted versions: set, roll back, show, compare."
)


def _history(kafka: Any, settings: Settings, alias: str | None = None
             ) -> dict[str, list[dict[str, float]]]:  # fmt: skip
    """Every alias's weights, oldest first: the settings', then each chat.rollout record
    the gateways applied (one naming a version not served they dead-lettered)."""
    from bus.replay import read_to_end

    found = {name: [dict(weights)] for name, weights in settings.scheduler.model_aliases.items()}
    records = asyncio.run(read_to_end(kafka, topics.ROLLOUT, RolloutSet))
    for _, _, record in records:
        try:
            check_weights(record.alias, record.weights, settings.models)
        except RolloutError:
            continue
        found.setdefault(record.alias, []).append(record.weights)
    return found if alias is None else {alias: found.get(alias, [])}


def _publish(kafka: Any, record: RolloutSet) -> None:
    from bus.clients import Publisher

    async def send() -> None:
        producer = kafka.producer()
        await producer.start()
        try:
            await Publisher(producer).send_and_wait(topics.ROLLOUT, record, key=record.alias)
        finally:
            await producer.stop()

    asyncio.run(send())


def _shown(weights: dict[str, float]) -> str:
    return " ".join(f"{version}={weight:g}" for version, weight in weights.items())


def _kafka(settings: Settings) -> Any:
    from chatpipe.ops_commands import operator_kafka

    return operator_kafka(settings)


@rollout_app.command("set")
def set_weights(
    alias: Annotated[str, typer.Argument(help="the alias clients ask for, e.g. chat")],
    weights: Annotated[
        list[str],
        typer.Argument(
            metavar="VERSION=WEIGHT...", help="served models and their weights, e.g. v1=0.9 v2=0.1"
        ),
    ],
) -> None:
    """Give ALIAS these weights on every gateway, from their next request on."""
    settings = Settings()
    try:
        checked = check_weights(alias, parse_weights(weights), settings.models)
    except RolloutError as exc:
        raise typer.BadParameter(str(exc), param_hint="VERSION=WEIGHT") from None
    _publish(_kafka(settings), RolloutSet(alias=alias, weights=checked))
    typer.echo(f"{alias}: {_shown(checked)}")


@rollout_app.command("rollback")
def rollback(
    alias: Annotated[str, typer.Argument(help="the alias to roll back")],
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            metavar="VERSION",
            help="this version alone at 100 % (default: the weights before the current ones)",
        ),
    ] = None,
) -> None:
    """Put ALIAS back on its previous weights, or on one version."""
    settings = Settings()
    kafka = _kafka(settings)
    try:
        weights = rollback_weights(
            alias, _history(kafka, settings, alias)[alias], to, settings.models
        )
    except RolloutError as exc:
        raise typer.BadParameter(str(exc), param_hint="ALIAS") from None
    _publish(kafka, RolloutSet(alias=alias, weights=weights, action="rollback"))
    typer.echo(f"{alias}: {_shown(weights)} (rolled back)")


@rollout_app.command("show")
def show(
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """The weights every gateway applies now: each alias's newest."""
    settings = Settings()
    current = {
        alias: history[-1] for alias, history in _history(_kafka(settings), settings).items()
    }
    if as_json:
        typer.echo(json.dumps(current, indent=2))
        return
    for alias, weights in sorted(current.items()):
        typer.echo(f"{alias}: {_shown(weights)}")


@rollout_app.command("report")
def report(
    alias: Annotated[str | None, typer.Argument(help="one alias (default: every one)")] = None,
    since: Annotated[str, typer.Option(help="period start: 90s, 10m, 2h, 1d or ISO 8601")] = "1h",
    until: Annotated[str | None, typer.Option(help="period end (default: now)")] = None,
    ingest: Annotated[
        bool,
        typer.Option(
            "--ingest",
            help="first read what the topics hold now into the tables "
            "(`chatpipe analytics ingest --until-idle`)",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
    data: Annotated[Path | None, typer.Option(help=DATA_HELP)] = None,
) -> None:
    """Versions side by side: requests, TTFT, tokens/s, retractions, regenerations,
    feedback up and down."""
    from analytics.rollout_report import render, rollout_report
    from analytics.warehouse import Warehouse

    period = period_of(since, until)
    if ingest:
        typer.echo(read_topics(True, db, data, None, flush_s=5.0), err=True)
    database, data_dir = locations(db, data)
    with Warehouse(data_dir).connect(database) as con:
        answer = rollout_report(con, period, alias)
    typer.echo(json.dumps(answer, indent=2) if as_json else render(answer), nl=as_json)

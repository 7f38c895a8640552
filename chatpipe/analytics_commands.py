"""`chatpipe analytics`: usage, tokens and moderation into DuckDB over Parquet, and the
report that answers for a period."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from chatpipe.settings import Settings

analytics_app = typer.Typer(
    no_args_is_help=True,
    help="Usage, tokens and moderation as Parquet tables, queried with DuckDB.",
)

DB_HELP = (
    "the DuckDB database (views over the Parquet files); default: analytics.duckdb "
    "beside CHATPIPE_DATABASE_PATH"
)
DATA_HELP = "the Parquet directory; default: analytics/ beside the database"


def locations(db: Path | None, data: Path | None) -> tuple[Path, Path]:
    """The DuckDB database and the Parquet directory, defaults filled in."""
    database = db or Settings().storage.database_path.parent / "analytics.duckdb"
    return database, data or database.parent / "analytics"


def read_topics(
    until_idle: bool, db: Path | None, data: Path | None, group: str | None, flush_s: float
) -> str:
    """Run the analytics consumer (to the topics' ends with `until_idle`); what it read."""
    from analytics.stage import GROUP, AnalyticsStage
    from analytics.warehouse import Warehouse
    from chatpipe.ops_commands import operator_kafka

    _, data_dir = locations(db, data)
    stage = AnalyticsStage(operator_kafka(Settings()), Warehouse(data_dir), group or GROUP, flush_s)
    counts = asyncio.run(stage.run(until_idle=until_idle))
    rows = ", ".join(f"{table} {n}" for table, n in sorted(counts.rows.items())) or "no rows"
    return f"read {counts.records} records: {rows}; {counts.files} Parquet files in {data_dir}"


def period_of(since: str, until: str | None) -> Any:
    """The `analytics.report.Period` from `--since`/`--until` (BadParameter if either is
    not a time)."""
    from analytics.report import Period
    from ops.time_bounds import parse_time

    now_ms = round(time.time() * 1000)
    try:
        return Period(
            parse_time(since, now_ms) / 1000,
            (parse_time(until, now_ms) if until else now_ms) / 1000,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@analytics_app.command("ingest")
def ingest(
    until_idle: Annotated[
        bool,
        typer.Option(
            "--until-idle", help="consume what is there, then stop (default: run as a stage)"
        ),
    ] = False,
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
    data: Annotated[Path | None, typer.Option(help=DATA_HELP)] = None,
    group: Annotated[
        str | None,
        typer.Option(
            help="consumer group (default chatpipe-analytics); a new one reads every topic "
            "from its start"
        ),
    ] = None,
    flush_s: Annotated[float, typer.Option(help="seconds between Parquet writes")] = 5.0,
) -> None:
    """Read chat.usage, chat.requests.*, chat.tokens, chat.moderation and chat.feedback
    into Parquet."""
    typer.echo(read_topics(until_idle, db, data, group, flush_s))


@analytics_app.command("report")
def report(
    since: Annotated[str, typer.Option(help="period start: 90s, 10m, 2h, 1d or ISO 8601")] = "1h",
    until: Annotated[str | None, typer.Option(help="period end (default: now)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
    plot: Annotated[
        Path | None,
        typer.Option(help="write a PNG of tokens per minute by tier here (needs matplotlib)"),
    ] = None,
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
    data: Annotated[Path | None, typer.Option(help=DATA_HELP)] = None,
) -> None:
    """Tokens by tier, model and org; requests, cancellations, retractions; TTFT."""
    from analytics.report import PlotUnavailable, plot_tokens_per_minute, render
    from analytics.report import report as answer_for
    from analytics.warehouse import Warehouse

    period = period_of(since, until)
    database, data_dir = locations(db, data)
    with Warehouse(data_dir).connect(database) as con:
        answer = answer_for(con, period)
    if plot is not None:
        try:
            plot_tokens_per_minute(answer, plot)
        except PlotUnavailable as exc:
            typer.echo(f"chatpipe analytics report: {exc}", err=True)
            raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
    else:
        typer.echo(render(answer), nl=False)

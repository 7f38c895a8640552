"""`chatpipe replay` and `chatpipe dlq`: what the bus recorded, for operators who debug.

Each command finds the broker from KAFKA_BOOTSTRAP_SERVERS, or from the runtime file
of a running `chatpipe up` (`ops.runtime_file`), and reads what the bus holds now."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, NoReturn

import orjson
import typer

from chatpipe.settings import Settings

replay_app = typer.Typer(no_args_is_help=True, help="What the bus recorded, as JSON lines.")
dlq_app = typer.Typer(no_args_is_help=True, help="The dead letters on chat.dlq.")

TIME_HELP = "ISO 8601 (UTC unless it says) or a span back from now: 90s, 10m, 2h, 1d"


def operator_kafka(settings: Settings) -> Any:
    """KAFKA_BOOTSTRAP_SERVERS with this process's credential, or a running `chatpipe up`'s
    broker; exits with the reason when there is neither."""
    from bus.clients import KafkaConfig
    from chatpipe.wiring import kafka_from_settings
    from ops.runtime_file import NoRunningStack, running_stack_info

    if settings.kafka.bootstrap_servers:
        return kafka_from_settings(settings, settings.kafka.bootstrap_servers)
    try:
        info = running_stack_info(settings.storage.database_path)
    except NoRunningStack as exc:
        _fail(str(exc))
    if info.embedded_broker:
        return KafkaConfig(bootstrap_servers=info.bootstrap_servers)
    return kafka_from_settings(settings, info.bootstrap_servers)


def _fail(message: str) -> NoReturn:
    typer.echo(f"chatpipe: {message}", err=True)
    raise typer.Exit(1)


def _time(text: str | None, name: str) -> int | None:
    from ops.time_bounds import parse_time

    if text is None:
        return None
    try:
        return parse_time(text, round(time.time() * 1000))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=name) from None


def _print_lines(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        typer.echo(orjson.dumps(line).decode())


@replay_app.command("request")
def replay_request(
    client_id: Annotated[str, typer.Argument(metavar="ID")],
    as_client: Annotated[
        bool, typer.Option("--as-client", help="the native SSE stream the client was sent, rebuilt")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(
            help=f"read records from TIME on (less to read on a large cluster): {TIME_HELP}",
            metavar="TIME",
        ),
    ] = None,
) -> None:
    """A request's whole life across the topics, in order.

    ID: the request id (a native stream's `request` event, any answer's `x-request-id`),
    a chat completion's `chatcmpl-…`, a text completion's `cmpl-…` or a response's
    `resp_…`. Request, assignments, chunks of each attempt, deliveries, safety decisions,
    usage, moderation, dead letters: one JSON object a line: topic, partition, offset,
    timestamp, t_ms (after the request's first event), key and the event (or its raw bytes
    when it is none)."""
    from ops.replay import named_request_id, request_records
    from ops.request_life import life_lines

    kafka = operator_kafka(Settings())
    since_ms = _time(since, "--since")

    async def read() -> tuple[str | None, list[Any]]:
        request_id = await named_request_id(kafka, client_id, since_ms)
        if request_id is None:
            return None, []
        return request_id, await request_records(kafka, [request_id], since_ms)

    request_id, reads = asyncio.run(read())
    if request_id is None:
        _fail(f"no request of response {client_id} on the bus")
    if as_client:
        _print_client_stream(reads, request_id)
        return
    lines = life_lines(reads, [request_id])
    if not lines:
        _fail(f"no record of request {client_id} on the bus")
    _print_lines(lines)


def _print_client_stream(reads: list[Any], request_id: str) -> None:
    from chatpipe.client_stream import client_stream

    try:
        stream = client_stream(reads, request_id)
    except LookupError as exc:
        _fail(str(exc))
    typer.echo(stream.body.decode(), nl=False)
    if not stream.ended:
        typer.echo(
            f"chatpipe: the stream of {request_id} has no end on the bus (still "
            "running, or it ended outside the bus)",
            err=True,
        )


@replay_app.command("conversation")
def replay_conversation(
    conversation_id: Annotated[str, typer.Argument(metavar="ID")],
    since: Annotated[
        str | None, typer.Option(help=f"its requests from TIME on: {TIME_HELP}", metavar="TIME")
    ] = None,
) -> None:
    """Every request of a conversation, in order, as `replay request` shows one.

    Each line says its request_id; t_ms counts from that request's first event."""
    from ops.replay import conversation_request_ids, request_records
    from ops.request_life import life_lines

    kafka = operator_kafka(Settings())
    since_ms = _time(since, "--since")

    async def read() -> list[dict[str, Any]]:
        request_ids = await conversation_request_ids(kafka, conversation_id, since_ms)
        if not request_ids:
            return []
        return life_lines(await request_records(kafka, request_ids, since_ms), request_ids)

    lines = asyncio.run(read())
    if not lines:
        _fail(f"no request of conversation {conversation_id} on the bus")
    _print_lines(lines)


@replay_app.command("topic")
def replay_topic(
    topic: Annotated[str, typer.Argument(metavar="TOPIC")],
    from_offset: Annotated[
        int | None,
        typer.Option("--from-offset", min=0, help="start at this offset of every partition"),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help=f"records from TIME on: {TIME_HELP}", metavar="TIME")
    ] = None,
    until: Annotated[str | None, typer.Option(help="records up to TIME", metavar="TIME")] = None,
    key: Annotated[str | None, typer.Option(help="records of this key only")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="the first N records")] = None,
) -> None:
    """A topic's records up to its end now, one JSON object a line.

    In time order, each partition in offset order."""
    from ops.bus_records import record_line
    from ops.replay import topic_records

    if from_offset is not None and since is not None:
        raise typer.BadParameter("give --from-offset or --since, not both")
    since_ms, until_ms = _time(since, "--since"), _time(until, "--until")
    try:
        reads = asyncio.run(
            topic_records(
                operator_kafka(Settings()), topic, from_offset, since_ms, until_ms, key, limit
            )
        )
    except LookupError as exc:
        _fail(str(exc))
    _print_lines([record_line(read) for read in reads])


@dlq_app.command("list")
def dlq_list(
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object a line")] = False,
    topic: Annotated[str | None, typer.Option(help="dead letters of this topic only")] = None,
    since: Annotated[
        str | None, typer.Option(help=f"from TIME on: {TIME_HELP}", metavar="TIME")
    ] = None,
) -> None:
    """The dead letters: id, when, source topic, partition, offset, stage, key, error.

    The id is where the dead letter lies on chat.dlq: chat.dlq-<partition>-<offset>."""
    from ops.dead_letter_queue import LIST_FIELDS, rows
    from ops.replay import dead_letter_records

    since_ms = _time(since, "--since")
    listed = rows(asyncio.run(dead_letter_records(operator_kafka(Settings()))), topic, since_ms)
    if as_json:
        _print_lines(listed)
        return
    table = [list(LIST_FIELDS)] + [
        [_cell(row[f]) for f in LIST_FIELDS[:-1]] + [_cell(row["error"], 80)] for row in listed
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(LIST_FIELDS))]
    for line in table:
        typer.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )


def _cell(value: object, width: int | None = None) -> str:
    text = "-" if value is None else " ".join(str(value).split())
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


@dlq_app.command("retry")
def dlq_retry(
    letter_id: Annotated[str, typer.Argument(metavar="ID", help="as `dlq list` shows it")],
    force: Annotated[bool, typer.Option(help="send it again even if it was retried")] = False,
) -> None:
    """Send a dead letter's original record to its topic again, once its cause is fixed.

    Value, key and headers as they were, to the same partition, marked as a retry of
    ID: a second retry of the same ID needs --force."""
    from ops.replay import AlreadyRetried, retry_dead_letter

    try:
        sent = asyncio.run(retry_dead_letter(operator_kafka(Settings()), letter_id, force))
    except (LookupError, ValueError, AlreadyRetried) as exc:
        _fail(str(exc))
    typer.echo(
        f"retried {sent.letter_id}: {sent.topic} partition {sent.partition} offset {sent.offset}"
    )

"""Native API routes that answer: post, edit or regenerate a message (SSE), and stop
a running answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query

from conversations.store import ApiKey, ConversationStore, RequestRecord
from gateway.deps import Deps, GatewayDeps, TurnsDep
from gateway.edge.auth import OwnedConversation, Owner
from gateway.errors import error_responses
from gateway.native.background import start_title
from gateway.native.turns import (
    Turn,
    Turns,
    native_timers,
    send_turn,
    start_edit,
    start_regenerate,
    start_turn,
    store_answer,
)
from gateway.refusals import NotFound, Unacceptable
from gateway.streaming.event_stream import EventStreamResponse
from gateway.streaming.generation import Generation, event_stream, merged_deltas
from gateway.streaming.stream_relay import StreamRelay
from schemas import sse
from schemas.api import CancelledRequest, PostMessage, TurnOptions
from schemas.events import DeliveryDone
from schemas.files import Citation
from schemas.lifecycle import RequestStatus

router = APIRouter(tags=["conversations"])

_SSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "the answer"}
}
_EVENT_ID = {"pattern": "^[0-9]{0,18}$"}
"""An `id:` the stream sent (or empty: from the start); anything else is 400."""
_TURN = {**_SSE, **error_responses(400, 403, 404, 413, 429, 503)}
"""What a turn can answer: refused input, a model not allowed or not served, a prompt or
request too large, a rate limit or budget, a pipeline that cannot take it."""


@router.post("/conversations/{conversation_id}/messages",
             response_class=EventStreamResponse,
             responses={**_TURN, **error_responses(409)})  # fmt: skip
async def post_message(
    post: PostMessage, conversation: OwnedConversation, owner: Owner, turns: TurnsDep
) -> EventStreamResponse:
    """A user message after the selected thread, answered as SSE."""
    return await answer(turns, await start_turn(turns, owner, conversation, post))


@router.post("/conversations/{conversation_id}/messages/{message_id}/edit",
             response_class=EventStreamResponse, responses=_TURN)  # fmt: skip
async def edit_message(
    message_id: str, post: PostMessage, conversation: OwnedConversation, owner: Owner,
    turns: TurnsDep,
) -> EventStreamResponse:  # fmt: skip
    """A new version of a user message (a fork beside it), answered as SSE."""
    return await answer(turns, await start_edit(turns, owner, conversation, message_id, post))


@router.post("/conversations/{conversation_id}/messages/{message_id}/regenerate",
             response_class=EventStreamResponse, responses=_TURN)  # fmt: skip
async def regenerate_message(
    message_id: str, options: TurnOptions, conversation: OwnedConversation, owner: Owner,
    turns: TurnsDep,
) -> EventStreamResponse:  # fmt: skip
    """Another answer beside an assistant message (or to a user message), as SSE."""
    turn = await start_regenerate(turns, owner, conversation, message_id, options)
    return await answer(turns, turn)


@router.get("/requests/{request_id}/events", response_class=EventStreamResponse,
            responses={**_SSE, **error_responses(400, 404)})  # fmt: skip
async def resume_events(
    request_id: str, owner: Owner, deps: Deps,
    last_event_id_header: Annotated[str | None, Header(
        alias="Last-Event-ID", json_schema_extra=_EVENT_ID)] = None,
    last_event_id: Annotated[str | None, Query(
        description="as the Last-Event-ID header: the last `id:` the client received",
        json_schema_extra=_EVENT_ID)] = None,
) -> EventStreamResponse:  # fmt: skip
    """A stored answer's stream, on any gateway: the events after `Last-Event-ID` (all of
    them without it), live until the end; an answer that has ended is replayed. One still
    running holds a lease here until it ends (never refused: it runs anyway)."""
    record = await _owned_request(deps.store, owner, request_id)
    after = _event_id(last_event_id_header if last_event_id_header is not None
                      else last_event_id)  # fmt: skip
    answer = await deps.store.get_message(record.message_id)
    stream = await deps.pipeline.follow(
        request_id, record.conversation_id, record.answers_partition, record.answers_offset
    )
    # The generation runs on, now streamed here: it counts among its key's concurrent
    # requests here (the gateway that held it lets its own lease go).
    running = answer is not None and answer.status == RequestStatus.IN_PROGRESS
    lease = await deps.concurrency.adopt(owner) if running and deps.concurrency else None
    await deps.pipeline.announce_resume(request_id, record.reply_to)
    generation = Generation(
        deps.pipeline,
        request_id,
        stream,
        StreamRelay(after_id=after),
        native_timers(deps.config),
        on_end=store_answer(deps.store),
        lease=lease,
    )
    payload = sse.RequestPayload(
        request_id=request_id,
        message_id=record.message_id,
        user_message_id=(answer.parent_id or "") if answer is not None else "",
    )
    cited = (await deps.store.list_citations(record.conversation_id)).get(record.message_id, [])
    return event_stream(native_events(payload, generation, citations=cited), generation)


@router.post("/requests/{request_id}/cancel", status_code=202, responses=error_responses(404))
async def cancel_request(request_id: str, owner: Owner, deps: Deps) -> CancelledRequest:
    """Stop a running answer of the caller's, on any gateway; its stream ends with
    `finished_aborted`."""
    await stop(deps, owner, request_id)
    return CancelledRequest(request_id=request_id)


async def stop(deps: GatewayDeps, owner: ApiKey, request_id: str) -> None:
    """Cancel `owner`'s running request (a stored answer still in progress, or one this
    gateway relays); `request_not_found` for any other."""
    if deps.live.owned(request_id, owner.org_id, owner.user_id) is None:
        record = await _owned_request(deps.store, owner, request_id)
        answer = await deps.store.get_message(record.message_id)
        if answer is None or answer.status != RequestStatus.IN_PROGRESS:
            raise NotFound("request_not_found", f"no running request {request_id!r}")
    await deps.pipeline.cancel(request_id, reason="cancelled_by_user")


async def _owned_request(store: ConversationStore, owner: ApiKey, request_id: str
                         ) -> RequestRecord:  # fmt: skip
    """The stored request, if the caller (org and user) owns it; else `request_not_found`."""
    record = await store.get_request(request_id)
    if record is None or not record.owned_by(owner):
        raise NotFound("request_not_found", f"no request {request_id!r}")
    return record


def _event_id(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise Unacceptable(
            "invalid_last_event_id",
            "Last-Event-ID must be an event id (an integer) this stream sent",
            param="last_event_id",
        ) from None


async def answer(turns: Turns, turn: Turn) -> EventStreamResponse:
    generation = await send_turn(turns, turn)
    payload = sse.RequestPayload(
        request_id=turn.request.request_id,
        message_id=turn.request.message_id,
        user_message_id=turn.user_message.message_id,
    )
    titled = _title_when_answered(turns, turn) if turn.first else None
    events = native_events(payload, generation, titled, citations=list(turn.citations))
    return event_stream(events, generation)


async def native_events(
    payload: sse.RequestPayload, generation: Generation,
    on_answered: Callable[[], None] | None = None, *,
    citations: list[Citation] | None = None,
) -> AsyncIterator[bytes]:  # fmt: skip
    """The request event, the answer's sources (if it has any), every event to show,
    then `[DONE]`; what arrived together is written together."""
    yield sse.request_event(payload)
    if citations:
        yield sse.citations_event(citations)
    async with aclosing(generation.batches()) as batches:
        async for batch in batches:
            end = batch[-1]
            if isinstance(end, DeliveryDone) and end.status.is_answered and on_answered:
                on_answered()
            yield b"".join(map(sse.native_event, merged_deltas(batch)))
    if not generation.finished:
        yield sse.error_event("stream_interrupted", "the answer stopped before its end")
    yield sse.done_marker()


def _title_when_answered(turns: Turns, turn: Turn) -> Callable[[], None] | None:
    """A first answer that ended well gets a generated title (unless they are off)."""
    if not turns.config.auto_titles:
        return None
    return lambda: start_title(turns.own, turn.owner, turn.request, turn.user_message.content)

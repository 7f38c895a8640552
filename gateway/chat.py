"""Native API routes that answer: post, edit or regenerate a message (SSE), and stop
a running answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter
from sse_starlette import EventSourceResponse, ServerSentEvent

from conversations.store import ApiKey
from gateway.auth import OwnedConversation, Owner
from gateway.background import start_title
from gateway.deps import Deps, GatewayDeps
from gateway.errors import ApiError
from gateway.generation import AnswerText, Generation, event_stream
from gateway.turns import Turn, send_turn, start_edit, start_regenerate, start_turn
from schemas import sse
from schemas.api import CancelledRequest, PostMessage, TurnOptions
from schemas.events import DeliveryDone

router = APIRouter(tags=["conversations"])

_SSE = {200: {"content": {"text/event-stream": {}}, "description": "the answer"}}


@router.post("/conversations/{conversation_id}/messages",
             response_class=EventSourceResponse, responses=_SSE)  # fmt: skip
async def post_message(
    post: PostMessage, conversation: OwnedConversation, owner: Owner, deps: Deps
) -> EventSourceResponse:
    """A user message after the selected thread, answered as SSE."""
    return await answer(deps, await start_turn(deps, owner, conversation, post))


@router.post("/conversations/{conversation_id}/messages/{message_id}/edit",
             response_class=EventSourceResponse, responses=_SSE)  # fmt: skip
async def edit_message(
    message_id: str, post: PostMessage, conversation: OwnedConversation, owner: Owner, deps: Deps
) -> EventSourceResponse:
    """A new version of a user message (a fork beside it), answered as SSE."""
    return await answer(deps, await start_edit(deps, owner, conversation, message_id, post))


@router.post("/conversations/{conversation_id}/messages/{message_id}/regenerate",
             response_class=EventSourceResponse, responses=_SSE)  # fmt: skip
async def regenerate_message(
    message_id: str, options: TurnOptions, conversation: OwnedConversation, owner: Owner,
    deps: Deps,
) -> EventSourceResponse:  # fmt: skip
    """Another answer beside an assistant message (or to a user message), as SSE."""
    turn = await start_regenerate(deps, owner, conversation, message_id, options)
    return await answer(deps, turn)


@router.post("/requests/{request_id}/cancel", status_code=202)
async def cancel_request(request_id: str, owner: Owner, deps: Deps) -> CancelledRequest:
    """Stop a running answer of the caller's; its stream ends with `finished_aborted`."""
    await stop(deps, owner, request_id)
    return CancelledRequest(request_id=request_id)


async def stop(deps: GatewayDeps, owner: ApiKey, request_id: str) -> None:
    """Cancel `owner`'s request running through this gateway; 404 for any other."""
    if deps.live.owned(request_id, owner.user_id) is None:
        raise ApiError(404, "request_not_found", f"no running request {request_id!r}")
    await deps.pipeline.cancel(request_id, reason="cancelled_by_user")


async def answer(deps: GatewayDeps, turn: Turn) -> EventSourceResponse:
    generation = await send_turn(deps, turn)
    return event_stream(native_events(deps, turn, generation), generation)


async def native_events(
    deps: GatewayDeps, turn: Turn, generation: Generation
) -> AsyncIterator[ServerSentEvent]:
    """The request event, every delivery event, then `[DONE]` (DESIGN §4). A first
    exchange that ends well starts the conversation's title."""
    yield sse.request_event(
        sse.RequestPayload(
            request_id=turn.request.request_id,
            message_id=turn.request.message_id,
            user_message_id=turn.user_message.message_id,
        )
    )
    text = AnswerText()
    async with aclosing(generation.events()) as events:
        async for event in events:
            text.add(event)
            if isinstance(event, DeliveryDone) and turn.first and _titled(deps, event):
                start_title(deps, turn.owner, turn.request, turn.user_message.content,
                            str(text))  # fmt: skip
            yield sse.native_event(event)
    if not generation.finished:
        yield sse.error_event("stream_interrupted", "the answer stopped before its end")
    yield sse.done_marker()


def _titled(deps: GatewayDeps, done: DeliveryDone) -> bool:
    """A first answer that ended well gets a generated title (unless they are off)."""
    return deps.settings.auto_titles and done.status.is_answered



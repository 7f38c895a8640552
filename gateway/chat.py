"""Native API routes: conversations, their messages, and a turn answered over SSE."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter
from sse_starlette import EventSourceResponse, ServerSentEvent

from conversations.store import Conversation, StoredMessage
from gateway.auth import Owner
from gateway.deps import Deps, StoreDep
from gateway.generation import Generation, event_stream
from gateway.turns import OwnedConversation, Turn, send_turn, start_turn
from schemas import sse
from schemas.api import (
    ConversationDetail,
    ConversationPublic,
    CreateConversation,
    MessagePublic,
    PostMessage,
)

router = APIRouter(tags=["conversations"])


@router.post("/conversations", status_code=201)
async def create_conversation(
    create: CreateConversation, owner: Owner, store: StoreDep
) -> ConversationPublic:
    conversation = await store.create_conversation(uuid.uuid4().hex, owner.user_id, create.title)
    return _public(conversation)


@router.get("/conversations/{conversation_id}")
async def get_conversation(conversation: OwnedConversation, store: StoreDep) -> ConversationDetail:
    messages = await store.list_messages(conversation.conversation_id)
    return ConversationDetail(
        **_public(conversation).model_dump(), messages=[_message(m) for m in messages]
    )


@router.post(
    "/conversations/{conversation_id}/messages",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the answer"}},
)
async def post_message(
    post: PostMessage, conversation: OwnedConversation, owner: Owner, deps: Deps
) -> EventSourceResponse:
    turn = await start_turn(deps, owner, conversation, post)
    generation = await send_turn(deps, turn)
    return event_stream(native_events(turn, generation), generation)


async def native_events(turn: Turn, generation: Generation) -> AsyncIterator[ServerSentEvent]:
    """The request event, every delivery event, then `[DONE]` (DESIGN §4)."""
    yield sse.request_event(
        sse.RequestPayload(
            request_id=turn.request.request_id,
            message_id=turn.request.message_id,
            user_message_id=turn.user_message.message_id,
        )
    )
    async with aclosing(generation.events()) as events:
        async for event in events:
            yield sse.native_event(event)
    if not generation.finished:
        yield sse.error_event("stream_interrupted", "the answer stopped before its end")
    yield sse.done_marker()


def _public(conversation: Conversation) -> ConversationPublic:
    return ConversationPublic(
        conversation_id=conversation.conversation_id,
        title=conversation.title,
        created_at=conversation.created_at,
    )


def _message(message: StoredMessage) -> MessagePublic:
    return MessagePublic(
        message_id=message.message_id,
        seq=message.seq,
        role=message.role,
        content=message.content,
        parent_id=message.parent_id,
        model=message.model,
        status=message.status,
        created_at=message.created_at,
    )

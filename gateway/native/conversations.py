"""Native API routes over the caller's conversations: create, list, read as a message
tree, rename, delete, choose a branch, and what each answer cost.

A user only ever sees their own conversations — their own by (org, user): a user
with the same id in another org is someone else — any other id is 404, as an
unknown one is (`OwnedConversation`).
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from conversations.store import ApiKey, Conversation, ConversationStore, StoredMessage
from conversations.tree import ConversationTree
from gateway.deps import Deps, GatewayDeps, StoreDep
from gateway.edge.auth import OwnedConversation, Owner
from gateway.errors import error_responses
from gateway.refusals import NotFound
from schemas.api import (
    ConversationDetail,
    ConversationList,
    ConversationPublic,
    ConversationUsage,
    CreateConversation,
    MessagePublic,
    RenameConversation,
)
from schemas.files import Citation
from schemas.tools import ToolStep

router = APIRouter(tags=["conversations"])


@router.post("/conversations", status_code=201)
async def create_conversation(
    create: CreateConversation, owner: Owner, store: StoreDep
) -> ConversationPublic:
    conversation = await store.create_conversation(uuid.uuid4().hex, owner.user_id, create.title,
                                                   org_id=owner.org_id)  # fmt: skip
    return public(conversation)


@router.get("/conversations", responses=error_responses(404))
async def list_conversations(
    owner: Owner,
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page")] = None,
) -> ConversationList:
    """The caller's conversations, newest first, a page at a time."""
    try:
        page = await store.list_conversations(owner.user_id, org_id=owner.org_id, limit=limit,
                                              cursor=cursor)  # fmt: skip
    except ValueError as error:
        raise NotFound(
            "cursor_not_found",
            "no page at this cursor: pass back a next_cursor as it came",
            param="cursor",
        ) from error
    return ConversationList(data=[public(c) for c in page.conversations],
                            next_cursor=page.next_cursor)  # fmt: skip


@router.get("/conversations/{conversation_id}")
async def get_conversation(conversation: OwnedConversation, store: StoreDep) -> ConversationDetail:
    """Every message of every branch, with the selected thread."""
    return await detail(store, conversation)


@router.patch("/conversations/{conversation_id}")
async def rename_conversation(
    rename: RenameConversation, conversation: OwnedConversation, owner: Owner, store: StoreDep
) -> ConversationPublic:
    renamed = await store.rename_conversation(
        conversation.conversation_id, owner.user_id, rename.title, org_id=owner.org_id
    )
    if renamed is None:  # deleted meanwhile
        raise _not_found(conversation.conversation_id)
    return public(renamed)


@router.delete("/conversations/{conversation_id}", status_code=204)
async def delete_conversation(
    conversation: OwnedConversation, owner: Owner, deps: Deps
) -> Response:
    """Delete it with its messages; its running answers, title and summary are cancelled."""
    await delete(deps, owner, conversation.conversation_id)
    return Response(status_code=204)


@router.post("/conversations/{conversation_id}/messages/{message_id}/select")
async def select_message(
    message_id: str, conversation: OwnedConversation, owner: Owner, store: StoreDep
) -> ConversationDetail:
    """Put a message (a regeneration, an edit) on the thread; the next turn continues it."""
    cid = conversation.conversation_id
    if not await store.select_message(cid, owner.user_id, message_id, org_id=owner.org_id):
        raise NotFound("message_not_found", f"no message {message_id!r} in this conversation")
    return await detail(store, conversation)


@router.get("/conversations/{conversation_id}/usage")
async def conversation_usage(conversation: OwnedConversation, store: StoreDep) -> ConversationUsage:
    """Prompt, cached and completion tokens of every answer: the cost of the growing history."""
    return await usage(store, conversation.conversation_id)


def public(conversation: Conversation) -> ConversationPublic:
    return ConversationPublic(
        conversation_id=conversation.conversation_id,
        title=conversation.display_title,
        created_at=conversation.created_at,
    )


async def detail(store: ConversationStore, conversation: Conversation) -> ConversationDetail:
    tree = await store.get_tree(conversation.conversation_id)
    cited = await store.list_citations(conversation.conversation_id)
    steps = await store.list_tool_steps(conversation.conversation_id)
    return ConversationDetail(
        **public(conversation).model_dump(),
        messages=[
            _message(m, tree, cited.get(m.message_id, []), steps.get(m.message_id, []))
            for m in tree.messages
        ],
        roots=[m.message_id for m in tree.children(None)],
        thread=[m.message_id for m in tree.thread()],
    )


async def delete(deps: GatewayDeps, owner: ApiKey, conversation_id: str) -> None:
    for request_id in await deps.store.in_progress_requests(conversation_id):
        await deps.pipeline.cancel(request_id, reason="conversation_deleted")
    await deps.background.cancel(conversation_id)
    if not await deps.store.delete_conversation(
        conversation_id, owner.user_id, org_id=owner.org_id
    ):
        raise _not_found(conversation_id)  # deleted meanwhile


async def usage(store: ConversationStore, conversation_id: str) -> ConversationUsage:
    turns = await store.message_usage(conversation_id)
    return ConversationUsage(
        conversation_id=conversation_id,
        turns=turns,
        prompt_tokens=sum(t.prompt_tokens for t in turns),
        cached_tokens=sum(t.cached_tokens for t in turns),
        completion_tokens=sum(t.completion_tokens for t in turns),
    )


def _message(message: StoredMessage, tree: ConversationTree, citations: list[Citation],
             tool_steps: list[ToolStep]) -> MessagePublic:  # fmt: skip
    selected = tree.selected_child(message.message_id)
    return MessagePublic(
        message_id=message.message_id,
        seq=message.seq,
        role=message.role,
        content=message.content,
        parent_id=message.parent_id,
        model=message.model,
        alias=message.alias,
        status=message.status,
        created_at=message.created_at,
        children=[child.message_id for child in tree.children(message.message_id)],
        selected_child=selected.message_id if selected is not None else None,
        citations=citations,
        tool_steps=tool_steps,
    )


def _not_found(conversation_id: str) -> NotFound:
    return NotFound("conversation_not_found", f"no conversation {conversation_id!r}")

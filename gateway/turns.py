"""A native chat turn: a posted user message in, the GenerationRequest that answers it out."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated

import anyio
from fastapi import Depends

from conversations.history import build_prompt, thread
from conversations.store import ApiKey, Conversation, ConversationStore, NewMessage, StoredMessage
from gateway.admission import admit
from gateway.auth import Owner
from gateway.deps import GatewayDeps, StoreDep
from gateway.errors import ApiError
from gateway.generation import Generation, start_generation
from gateway.limits import check_message, sampling_options, served_model
from schemas.api import PostMessage
from schemas.events import GenerationRequest, Role, now
from schemas.lifecycle import RequestStatus


@dataclass(frozen=True, slots=True)
class Turn:
    request: GenerationRequest
    user_message: StoredMessage


async def owned_conversation(conversation_id: str, owner: Owner, store: StoreDep) -> Conversation:
    """The conversation named in the path; 404 unless the caller owns it."""
    conversation = await store.get_conversation(conversation_id)
    if conversation is None or conversation.user_id != owner.user_id:
        raise ApiError(404, "conversation_not_found", f"no conversation {conversation_id!r}")
    return conversation


OwnedConversation = Annotated[Conversation, Depends(owned_conversation)]


async def start_turn(
    deps: GatewayDeps, owner: ApiKey, conversation: Conversation, post: PostMessage
) -> Turn:
    """Check the message, store it, and build the request answering it (not yet sent)."""
    settings = deps.settings
    model = served_model(settings, post.model)
    check_message(settings, post.content)
    sampling = sampling_options(
        settings,
        max_tokens=post.max_tokens,
        temperature=post.temperature,
        top_p=post.top_p,
        seed=post.seed,
        ignore_eos=post.ignore_eos,
    )
    messages = await _settled_messages(
        deps.store, conversation.conversation_id, deps.reply_wait_s, settings.request_timeout_s
    )
    leaf_id = messages[-1].message_id if messages else None
    prompt = tuple(build_prompt(thread(messages, leaf_id), post.content))
    # Before the message is stored: a refused turn leaves no unanswered message behind.
    await admit(deps, owner, prompt, sampling.max_tokens)
    user_message = await deps.store.add_message(
        NewMessage(
            message_id=_new_id(),
            conversation_id=conversation.conversation_id,
            role=Role.USER,
            content=post.content,
            parent_id=leaf_id,
        )
    )
    request = GenerationRequest(
        request_id=_new_id(),
        conversation_id=conversation.conversation_id,
        message_id=_new_id(),
        parent_id=user_message.message_id,
        user_id=owner.user_id,
        org_id=owner.org_id,
        tier=owner.tier,
        model=model,
        messages=prompt,
        sampling=sampling,
        reply_to=deps.pipeline.reply_to,
        deadline=now() + settings.request_timeout_s,
        cache_salt=owner.org_id,
        store=True,
    )
    return Turn(request=request, user_message=user_message)


async def send_turn(deps: GatewayDeps, turn: Turn) -> Generation:
    """Submit the request; if that fails, record a failed answer so the next turn can go on."""
    try:
        return await start_generation(deps.pipeline, turn.request)
    except ApiError:
        await deps.store.add_message(
            NewMessage(
                message_id=turn.request.message_id,
                conversation_id=turn.request.conversation_id,
                role=Role.ASSISTANT,
                content="",
                parent_id=turn.user_message.message_id,
                model=turn.request.model,
                status=RequestStatus.FINISHED_ERROR,
                request_id=turn.request.request_id,
            )
        )
        raise


async def _settled_messages(
    store: ConversationStore, conversation_id: str, wait_s: float, stale_after_s: float
) -> list[StoredMessage]:
    """The conversation's messages once the previous user message has its answer.

    The recorder stores answers asynchronously (a row even for a failed or
    cancelled generation), so a quick next turn may arrive before it; past
    `wait_s` the previous turn is taken to be still running: 409. A user
    message older than `stale_after_s` whose answer never came is given up on.
    """
    messages = await store.list_messages(conversation_id)
    if not messages or messages[-1].role != Role.USER:
        return messages
    if messages[-1].created_at < now() - stale_after_s:
        return messages
    pending = messages[-1].message_id
    delay = 0.02
    with anyio.move_on_after(wait_s):
        while await store.find_reply(pending) is None:
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.25)
        return await store.list_messages(conversation_id)
    raise ApiError(
        409,
        "reply_pending",
        "the previous message is still being answered; retry when it is done",
        headers={"Retry-After": "1"},
    )


def _new_id() -> str:
    return uuid.uuid4().hex

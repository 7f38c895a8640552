"""`POST /v1/messages/{message_id}/feedback`: a user's thumbs up or down on one of their
answers, with an optional comment, onto `chat.feedback` with the version that answered
(what `chatpipe rollout report` compares versions by)."""

from __future__ import annotations

from fastapi import APIRouter

from conversations.store import ApiKey, ConversationStore
from gateway.deps import Deps
from gateway.edge.auth import Owner
from gateway.errors import error_responses
from gateway.refusals import NotFound, Unacceptable, pipeline_unavailable
from schemas.api import FeedbackAccepted, MessageFeedback
from schemas.events import FeedbackEvent, Role

router = APIRouter(tags=["conversations"])


@router.post("/messages/{message_id}/feedback", status_code=202,
             responses=error_responses(400, 404, 422, 503))  # fmt: skip
async def post_feedback(
    message_id: str, feedback: MessageFeedback, owner: Owner, deps: Deps
) -> FeedbackAccepted:
    """Rate one of the caller's answers; 404 for any message that is not theirs."""
    event = await feedback_event(deps.store, owner, message_id, feedback)
    try:
        await deps.pipeline.feedback(event)
    except Exception as exc:
        raise pipeline_unavailable() from exc
    return FeedbackAccepted(message_id=message_id, rating=feedback.rating)


async def feedback_event(
    store: ConversationStore, owner: ApiKey, message_id: str, feedback: MessageFeedback
) -> FeedbackEvent:
    """The event for `owner`'s feedback on answer `message_id`: `message_not_found` unless
    the message is in a conversation of theirs, `not_an_answer` for a user message."""
    message = await store.get_message(message_id)
    conversation = (await store.get_conversation(message.conversation_id)
                    if message is not None else None)  # fmt: skip
    if message is None or conversation is None or not conversation.owned_by(owner):
        raise NotFound("message_not_found", f"no message {message_id!r}")
    if message.role is not Role.ASSISTANT:
        raise Unacceptable(
            "not_an_answer", "feedback is on an assistant message", param="message_id"
        )
    return FeedbackEvent(
        message_id=message_id, conversation_id=message.conversation_id,
        request_id=message.request_id, user_id=owner.user_id, org_id=owner.org_id,
        model=message.model, alias=message.alias, rating=feedback.rating,
        text=feedback.text)  # fmt: skip

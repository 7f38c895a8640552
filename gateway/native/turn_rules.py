"""A turn's decisions on its conversation's tree, as plain values: no HTTP, no Kafka, no
settings, no clock but the times it is given.

The thread an edit or a regeneration continues (`edit_thread`, `regenerated_question`),
whether the previous answer still streams (`pending_answer`) and when a turn waiting on
it may go on (`answer_ended`), whether the prompt left room for the answer (`check_room`).
"""

from __future__ import annotations

from conversations.store import StoredMessage
from conversations.tree import ConversationTree
from gateway.context.window import BuiltContext
from gateway.refusals import NotFound, TooLarge, Unacceptable
from schemas.events import Role
from schemas.lifecycle import RequestStatus


def message_in(tree: ConversationTree, message_id: str) -> StoredMessage:
    for message in tree.messages:
        if message.message_id == message_id:
            return message
    raise NotFound("message_not_found", f"no message {message_id!r} in this conversation")


def edit_thread(tree: ConversationTree, message_id: str) -> list[StoredMessage]:
    """The thread an edit of user message `message_id` continues: up to its parent."""
    edited = message_in(tree, message_id)
    if edited.role != Role.USER:
        raise Unacceptable("not_a_user_message", "only a user message can be edited")
    return tree.path_to(edited.parent_id) if edited.parent_id is not None else []


def regenerated_question(tree: ConversationTree, message_id: str) -> StoredMessage:
    """The user message a regeneration of `message_id` answers again: the one that
    answer answers, or `message_id` itself when it is a user message."""
    question = message_in(tree, message_id)
    if question.role == Role.ASSISTANT and question.parent_id is not None:
        question = message_in(tree, question.parent_id)
    if question.role != Role.USER:
        raise Unacceptable("nothing_to_regenerate", "this message answers no user message")
    return question


def pending_answer(thread: list[StoredMessage], now: float, stale_after_s: float) -> str | None:
    """The id of the thread's last answer if it is still streaming, so a next turn must
    wait for it; an answer in progress for longer than `stale_after_s` (nothing
    finished it) is given up on."""
    last = thread[-1] if thread else None
    if last is None or not streaming(last, now, stale_after_s):
        return None
    return last.message_id


def streaming(message: StoredMessage, now: float, stale_after_s: float) -> bool:
    return (message.role == Role.ASSISTANT and message.status == RequestStatus.IN_PROGRESS
            and message.created_at >= now - stale_after_s)  # fmt: skip


def answer_ended(answer: StoredMessage | None) -> bool:
    """Whether the answer a next turn waits for has ended (or is gone): it may go on."""
    return answer is None or answer.status != RequestStatus.IN_PROGRESS


def check_room(built: BuiltContext, model: str, max_tokens: int) -> None:
    """Refuse a prompt whose system prompt, summary and new message alone leave no room
    for `max_tokens` in `model`'s window."""
    if not built.fits:
        window = built.max_prompt_tokens + max_tokens
        raise TooLarge(
            "context_too_long",
            f"the prompt needs {built.prompt_tokens} tokens and the answer max_tokens="
            f"{max_tokens}; {model} takes {window} in all",
            param="content",
        )

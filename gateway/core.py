"""The gateway's decisions, as plain values: no HTTP, no Kafka, no settings, no clock
but the times it is given.

* What a request is: `owner_request` (who asks, for what, where the answer goes).
* What a turn answers: the thread an edit or a regeneration continues
  (`edit_thread`, `regenerated_question`), whether the previous answer still streams
  (`pending_answer`) and when a turn waiting on it may go on (`answer_ended`),
  whether the prompt left room for the answer (`check_room`).
* Why a request is turned down: `Refused` and its kinds. They say nothing of HTTP;
  `gateway.errors` gives each kind its status, in one table.
"""

from __future__ import annotations

from conversations.store import ApiKey, StoredMessage
from conversations.tree import ConversationTree
from gateway.context import BuiltContext
from schemas.events import ChatMessage, GenerationRequest, Role, SamplingOptions
from schemas.generation import generation_request
from schemas.lifecycle import RequestStatus


class Refused(Exception):
    """A request turned down: `code` (the reason a client matches on), a message for
    its user, the request field at fault (`param`), and when a retry may succeed
    (`retry_after_s`, None: not by waiting)."""

    def __init__(self, code: str, message: str, *, param: str | None = None,
                 retry_after_s: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s


class Unacceptable(Refused):
    """Not something this request can ask for, as sent (an empty or blocked message,
    an edit of an answer)."""


class NotFound(Refused):
    """No such thing of the caller's: a conversation, message, request or model."""


class NotAllowed(Refused):
    """The caller's tier may not use it."""


class NotYet(Refused):
    """It waits on something still under way (the previous answer)."""


class TooLarge(Refused):
    """A message, the prompt or the whole request is over a limit."""


class Invalid(Refused):
    """A field's value is outside what it may be."""


class Unavailable(Refused):
    """The pipeline cannot take it now (overloaded, unreachable)."""


def owner_request(
    owner: ApiKey, *, model: str, messages: tuple[ChatMessage, ...], sampling: SamplingOptions,
    reply_to: str, timeout_s: float, sent_at: float, conversation_id: str | None = None,
    parent_id: str | None = None, store: bool = False, alias: str | None = None,
) -> GenerationRequest:  # fmt: skip
    """A request asked by `owner` (billed, prioritised and prefix-cached as them);
    `alias`: the alias asked for, whose version `model` is."""
    return generation_request(
        user_id=owner.user_id, org_id=owner.org_id, tier=owner.tier, cache_salt=owner.org_id,
        model=model, messages=messages, sampling=sampling, reply_to=reply_to,
        timeout_s=timeout_s, sent_at=sent_at, conversation_id=conversation_id,
        parent_id=parent_id, store=store, alias=alias,
    )  # fmt: skip


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


def reply_pending() -> NotYet:
    return NotYet("reply_pending",
                  "the previous message is still being answered; retry when it is done",
                  retry_after_s=1)  # fmt: skip


def pipeline_unavailable() -> Unavailable:
    return Unavailable("pipeline_unavailable", "the request could not be queued", retry_after_s=5)


def safety_unavailable() -> Unavailable:
    """The input classifiers gave no verdict (the judge failed): neither passed nor
    blocked, the caller may try again."""
    return Unavailable(
        "safety_unavailable", "the safety check could not run; try again", retry_after_s=5
    )


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

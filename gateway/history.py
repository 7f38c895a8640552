"""Context building: stored turns to the messages a model is prompted with (DESIGN §8).

`build_prompt` is the simple form (drop the oldest turns one by one);
`gateway.context` manages the window per model (block cuts for a
stable prefix, summaries, retrieval).

The prompt of turn N+1 starts with the exact messages of turn N's prompt and
answer, so the engine's prefix cache covers all but the newest turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from conversations.store import StoredMessage
from schemas.events import ChatMessage, Role
from schemas.lifecycle import RequestStatus

_FAILED = frozenset({RequestStatus.FINISHED_ERROR, RequestStatus.FINISHED_ABORTED})


def build_prompt(
    history: Iterable[StoredMessage],
    new_user_message: str,
    system_prompt: str | None = None,
    *,
    max_prompt_tokens: int | None = None,
    count_tokens: Callable[[ChatMessage], int] | None = None,
) -> list[ChatMessage]:
    """System prompt, then the stored turns in order, then the new user message.

    `history` is one thread in order (see `thread`). Assistant messages that
    failed or were aborted before any text are left out; partial text is kept,
    since the user saw it. With `max_prompt_tokens` and `count_tokens`, the
    oldest turns are dropped until the prompt fits; the system prompt and the
    new message never are (the prompt may still be over if they alone are).
    """
    turns = [ChatMessage(role=m.role, content=m.content) for m in prompt_turns(history)]
    head = [ChatMessage(role=Role.SYSTEM, content=system_prompt)] if system_prompt else []
    tail = [ChatMessage(role=Role.USER, content=new_user_message)]
    if max_prompt_tokens is not None and count_tokens is not None:
        budget = max_prompt_tokens - sum(map(count_tokens, head + tail))
        turns = _newest_turns(turns, budget, count_tokens)
    return head + turns + tail


def prompt_turns(history: Iterable[StoredMessage]) -> list[StoredMessage]:
    """The messages of a thread a prompt carries: all but answers that failed or
    were aborted before any text (partial text is kept, since the user saw it)."""
    return [message for message in history if not _failed_empty(message)]


def thread(messages: Iterable[StoredMessage], leaf_id: str | None) -> list[StoredMessage]:
    """The branch ending at `leaf_id`, root first, following `parent_id` links.

    A conversation holds every branch (regenerations and edits are siblings);
    the prompt must see only the one the user is on.
    """
    by_id = {message.message_id: message for message in messages}
    path: list[StoredMessage] = []
    while leaf_id is not None and leaf_id in by_id and len(path) < len(by_id):
        path.append(by_id[leaf_id])
        leaf_id = by_id[leaf_id].parent_id
    return path[::-1]


def _failed_empty(message: StoredMessage) -> bool:
    return message.role == Role.ASSISTANT and not message.content and message.status in _FAILED


def _newest_turns(
    turns: list[ChatMessage], budget: int, count_tokens: Callable[[ChatMessage], int]
) -> list[ChatMessage]:
    """The longest suffix of `turns` within `budget` that starts with a user turn."""
    kept: list[ChatMessage] = []
    for message in reversed(turns):
        cost = count_tokens(message)
        if cost > budget:
            break
        budget -= cost
        kept.append(message)
    kept.reverse()
    # chat templates expect a user turn first: drop an orphaned answer
    while kept and kept[0].role != Role.USER:
        kept.pop(0)
    return kept

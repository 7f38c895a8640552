"""Which stored messages of a thread a prompt carries; `gateway.context.window`
decides how many of them fit the model's window.

The prompt of turn N+1 starts with the exact messages of turn N's prompt and
answer, so the engine's prefix cache covers all but the newest turn.
"""

from __future__ import annotations

from collections.abc import Iterable

from conversations.store import StoredMessage
from schemas.events import Role
from schemas.lifecycle import RequestStatus

_FAILED = frozenset({RequestStatus.FINISHED_ERROR, RequestStatus.FINISHED_ABORTED})


def prompt_turns(history: Iterable[StoredMessage]) -> list[StoredMessage]:
    """The messages of a thread a prompt carries: all but answers that failed or
    were aborted before any text (partial text is kept, since the user saw it)."""
    return [message for message in history if not _failed_empty(message)]


def _failed_empty(message: StoredMessage) -> bool:
    return message.role == Role.ASSISTANT and not message.content and message.status in _FAILED

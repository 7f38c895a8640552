"""The conversation store interface (DESIGN §8) and its records.

Implementations: `conversations.sqlite_store.SQLiteStore` (one machine);
Cassandra comes later. Every write is idempotent on its id, so redelivered
events never store a message twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from schemas.events import Role
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier


@dataclass(frozen=True, slots=True)
class Conversation:
    conversation_id: str
    user_id: str
    title: str
    created_at: float


@dataclass(frozen=True, slots=True)
class NewMessage:
    message_id: str
    conversation_id: str
    role: Role
    content: str
    parent_id: str | None = None
    model: str | None = None
    tokens: int = 0
    status: RequestStatus = RequestStatus.FINISHED_STOPPED
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class StoredMessage:
    message_id: str
    conversation_id: str
    seq: int
    role: Role
    content: str
    parent_id: str | None
    model: str | None
    tokens: int
    status: RequestStatus
    request_id: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class ApiKey:
    """Who an API key belongs to. Only a hash of the key is stored."""

    user_id: str
    org_id: str
    tier: Tier
    created_at: float = field(default=0.0)


class ConversationStore(Protocol):
    async def open(self) -> None:
        """Create the schema if needed."""

    async def close(self) -> None: ...

    async def create_conversation(
        self, conversation_id: str, user_id: str, title: str = ""
    ) -> Conversation: ...

    async def get_conversation(self, conversation_id: str) -> Conversation | None: ...

    async def list_conversations(self, user_id: str) -> list[Conversation]:
        """A user's conversations, newest first."""

    async def add_message(self, message: NewMessage) -> StoredMessage:
        """Append with the next seq; a message_id already stored is returned as is."""

    async def get_message(self, message_id: str) -> StoredMessage | None: ...

    async def list_messages(self, conversation_id: str) -> list[StoredMessage]:
        """All messages of a conversation in seq order."""

    async def find_reply(self, parent_id: str) -> StoredMessage | None:
        """The newest message whose parent is `parent_id`."""

    async def add_api_key(self, key: str, owner: ApiKey) -> None:
        """Store (idempotently) a hash of `key` with its owner."""

    async def find_api_key(self, key: str) -> ApiKey | None: ...

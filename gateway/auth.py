"""Bearer API keys: every `/v1` route runs as the key's owner (user, org, tier), and
sees only that owner's conversations."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from conversations.store import ApiKey, Conversation
from gateway.deps import StoreDep
from gateway.errors import ApiError

_bearer = HTTPBearer(auto_error=False, description="an API key")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


async def current_owner(
    store: StoreDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    if credentials is None or not credentials.credentials:
        raise ApiError(
            401, "missing_api_key", "send 'Authorization: Bearer <key>'", headers=_CHALLENGE
        )
    owner = await store.find_api_key(credentials.credentials)
    if owner is None:
        raise ApiError(401, "invalid_api_key", "unknown API key", headers=_CHALLENGE)
    return owner


Owner = Annotated[ApiKey, Depends(current_owner)]


async def owned_conversation(conversation_id: str, owner: Owner, store: StoreDep) -> Conversation:
    """The conversation named in the path; 404 unless the caller owns it."""
    conversation = await store.get_conversation(conversation_id)
    if conversation is None or conversation.user_id != owner.user_id:
        raise ApiError(404, "conversation_not_found", f"no conversation {conversation_id!r}")
    return conversation


OwnedConversation = Annotated[Conversation, Depends(owned_conversation)]

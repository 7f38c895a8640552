"""Bearer API keys: every `/v1` route runs as the key's owner (user, org, tier), and
sees only that owner's conversations — owner meaning (org_id, user_id), as the same
user id may exist in two orgs.

The key is looked up in the store on every request (its keyed hash, see
`conversations.store.hash_api_key`): nothing caches it, so a key revoked with
`chatpipe keys revoke` gets 401 from every gateway on its next request, as does a
key past its expiry (`ApiKey.refusal`, the pure check, given the time).
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from conversations.store import ApiKey, Conversation
from gateway.deps import StoreDep
from gateway.errors import ApiError
from gateway.refusals import NotFound

_bearer = HTTPBearer(auto_error=False, description="an API key")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def check_key(found: ApiKey | None, now: float) -> ApiKey:
    """The key's owner if the key opens at `now`; else 401 saying why."""
    if found is None:
        raise ApiError(401, "invalid_api_key", "unknown API key", headers=_CHALLENGE)
    refusal = found.refusal(now)
    if refusal is not None:
        raise ApiError(401, "invalid_api_key", refusal, headers=_CHALLENGE)
    return found


async def current_owner(
    store: StoreDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    if credentials is None or not credentials.credentials:
        raise ApiError(
            401, "missing_api_key", "send 'Authorization: Bearer <key>'", headers=_CHALLENGE
        )
    return check_key(await store.find_api_key(credentials.credentials), time.time())


Owner = Annotated[ApiKey, Depends(current_owner)]


async def owned_conversation(conversation_id: str, owner: Owner, store: StoreDep) -> Conversation:
    """The conversation named in the path; `conversation_not_found` unless the caller
    (org and user) owns it."""
    conversation = await store.get_conversation(conversation_id)
    if conversation is None or not conversation.owned_by(owner):
        raise NotFound("conversation_not_found", f"no conversation {conversation_id!r}")
    return conversation


OwnedConversation = Annotated[Conversation, Depends(owned_conversation)]

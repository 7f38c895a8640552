"""The ids a client is shown, and the request each names (pure).

A native turn shows its `request_id` itself (the stream's `request` event, and every
answer's `x-request-id`). A chat completion's id is `chatcmpl-` and a text completion's
`cmpl-` before its request id (of its first choice: each other choice is a request of
its own). A response's id is `resp_` before its answer's message id, which the request
queued for it carries (`GenerationRequest.message_id`).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.api import completion_request_id
from schemas.responses import message_id_of


@dataclass(frozen=True, slots=True)
class ClientId:
    """What an id a client was shown names: a request, or the answer a request made."""

    request_id: str | None = None
    message_id: str | None = None


def parse_client_id(client_id: str) -> ClientId:
    """A completion's or response's id by its prefix; any other id is a request id."""
    message_id = message_id_of(client_id)
    if message_id is not None:
        return ClientId(message_id=message_id)
    return ClientId(request_id=completion_request_id(client_id) or client_id)

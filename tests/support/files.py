"""Files uploaded over HTTP."""

from __future__ import annotations

import uuid

import httpx

from chatpipe.wiring import Stack
from conversations.store import ApiKey
from schemas.topics import Tier
from tests.support.stack import client_for

LIGHTHOUSE = """# The lighthouse on the cape

Anna keeps the lighthouse on the northern cape. She came to the island as a young
woman, when the old keeper retired, and she has kept the light for thirty years. The
supply boat comes on the first Monday of every month with flour, oil, letters and
newspapers, weather permitting; in winter it sometimes does not come for weeks.

## The lamp

Every evening at dusk Anna climbs the ninety steps of the tower and lights the great
lamp. At midnight she climbs them again and trims its wick, so that the light burns
steadily until dawn, when she puts it out and polishes the lens for the next night.

## The garden

Behind the tower Anna grows potatoes, beans, onions and a row of tall sunflowers. The
wind off the sea is hard on everything, so the beds are sheltered by a low stone wall
that her predecessor built, and she waters them from the rain barrel by the door.
"""


async def owners(stack: Stack) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    """Two clients of one user id in two orgs: two owners."""
    user = f"user-{uuid.uuid4().hex[:8]}"
    for org in ("org-a", "org-b"):
        await stack.store.add_api_key(f"key-{user}-{org}", ApiKey(user, f"{org}-{user}",
                                                                  Tier.PRO))  # fmt: skip
    return client_for(stack, f"key-{user}-org-a"), client_for(stack, f"key-{user}-org-b")


async def upload(client: httpx.AsyncClient, name: str, data: bytes,
                 content_type: str = "application/octet-stream",
                 purpose: str = "assistants") -> httpx.Response:  # fmt: skip
    return await client.post("/v1/files", files={"file": (name, data, content_type)},
                             data={"purpose": purpose})  # fmt: skip

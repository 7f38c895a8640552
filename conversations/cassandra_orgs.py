"""The Cassandra store's org settings and response cache (`conversations.store`
contracts), a part of `CassandraStore`; tables and statements in `cassandra_schema`.

A cache entry is written with a TTL of the seconds until its `expires_at`, so
Cassandra drops it then; reads check `expires_at` against the store's clock too, so an
entry is gone at the same moment on both stores.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from conversations.cassandra_session import Rows
from conversations.store import CachedResponse, OrgSettings
from schemas.lifecycle import RequestStatus


class CassandraOrgs:
    """Mixed into `CassandraStore`, which provides `_run` and `_clock`."""

    _clock: Callable[[], float]
    _run: Callable[[str, tuple], Awaitable[Rows]]

    async def set_org_settings(self, settings: OrgSettings) -> None:
        s = settings
        await self._run("insert_org_settings",
                        (s.org_id, s.response_cache, s.max_concurrent_requests))  # fmt: skip

    async def get_org_settings(self, org_id: str) -> OrgSettings:
        rows = await self._run("select_org_settings", (org_id,))
        return _org_settings(rows[0]) if rows else OrgSettings(org_id)

    async def list_org_settings(self) -> list[OrgSettings]:
        rows = await self._run("select_all_org_settings", ())
        return sorted(map(_org_settings, rows), key=lambda settings: settings.org_id)

    async def put_cached_response(self, entry: CachedResponse) -> None:
        ttl_s = math.ceil(entry.expires_at - self._clock())
        if ttl_s <= 0:
            return  # already expired: nothing to keep
        e = entry
        await self._run("insert_cached_response", (
            e.cache_key, e.org_id, e.model, e.content, e.prompt_tokens, e.completion_tokens,
            e.status.value, e.created_at, e.expires_at, ttl_s))  # fmt: skip

    async def get_cached_response(self, cache_key: str, org_id: str) -> CachedResponse | None:
        rows = await self._run("select_cached_response", (cache_key,))
        if not rows or rows[0]["org_id"] != org_id or rows[0]["expires_at"] <= self._clock():
            return None
        row = rows[0]
        return CachedResponse(
            cache_key=row["cache_key"], org_id=row["org_id"], model=row["model"],
            content=row["content"], prompt_tokens=row["prompt_tokens"],
            completion_tokens=row["completion_tokens"], status=RequestStatus(row["status"]),
            created_at=row["created_at"], expires_at=row["expires_at"])  # fmt: skip


def _org_settings(row: Mapping[str, Any]) -> OrgSettings:
    return OrgSettings(
        row["org_id"], bool(row["response_cache"]), row.get("max_concurrent_requests")
    )

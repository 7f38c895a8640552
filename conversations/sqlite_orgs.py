"""The SQLite store's org settings and response cache (`conversations.store` contracts),
a part of `SQLiteStore`.

Expired cache entries are never returned, and each write deletes the expired ones
(an index on `expires_at` keeps that a short range scan).
"""

from __future__ import annotations

import sqlite3

from common.sqlite_file import SQLiteFile
from conversations.sqlite_schema import CACHED_RESPONSE_COLUMNS, cached_response_row
from conversations.store import CachedResponse, OrgSettings


class SQLiteOrgs(SQLiteFile):
    """Mixed into `SQLiteStore`; its `SQLiteFile` provides `_run` and `_clock`."""

    async def set_org_settings(self, settings: OrgSettings) -> None:
        await self._run(lambda conn: conn.execute(
            "INSERT OR REPLACE INTO org_settings (org_id, response_cache,"
            " max_concurrent_requests) VALUES (?, ?, ?)",
            (settings.org_id, int(settings.response_cache),
             settings.max_concurrent_requests)))  # fmt: skip

    async def get_org_settings(self, org_id: str) -> OrgSettings:
        def select(conn: sqlite3.Connection) -> OrgSettings:
            row = conn.execute(
                "SELECT response_cache, max_concurrent_requests FROM org_settings WHERE org_id = ?",
                (org_id,),
            ).fetchone()
            return OrgSettings(org_id, bool(row[0]), row[1]) if row else OrgSettings(org_id)

        return await self._run(select)

    async def list_org_settings(self) -> list[OrgSettings]:
        def select(conn: sqlite3.Connection) -> list[OrgSettings]:
            rows = conn.execute("SELECT org_id, response_cache, max_concurrent_requests"
                                " FROM org_settings ORDER BY org_id")  # fmt: skip
            return [OrgSettings(org_id, bool(cached), concurrent)
                    for org_id, cached, concurrent in rows]  # fmt: skip

        return await self._run(select)

    async def put_cached_response(self, entry: CachedResponse) -> None:
        def put(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM response_cache WHERE expires_at <= ?", (self._clock(),))
            conn.execute(
                f"INSERT OR REPLACE INTO response_cache ({CACHED_RESPONSE_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (entry.cache_key, entry.org_id, entry.model, entry.content,
                 entry.prompt_tokens, entry.completion_tokens, entry.status.value,
                 entry.created_at, entry.expires_at))  # fmt: skip

        await self._run(put)

    async def get_cached_response(self, cache_key: str, org_id: str) -> CachedResponse | None:
        def select(conn: sqlite3.Connection) -> CachedResponse | None:
            row = conn.execute(
                f"SELECT {CACHED_RESPONSE_COLUMNS} FROM response_cache"
                " WHERE cache_key = ? AND org_id = ? AND expires_at > ?",
                (cache_key, org_id, self._clock())).fetchone()  # fmt: skip
            return cached_response_row(row) if row else None

        return await self._run(select)

"""The `search_documents` server tool: search the caller's own files (`retrieval`).

Only files the turn's owner (org and user) uploaded are searched: the tool lists the
owner's files from the store and never takes a file of anyone else's, even when the
model names its id."""

from __future__ import annotations

from typing import Any

from conversations.files import FileStore
from retrieval.documents import Documents
from retrieval.ranking import snippet
from schemas.tools import FunctionSpec, ToolSpec
from servertools.core import Caller

QUERY_CHARS = 1000
RESULT_CHARS = 800
"""How much of each found chunk the model is given."""

SPEC = ToolSpec(
    function=FunctionSpec(
        name="search_documents",
        description="Search the user's uploaded files (POST /v1/files) for passages about a "
        "query; optionally only the files named by id.",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": QUERY_CHARS},
                "file_ids": {"type": "array", "items": {"type": "string"}, "maxItems": 16},
            },
            "required": ["query"],
        },
    )
)


class SearchDocuments:
    """The tool over `store`'s files, found and ranked by `documents`."""

    spec = SPEC

    def __init__(self, store: FileStore, documents: Documents) -> None:
        self._store = store
        self._documents = documents

    async def __call__(self, arguments: dict[str, Any], caller: Caller) -> dict[str, Any]:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query: a non-empty string is required")
        files = await self._store.list_files(caller.user_id, org_id=caller.org_id)
        named = arguments.get("file_ids")
        if isinstance(named, list) and named:
            files = [f for f in files if f.file_id in set(map(str, named))]
        hits = await self._documents.search(files, query[:QUERY_CHARS])
        return {
            "results": [
                {
                    "file_id": h.chunk.file_id,
                    "filename": h.chunk.filename,
                    "chunk_index": h.chunk.chunk_index,
                    "score": round(h.score, 4),
                    "text": snippet(h.chunk.text, RESULT_CHARS),
                }
                for h in hits
            ],
            "files_searched": len(files),
        }

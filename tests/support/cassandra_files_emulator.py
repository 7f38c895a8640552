"""The file statements of `cassandra_schema` (`files`, `files_by_owner`, `file_chunks`,
`citations`) over Python dicts: a base of `EmulatedCql`, with Cassandra's semantics
where `CassandraFiles` relies on them (an LWT answers `[applied]` and, refused, the
row as stored)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from conversations import cassandra_schema as cql

Row = dict[str, Any]
FILE_COLUMNS = [c.strip() for c in cql.FILE_COLUMNS.split(",")]


class EmulatedFilesCql:
    def __init__(self) -> None:
        self.files: dict[str, Row] = {}
        self.files_by_owner: dict[tuple[str, str], dict[tuple[float, str], Row]] = defaultdict(dict)
        self.file_chunks: dict[str, dict[int, Row]] = defaultdict(dict)
        self.citations: dict[str, dict[str, Row]] = defaultdict(dict)
        self.tool_steps: dict[str, dict[str, Row]] = defaultdict(dict)

    def _insert_file(self, *values: Any) -> list[Row]:
        row = dict(zip(FILE_COLUMNS, values, strict=True))
        found = self.files.get(row["file_id"])
        if found is not None:
            return [{"[applied]": False, **found}]
        self.files[row["file_id"]] = row
        return [{"[applied]": True}]

    def _insert_file_by_owner(self, *values: Any) -> list[Row]:
        row = dict(zip(FILE_COLUMNS, values, strict=True))
        self.files_by_owner[row["org_id"], row["user_id"]][row["created_at"], row["file_id"]] = row
        return []

    def _select_file(self, file_id: str) -> list[Row]:
        found = self.files.get(file_id)
        return [dict(found)] if found else []

    def _select_files_by_owner(self, org_id: str, user_id: str) -> list[Row]:
        rows = self.files_by_owner.get((org_id, user_id), {})
        return [dict(rows[key]) for key in sorted(rows, key=lambda k: (-k[0], k[1]))]

    def _delete_file(self, file_id: str, org_id: str, user_id: str) -> list[Row]:
        found = self.files.get(file_id)
        if found is None or (found["org_id"], found["user_id"]) != (org_id, user_id):
            return [{"[applied]": False, "org_id": found and found["org_id"],
                     "user_id": found and found["user_id"]}]  # fmt: skip
        del self.files[file_id]
        return [{"[applied]": True}]

    def _delete_file_by_owner(self, org_id: str, user_id: str, created_at: float,
                              file_id: str) -> list[Row]:  # fmt: skip
        self.files_by_owner.get((org_id, user_id), {}).pop((created_at, file_id), None)
        return []

    def _insert_file_chunk(self, file_id: str, index: int, content: str,
                           vector: bytes) -> list[Row]:  # fmt: skip
        self.file_chunks[file_id][index] = {
            "file_id": file_id,
            "chunk_index": index,
            "content": content,
            "vector": vector,
        }
        return []

    def _select_file_chunks(self, file_id: str) -> list[Row]:
        rows = self.file_chunks.get(file_id, {})
        return [dict(rows[i]) for i in sorted(rows)]

    def _delete_file_chunks(self, file_id: str) -> list[Row]:
        self.file_chunks.pop(file_id, None)
        return []

    def _insert_citations(self, conversation_id: str, message_id: str, text: str) -> list[Row]:
        self.citations[conversation_id][message_id] = {"message_id": message_id, "citations": text}
        return []

    def _select_citations(self, conversation_id: str) -> list[Row]:
        rows = self.citations.get(conversation_id, {})
        return [dict(rows[m]) for m in sorted(rows)]

    def _delete_citations(self, conversation_id: str) -> list[Row]:
        self.citations.pop(conversation_id, None)
        return []

    def _insert_tool_steps(self, conversation_id: str, message_id: str, text: str) -> list[Row]:
        self.tool_steps[conversation_id][message_id] = {"message_id": message_id, "steps": text}
        return []

    def _select_tool_steps(self, conversation_id: str) -> list[Row]:
        rows = self.tool_steps.get(conversation_id, {})
        return [dict(rows[m]) for m in sorted(rows)]

    def _delete_tool_steps(self, conversation_id: str) -> list[Row]:
        self.tool_steps.pop(conversation_id, None)
        return []

"""The settings of users' files (composed into `chatpipe.settings.Settings`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from retrieval.documents import FileLimits


class FileSettings(BaseModel):
    """What an upload may be, how it is chunked, what a turn retrieves."""

    max_file_bytes: int = Field(
        4 << 20, ge=1024, description="largest file POST /v1/files takes (413 file_too_large)"
    )
    max_file_chunks: int = Field(
        1000, ge=1, description="most chunks one file may make (413 too_many_chunks)"
    )
    file_chunk_chars: int = Field(
        800,
        ge=100,
        description="a file's chunks: at most this many characters, cut at "
        "paragraphs where possible",
    )
    file_chunk_overlap_chars: int = Field(
        100, ge=0, description="characters a chunk repeats from the one before it"
    )
    file_top_k: int = Field(
        4, ge=1, description="chunks of the named files a turn's prompt carries at most"
    )
    file_min_score: float = Field(
        0.1, ge=-1, le=1, description="cosine similarity below which a chunk is not retrieved"
    )

    @model_validator(mode="after")
    def _check_file_chunks(self) -> FileSettings:
        if self.file_chunk_overlap_chars >= self.file_chunk_chars:
            raise ValueError("file_chunk_overlap_chars must be less than file_chunk_chars")
        return self

    def limits(self) -> FileLimits:
        return FileLimits(
            max_file_bytes=self.max_file_bytes,
            max_chunks=self.max_file_chunks,
            chunk_chars=self.file_chunk_chars,
            overlap_chars=self.file_chunk_overlap_chars,
            top_k=self.file_top_k,
            min_score=self.file_min_score,
        )

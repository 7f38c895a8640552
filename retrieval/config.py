"""The settings of users' files (composed into `chatpipe.settings.Settings`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from retrieval.documents import FileLimits
from retrieval.extract import TextCaps
from retrieval.extraction import ExtractionLimits


class FileSettings(BaseModel):
    """What an upload may be, how it is chunked, what a turn retrieves."""

    max_file_bytes: int = Field(
        4 << 20, ge=1024, description="largest file POST /v1/files takes (413 file_too_large)"
    )
    max_file_chunks: int = Field(
        1000, ge=1, description="most chunks one file may make (413 too_many_chunks)"
    )
    max_file_pages: int = Field(
        1000, ge=1, description="most pages a PDF may have (413 too_many_pages)"
    )
    max_file_text_chars: int = Field(
        1_000_000,
        ge=1000,
        description="most characters of text a file may hold; reading stops past it "
        "(413 file_text_too_long)",
    )
    max_file_page_content_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="most bytes one PDF page's content may decode to (413 file_too_complex)",
    )
    file_extract_cpu_s: float = Field(
        20.0,
        gt=0,
        description="CPU seconds the process reading a file's text may use (RLIMIT_CPU; "
        "413 file_too_complex)",
    )
    file_extract_memory_mb: int = Field(
        512,
        ge=128,
        description="address space of the process reading a file's text, in MiB "
        "(RLIMIT_AS; 413 file_too_complex)",
    )
    file_extract_timeout_s: float = Field(
        30.0,
        gt=0,
        description="seconds before the process reading a file's text is killed "
        "(413 file_too_complex)",
    )
    max_file_extractions: int = Field(
        2,
        ge=1,
        description="files a gateway reads at once, each in its own process; 4 per "
        "process more wait, then 503 files_busy",
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
            extraction=ExtractionLimits(
                caps=TextCaps(
                    max_chars=self.max_file_text_chars,
                    max_pages=self.max_file_pages,
                    max_page_content_bytes=self.max_file_page_content_bytes,
                ),
                cpu_s=self.file_extract_cpu_s,
                memory_bytes=self.file_extract_memory_mb << 20,
                timeout_s=self.file_extract_timeout_s,
                concurrency=self.max_file_extractions,
            ),
        )

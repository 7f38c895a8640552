"""Which chunks of a user's files go into a turn's prompt, and how they are shown and
cited (pure: vectors and texts in, values out).

Ranking is exact cosine similarity (the vectors are unit length: a dot product)
over every chunk of the files the turn names, with numpy: at a few thousand chunks
per turn this is well under a millisecond. The best `top_k` at or above
`min_score` are kept, best first; ties go to the earlier file and chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.embeddings import from_bytes, similarities
from schemas.files import Citation

SNIPPET_CHARS = 200
"""How much of a cited chunk's text a citation shows."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stored chunk that may be retrieved: where it is from, its text, its vector."""

    file_id: str
    filename: str
    chunk_index: int
    text: str
    vector: bytes


@dataclass(frozen=True, slots=True)
class Hit:
    chunk: Candidate
    score: float


def rank(query: np.ndarray, candidates: Sequence[Candidate], top_k: int,
         min_score: float = -1.0) -> list[Hit]:  # fmt: skip
    """The `top_k` candidates most similar to `query` (a unit vector), best first."""
    if not candidates or top_k < 1:
        return []
    scores = similarities(query, np.stack([from_bytes(c.vector) for c in candidates]))
    order = sorted(
        range(len(candidates)), key=lambda i: -float(scores[i])
    )  # stable: ties keep order
    return [Hit(candidates[i], float(scores[i])) for i in order[:top_k]
            if float(scores[i]) >= min_score]  # fmt: skip


def context_block(hits: Sequence[Hit]) -> str | None:
    """The system message that carries the retrieved chunks into the prompt (None
    without any): each chunk under a `[n] filename (chunk i)` line, so an answer can
    refer to its sources by number."""
    if not hits:
        return None
    parts = [
        "Excerpts from the user's documents, most relevant first. Use them to answer "
        "when they help, and cite them by their number, like [1]."
    ]
    for n, hit in enumerate(hits, start=1):
        c = hit.chunk
        parts.append(f"[{n}] {c.filename} (chunk {c.chunk_index})\n{c.text}")
    return "\n\n".join(parts)


def citations(hits: Sequence[Hit]) -> list[Citation]:
    """What the answer cites: one per retrieved chunk, in the prompt's order."""
    return [Citation(file_id=h.chunk.file_id, filename=h.chunk.filename,
                     chunk_index=h.chunk.chunk_index, score=round(h.score, 4),
                     snippet=snippet(h.chunk.text)) for h in hits]  # fmt: skip


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """The start of `text` on one line, cut at a space and marked with … when longer."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat.rfind(" ", 0, limit)
    return flat[: cut if cut > limit // 2 else limit] + "…"

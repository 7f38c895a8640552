"""A document's text cut into chunks to embed (pure).

Chunks are windows of at most `max_chars` characters, cut at paragraph boundaries
(blank lines) where possible: paragraphs are packed whole into a chunk while they
fit, and each chunk after the first starts with the last paragraphs of the one
before that fit in `overlap_chars`, so a passage that spans a boundary is whole in
one of them. A paragraph longer than a chunk is cut into windows that overlap by
`overlap_chars`, each cut at a sentence end or a space where one is near.

Characters, not tokens: the chunker needs no tokenizer, and 800 characters of
English (about 200 word pieces) stay under the 256 that all-MiniLM-L6-v2 reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n+")
_SENTENCE_END = re.compile(r"[.!?:;]\s")


@dataclass(frozen=True, slots=True)
class Chunk:
    index: int
    text: str


def chunk_text(text: str, max_chars: int = 800, overlap_chars: int = 100) -> list[Chunk]:
    """The chunks of `text`, in order (none for blank text)."""
    if not 0 <= overlap_chars < max_chars:
        raise ValueError("need 0 <= overlap_chars < max_chars")
    pieces: list[str] = []
    for paragraph in paragraphs(text):
        if len(paragraph) <= max_chars:
            pieces.append(paragraph)
        else:
            pieces.extend(windows(paragraph, max_chars, overlap_chars))
    return [Chunk(i, body) for i, body in enumerate(_packed(pieces, max_chars, overlap_chars))]


def paragraphs(text: str) -> list[str]:
    """The non-blank paragraphs of `text` (split at blank lines), stripped."""
    return [p.strip() for p in _PARAGRAPH_BREAK.split(text) if p.strip()]


def windows(paragraph: str, max_chars: int, overlap_chars: int) -> list[str]:
    """`paragraph` in windows of at most `max_chars`, each starting `overlap_chars`
    before the previous one ended; a cut goes back to a sentence end or a space in the
    window's last quarter when there is one."""
    found, start = [], 0
    while start < len(paragraph):
        end = min(start + max_chars, len(paragraph))
        if end < len(paragraph):
            end = _cut_point(paragraph, start + max_chars * 3 // 4, end)
        found.append(paragraph[start:end].strip())
        if end == len(paragraph):
            break
        start = max(end - overlap_chars, start + 1)
    return [w for w in found if w]


def _cut_point(text: str, lo: int, hi: int) -> int:
    sentence = [m.end() for m in _SENTENCE_END.finditer(text, lo, hi + 1) if m.end() <= hi]
    if sentence:
        return sentence[-1]
    space = text.rfind(" ", lo, hi)
    return space + 1 if space > lo else hi


def _packed(pieces: list[str], max_chars: int, overlap_chars: int) -> list[str]:
    """Pieces joined by blank lines into chunks of at most `max_chars`; each new chunk
    repeats the tail pieces of the last that fit in `overlap_chars`."""
    chunks: list[list[str]] = []
    current: list[str] = []
    for piece in pieces:
        if current and _size([*current, piece]) > max_chars:
            chunks.append(current)
            current = _tail(current, overlap_chars)
            while current and _size([*current, piece]) > max_chars:
                current.pop(0)
        current.append(piece)
    if current:
        chunks.append(current)
    return ["\n\n".join(chunk) for chunk in chunks]


def _tail(pieces: list[str], overlap_chars: int) -> list[str]:
    tail: list[str] = []
    for piece in reversed(pieces):
        if _size([piece, *tail]) > overlap_chars:
            break
        tail.insert(0, piece)
    return tail


def _size(pieces: list[str]) -> int:
    return sum(map(len, pieces)) + 2 * (len(pieces) - 1)

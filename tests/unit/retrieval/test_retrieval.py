"""The pure parts of retrieval: a file's text (text, Markdown, PDF), its chunks, and
the ranking, prompt block and citations made of them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from common.embeddings import to_bytes
from retrieval.chunking import chunk_text, paragraphs, windows
from retrieval.extract import (
    MARKDOWN,
    PDF,
    TEXT,
    UnreadableFile,
    UnsupportedFile,
    extract_text,
    file_type,
)
from retrieval.ranking import Candidate, Hit, citations, context_block, rank, snippet
from schemas import sse
from schemas.sse import parse_messages
from tests.support.documents import pdf_of

# --- extraction -----------------------------------------------------------------------


@pytest.mark.parametrize(("filename", "declared", "data", "kind"), [
    ("notes.txt", None, b"hi", TEXT),
    ("NOTES.MD", "application/octet-stream", b"# hi", MARKDOWN),
    ("readme.markdown", None, b"hi", MARKDOWN),
    ("paper.pdf", None, b"%PDF-1.7 ...", PDF),
    ("renamed.txt", "text/plain", b"%PDF-1.4 ...", PDF),  # the signature wins
    ("upload", "text/markdown; charset=utf-8", b"hi", MARKDOWN),
    ("upload", "text/plain", b"hi", TEXT),
    ("upload", "application/pdf", b"%PDF-", PDF),
])  # fmt: skip
def test_the_type_comes_from_the_signature_the_name_then_the_declared_type(
    filename, declared, data, kind
) -> None:
    assert file_type(filename, declared, data) == kind


@pytest.mark.parametrize(("filename", "declared"), [
    ("photo.png", "image/png"), ("sheet.xlsx", None), ("upload", None),
    ("page.html", "text/html"),
])  # fmt: skip
def test_other_types_are_unsupported(filename, declared) -> None:
    with pytest.raises(UnsupportedFile):
        file_type(filename, declared, b"\x89PNG....")


def test_text_and_markdown_are_utf8_with_plain_line_ends() -> None:
    assert extract_text(TEXT, "\ufeffcafé\r\nline\rend".encode()) == "café\nline\nend"
    markdown = "# Title\n\n- a *list*\n\n```py\ncode\n```\n"
    assert extract_text(MARKDOWN, markdown.encode()) == markdown


@pytest.mark.parametrize("data", [b"\xff\xfe\x00bad", b"   \n\n\t ", b""])
def test_text_that_is_not_utf8_or_blank_is_unreadable(data) -> None:
    with pytest.raises(UnreadableFile):
        extract_text(TEXT, data)


def test_a_pdf_gives_the_text_of_every_page() -> None:
    text = extract_text(PDF, pdf_of("The lighthouse keeper (Anna)\nlit the lamp.",
                                    "Page two: the storm."))  # fmt: skip
    assert text == "The lighthouse keeper (Anna)\nlit the lamp.\n\nPage two: the storm."


@pytest.mark.parametrize("data", [b"%PDF-1.7 not really a pdf", pdf_of("   ")])
def test_a_broken_or_textless_pdf_is_unreadable(data) -> None:
    with pytest.raises(UnreadableFile):
        extract_text(PDF, data)


# --- chunking ---------------------------------------------------------------------------


def test_short_text_is_one_chunk_and_blank_text_none() -> None:
    assert [c.text for c in chunk_text("  One paragraph.  \n")] == ["One paragraph."]
    assert chunk_text(" \n\n \n") == []


def test_paragraphs_split_at_blank_lines() -> None:
    assert paragraphs("a\nb\n\n\n  c \n \t\nd") == ["a\nb", "c", "d"]


def test_paragraphs_are_packed_whole_with_the_last_one_repeated_as_overlap() -> None:
    paras = [f"p{i} " + "x" * 36 for i in range(6)]  # 40 characters each
    chunks = chunk_text("\n\n".join(paras), max_chars=130, overlap_chars=45)

    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert [c.text.split("\n\n") for c in chunks] == [paras[0:3], paras[2:5], paras[4:6]]
    assert all(len(c.text) <= 130 for c in chunks)


def test_without_overlap_no_paragraph_is_repeated() -> None:
    paras = [f"p{i} " + "x" * 36 for i in range(5)]
    chunks = chunk_text("\n\n".join(paras), max_chars=100, overlap_chars=0)
    assert [c.text.split("\n\n") for c in chunks] == [paras[0:2], paras[2:4], paras[4:5]]


def test_a_long_paragraph_is_cut_into_overlapping_windows_at_sentence_ends() -> None:
    sentences = [f"Sentence number {i} says something." for i in range(30)]
    paragraph = " ".join(sentences)
    cut = windows(paragraph, max_chars=200, overlap_chars=50)

    assert all(len(w) <= 200 for w in cut)
    assert all(w.endswith(".") for w in cut)
    for before, after in itertools.pairwise(cut):
        assert after[:20] in before  # each window starts inside the one before
    assert cut[-1].endswith(sentences[-1])
    assert "".join(cut).count(sentences[0]) == 1


def test_a_paragraph_without_spaces_is_cut_at_the_window() -> None:
    cut = windows("x" * 250, max_chars=100, overlap_chars=10)
    assert [len(w) for w in cut] == [100, 100, 70]


def test_every_word_of_the_text_is_in_some_chunk() -> None:
    words = [f"w{i}" for i in range(2000)]
    text = "\n\n".join(" ".join(words[i : i + 37]) for i in range(0, 2000, 37))
    chunks = chunk_text(text, max_chars=300, overlap_chars=60)
    found = {w for c in chunks for w in c.text.split()}
    assert found == set(words)
    assert all(len(c.text) <= 300 for c in chunks)


def test_the_overlap_must_be_less_than_a_chunk() -> None:
    with pytest.raises(ValueError):
        chunk_text("text", max_chars=100, overlap_chars=100)


# --- ranking ----------------------------------------------------------------------------


def unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def candidate(file_id: str, index: int, vector: np.ndarray, text: str = "") -> Candidate:
    return Candidate(file_id, f"{file_id}.md", index, text or f"text {index}", to_bytes(vector))


def test_rank_keeps_the_most_similar_best_first() -> None:
    chunks = [candidate("f1", 0, unit(0, 1)), candidate("f1", 1, unit(1, 0.2)),
              candidate("f2", 0, unit(1, 0)), candidate("f2", 1, unit(-1, 0))]  # fmt: skip
    hits = rank(unit(1, 0), chunks, top_k=2)

    assert [(h.chunk.file_id, h.chunk.chunk_index) for h in hits] == [("f2", 0), ("f1", 1)]
    assert hits[0].score == pytest.approx(1.0)
    assert hits[1].score == pytest.approx(1 / np.sqrt(1.04), rel=1e-5)


def test_rank_drops_what_scores_under_the_minimum_and_keeps_ties_in_order() -> None:
    chunks = [candidate("f1", 0, unit(1, 1)), candidate("f1", 1, unit(0, 1)),
              candidate("f2", 0, unit(1, 1)), candidate("f2", 1, unit(-1, 0))]  # fmt: skip
    hits = rank(unit(1, 1), chunks, top_k=10, min_score=0.5)
    assert [(h.chunk.file_id, h.chunk.chunk_index) for h in hits] == [
        ("f1", 0),
        ("f2", 0),
        ("f1", 1),
    ]


@pytest.mark.parametrize("top_k", [0, -1])
def test_rank_edges(top_k) -> None:
    assert rank(unit(1, 0), [], top_k=3) == []
    assert rank(unit(1, 0), [candidate("f", 0, unit(1, 0))], top_k=top_k) == []


def test_the_context_block_numbers_each_excerpt_with_its_source() -> None:
    hits = [Hit(candidate("f2", 3, unit(1, 0), "The lamp is lit at dusk."), 0.9),
            Hit(candidate("f1", 0, unit(1, 0), "Anna keeps the light."), 0.5)]  # fmt: skip
    block = context_block(hits)

    assert block is not None
    assert block.index("[1] f2.md (chunk 3)\nThe lamp is lit at dusk.") < block.index(
        "[2] f1.md (chunk 0)\nAnna keeps the light."
    )
    assert context_block([]) is None


def test_citations_follow_the_prompt_with_rounded_scores() -> None:
    hits = [Hit(candidate("f2", 3, unit(1, 0), "The lamp\n is lit."), 0.912345)]
    assert [
        (c.file_id, c.filename, c.chunk_index, c.score, c.snippet) for c in citations(hits)
    ] == [("f2", "f2.md", 3, 0.9123, "The lamp is lit.")]


def test_a_snippet_is_one_line_cut_at_a_word() -> None:
    assert snippet("short\n\ntext") == "short text"
    long = "word " * 100
    cut = snippet(long, limit=50)
    assert cut.endswith("word…") and len(cut) <= 51


def test_the_citations_event_carries_them_in_order() -> None:
    hits = [Hit(candidate("f2", 3, unit(1, 0), "The lamp."), 0.9),
            Hit(candidate("f1", 0, unit(1, 0), "Anna."), 0.5)]  # fmt: skip
    [message] = parse_messages(sse.citations_event(citations(hits)).decode())
    assert message.event == "citations" and message.id is None
    assert [c["file_id"] for c in message.json()["citations"]] == ["f2", "f1"]

"""A file's name as it is stored and shown (`conversations.files.display_filename`):
no control or bidi-control characters, white space made plain, every script kept."""

from __future__ import annotations

import pytest

from conversations.files import UNNAMED, display_filename

FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467.md"


@pytest.mark.parametrize(("sent", "shown"), [
    ("notes.md", "notes.md"),
    ("\x1b[31mred\x1b[0m.pdf", "[31mred[0m.pdf"),  # ESC: a terminal's colours
    ("invoice\u202efdp.exe", "invoicefdp.exe"),  # RIGHT-TO-LEFT OVERRIDE
    ("a\u202ab\u202bc\u202cd\u202de.txt", "abcde.txt"),  # embeddings and overrides
    ("\u2066x\u2067y\u2068z\u2069.md", "xyz.md"),  # isolates
    ("l\u200em\u200fn\u061c.md", "lmn.md"),  # directional marks
    ("nul\x00bel\x07del\x7f.txt", "nulbeldel.txt"),  # C0 and DEL
    ("c1\x80\x9b\x9f.txt", "c1.txt"),  # C1
    ("two\nlines\r\nand\ttab.md", "two lines and tab.md"),
    ("sep\u2028line\u2029para\x85nel.md", "sep line para nel.md"),
    ("zero\u200bwidth\ufeff\u2060\u00ad.md", "zerowidth.md"),
    ("  spaced   out  .md ", "spaced out .md"),
    ("тест 报告 تقرير.pdf", "тест 报告 تقرير.pdf"),
    ("प्रति\u200dवेदन.md", "प्रति\u200dवेदन.md"),  # ZWJ, which scripts need, stays
    (FAMILY, FAMILY),  # an emoji's ZWJ sequence too
    ("lone\ud800surrogate.md", "lonesurrogate.md"),
    ("\x1b\u202e\u2066 \t", UNNAMED),
    ("", UNNAMED),
])  # fmt: skip
def test_a_name_is_shown_without_controls(sent: str, shown: str) -> None:
    assert display_filename(sent) == shown
    assert display_filename(shown) == shown  # stored names are already as shown

"""The streaming output buffer: hold back a window, release what has been checked.

Text enters with `feed`. `to_check` is what classifiers must look at now: the
unchecked text plus an overlap of already-checked text, so a phrase split
across chunks is still seen whole. `passed` marks it checked and releases
everything older than the window (or, in sentence mode, everything up to the
last sentence boundary); `finish` releases the rest at the end of the stream.
With `window_chars=0` checked text passes straight through.
"""

from __future__ import annotations

import re

SENTENCE_END = re.compile(r"[.!?\n]\s*")


class OutputGate:
    def __init__(
        self, window_chars: int = 0, overlap_chars: int = 64, sentences: bool = False
    ) -> None:
        self.window_chars = window_chars
        self.overlap_chars = overlap_chars
        self.sentences = sentences
        self._text = ""
        self._checked = 0
        self._released = 0

    @property
    def text(self) -> str:
        """Everything fed so far."""
        return self._text

    @property
    def released(self) -> str:
        return self._text[: self._released]

    def feed(self, text: str) -> None:
        self._text += text

    def to_check(self) -> str:
        """Unchecked text with `overlap_chars` of checked text before it."""
        return self._text[max(0, self._checked - self.overlap_chars) :]

    def passed(self) -> str:
        """Everything fed is checked: returns the text that may be sent now."""
        self._checked = len(self._text)
        return self._release_to(self._cut())

    def finish(self) -> str:
        """End of stream (all of it checked): release whatever is held."""
        self._checked = len(self._text)
        return self._release_to(len(self._text))

    def _cut(self) -> int:
        if self.sentences:
            ends = [m.end() for m in SENTENCE_END.finditer(self._text, self._released)]
            return ends[-1] if ends else self._released
        return max(self._released, len(self._text) - self.window_chars)

    def _release_to(self, cut: int) -> str:
        out = self._text[self._released : cut]
        self._released = max(self._released, cut)
        return out

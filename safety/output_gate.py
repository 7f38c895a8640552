"""The streaming output buffer: hold back a window, release what has passed.

The seam later classifiers plug into: text enters with `feed`, leaves through
the return value once it is older than the window; `finish` releases the rest.
With `window_chars=0` text passes straight through.
"""

from __future__ import annotations


class OutputGate:
    def __init__(self, window_chars: int = 0) -> None:
        self.window_chars = window_chars
        self.released = ""
        self._held = ""

    @property
    def text(self) -> str:
        """Everything fed so far, released or held."""
        return self.released + self._held

    def feed(self, text: str) -> str:
        """Add generated text; returns the text that may be sent now."""
        self._held += text
        cut = max(0, len(self._held) - self.window_chars)
        return self._release(cut)

    def finish(self) -> str:
        """End of stream: release whatever is held."""
        return self._release(len(self._held))

    def _release(self, cut: int) -> str:
        out, self._held = self._held[:cut], self._held[cut:]
        self.released += out
        return out

"""The terminal client prints model text only through `printable`: no escape sequence
from an answer reaches the terminal, and ordinary Unicode text is kept as it is."""

import io

import pytest

from chatpipe.terminal import TerminalChat, printable

ESC, BEL, ST = "\x1b", "\x07", "\x1b\\"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        # OSC 52: write "rm -rf ~" to the clipboard, BEL- and ST-terminated.
        (f"copy this{ESC}]52;c;cm0gLXJmIH4K{BEL} now", "copy this now"),
        (f"copy this{ESC}]52;c;cm0gLXJmIH4K{ST} now", "copy this now"),
        # CSI: clear the screen and home the cursor, then recolour.
        (f"{ESC}[2J{ESC}[Hfake prompt{ESC}[31;1m red{ESC}[0m", "fake prompt red"),
        # OSC 0/2: set the window title; OSC 8: a hyperlink whose target differs from its text.
        (f"{ESC}]0;pwned{BEL}{ESC}]2;sudo{ST}title", "title"),
        (
            f"{ESC}]8;;https://attacker.example{ST}https://bank.example{ESC}]8;;{ST}",
            "https://bank.example",
        ),
        # DCS (e.g. a tmux passthrough), full reset, cursor save/restore, charset switch.
        (f"a{ESC}Ptmux;{ESC}{ESC}]52;c;eA=={BEL}{ST}b{ESC}c{ESC}7{ESC}8{ESC}(0c", "abc"),
        # 8-bit C1 forms of CSI and OSC.
        ("x\x9b2Jy\x9d0;title\x9cz", "xyz"),
        # Carriage return, backspace and other C0 controls rewrite what is on screen.
        ("safe\rEVIL\x08\x08\x00\x7f!", "safeEVIL!"),
        # Bidi overrides make a line read differently from what it holds.
        ("access \u202egnp.exe\u202c level \u2066x\u2069", "access gnp.exe level x"),
    ],
)
def test_escape_sequences_and_controls_are_removed(raw, shown):
    assert printable(raw) == shown


@pytest.mark.parametrize(
    "text",
    [
        "plain ASCII, with\ttabs and\nnew lines",
        "Grüße, こんにちは, مرحبا, שלום 👋🏽 — “quotes” … ≤ ∑",
        "code: `printf '%s\\n' \"$HOME\"` [link](https://example.com)",
    ],
)
def test_ordinary_text_is_kept(text):
    assert printable(text) == text


def test_windows_line_ends_become_new_lines():
    assert printable("one\r\ntwo\r\n") == "one\ntwo\n"


def test_a_sequence_split_across_deltas_does_nothing():
    """The ESC is dropped from the first delta; the rest prints as inert text."""
    first, second = printable(f"before{ESC}"), printable(f"]52;c;eA=={BEL}after")
    assert ESC not in first + second and BEL not in first + second
    assert (first, second) == ("before", "]52;c;eA==after")


def test_everything_the_client_prints_goes_through_printable():
    out = io.StringIO()
    chat = TerminalChat(api=None, conversation_id=None, out=out)  # type: ignore[arg-type]
    chat.say(f"answer{ESC}]52;c;eA=={BEL}{ESC}[2J", end="")
    chat.say(f"[error x: {ESC}]0;title{BEL}msg]")
    assert out.getvalue() == "answer[error x: msg]\n"

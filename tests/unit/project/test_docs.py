"""What the docs show is what the product has: every `chatpipe` command a page or the
web page's sign-in card shows exists, with the options it is shown with; the README
stays short; reference pages carry no dates (those belong to the benchmarks page).

The docs site's links and nav are checked by `mkdocs build --strict` in `make check`;
the settings table by `test_deployment_files.py`; the first-request commands by
`tests/e2e/test_first_request.py`, against a running `chatpipe up`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
import typer.testing

from chatpipe.cli import app

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
SHOWN_IN = [*PAGES, ROOT / "gateway" / "static" / "index.html"]
HISTORY_PAGES = {DOCS / "benchmarks.md", DOCS / "CAPACITY.md"}
"""Where dates may appear: the benchmarks' results, and the generated capacity model."""

COMMAND = re.compile(
    r"(?:^|`|\(|\$ |&& |; |-- |\| |<code>|^\s+)chatpipe((?: +[\w<>\[\]./=:*,-]+)+)"
)
"""`chatpipe` where a shell runs it (not `kubectl -n chatpipe ...`), and its words."""
SHELL_STOP = {"|", "||", "&&", ";", ">", ">>", "2>&1", "#", "&"}


def shown_commands() -> list[tuple[str, list[str]]]:
    """(page, argv) of each `chatpipe ...` in code on the pages: inline code spans,
    `<code>` elements and fenced blocks."""
    shown = []
    for page in SHOWN_IN:
        text = page.read_text()
        fences = re.findall(r"```([^\n]*)\n(.*?)```", text, re.S)
        spans = [body for language, body in fences if language != "text"]  # not output
        spans += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        spans += re.findall(r"<code>(.*?)</code>", text)
        for span in spans:
            for line in span.splitlines():
                for match in COMMAND.finditer(line):
                    words = match.group(1).split()
                    argv = []
                    for word in words:
                        if word in SHELL_STOP or word.startswith("#"):
                            break
                        argv.append(word)
                    shown.append((page.relative_to(ROOT).as_posix(), argv))
    return shown


def is_group(command: Any) -> bool:
    return isinstance(getattr(command, "commands", None), dict)


def resolve(argv: list[str]) -> tuple[Any, list[str]]:
    """The command `argv` names (a Click command, as Typer builds it) and the words
    after its name; fails on a subcommand that does not exist."""
    command: Any = typer.main.get_command(app)
    rest = list(argv)
    while is_group(command) and rest and not rest[0].startswith("-"):
        if rest[0].startswith("<"):
            break  # `chatpipe <stage>`: a placeholder for any of them
        name = rest.pop(0)
        assert name in command.commands, f"`chatpipe {' '.join(argv)}`: no command {name!r}"
        command = command.commands[name]
    return command, rest


def option_names(command: Any) -> set[str]:
    return {name for p in command.params for name in (*p.opts, *p.secondary_opts)} | {"--help"}


SHOWN = shown_commands()


def test_the_pages_show_commands() -> None:
    pages = {page for page, _ in SHOWN}
    assert {"README.md", "docs/getting-started.md", "gateway/static/index.html"} <= pages


@pytest.mark.parametrize(("page", "argv"), SHOWN, ids=[f"{p}:{' '.join(a)}" for p, a in SHOWN])
def test_every_command_shown_exists_with_its_options(page: str, argv: list[str]) -> None:
    command, rest = resolve(argv)
    if is_group(command):
        return  # `chatpipe keys`, a group named in prose
    options = {word.split("=", 1)[0] for word in rest if word.startswith("--")}
    unknown = options - option_names(command)
    assert not unknown, f"{page}: `chatpipe {' '.join(argv)}` has no option {sorted(unknown)}"
    result = typer.testing.CliRunner().invoke(app, [*argv[: len(argv) - len(rest)], "--help"])
    assert result.exit_code == 0, result.output


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md is {len(lines)} lines: move detail into docs/"


def prose(text: str) -> str:
    """`text` without its code: examples may show timestamps."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


@pytest.mark.parametrize("page", [p for p in PAGES if p not in HISTORY_PAGES], ids=str)
def test_reference_pages_say_what_is_without_dates(page: Path) -> None:
    dates = re.findall(r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d UTC\b", prose(page.read_text()))
    assert not dates, f"{page.name} dates its text ({dates}): results go to docs/benchmarks.md"

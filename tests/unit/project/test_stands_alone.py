"""The repository stands alone: no file points a reader at something outside it.

Code, comments, tests and docs explain themselves (or point at `docs/`), never at a
tracker's issue number, a planning document beside the checkout, or a numbered rule in
one. The patterns are built from pieces so that this file's own text does not match.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())

SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".html", ".js", ".cfg"}
NAMES = {"Makefile", "Dockerfile"}
SKIPPED_DIRS = {
    ".git",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    "build",
    "dist",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
}

_DESIGN = "DES" + "IGN"
_STYLE = "STY" + "LE"
_SECTION = "\u00a7"
OUTSIDE = {
    "the folder beside the checkout": re.compile(r"\.\./" + "shared"),
    "the design notes": re.compile(_DESIGN + r"\.md"),
    "the style notes": re.compile(_STYLE + r"\.md"),
    "a design section": re.compile(_DESIGN + r"\s*" + _SECTION),
    "a style rule": re.compile(_STYLE + r"\s+\d"),
    "a bare section number": re.compile(_SECTION + r"\s?\d"),
    "an issue number": re.compile(r"\b" + "iss" + r"ues?\s+#?\d+", re.IGNORECASE),
    "an issue reference": re.compile(r"\(#\d+\)"),
}


def _is_checked(path: Path) -> bool:
    return path.suffix in SUFFIXES or path.name in NAMES


def _files() -> list[Path]:
    """The tracked files, or (outside a git checkout) every file but build outputs."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
        paths = [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [
            p
            for p in ROOT.rglob("*")
            if not SKIPPED_DIRS.intersection(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.parts)
        ]
    return sorted(p for p in paths if p.is_file() and _is_checked(p))


def references_outside(text: str) -> list[str]:
    """Each reference in `text` to something outside the repository, with what it is."""
    found = []
    for what, pattern in OUTSIDE.items():
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"line {line}: {what}: {match.group(0)!r}")
    return found


def test_the_patterns_catch_what_they_are_for() -> None:
    design, style, section = _DESIGN, _STYLE, _SECTION
    caught = [
        "see ../" + "shared/notes",
        f"({design}.md)",
        f"{style}.md, rule one",
        f"(the design, {design} {section}11)",
        f"(pure: {style} 1)",
        f"{design}\n{section}11",
        f"Reading the targets ({'iss'}ue 11)",
        f"{'Iss'}ue #12",
        f"({'iss'}ues 11 and 12)",
        f"{'iss'}ue\n16, point 2",
        "fixed in (" + "#12)",
    ]
    for text in caught:
        assert references_outside(text), text
    for text in ("a tissue 5 cm wide", 'AddedToken("\u00a7", special=True)', "# 12 rows"):
        assert not references_outside(text), text


def test_no_file_refers_outside_the_repository() -> None:
    files = _files()
    assert files, "no files found to check"
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{path.relative_to(ROOT)}: {ref}" for ref in references_outside(text)]
    assert not found, "references a reader cannot follow:\n" + "\n".join(found)

"""Stage profiles: each stage under pyinstrument while the capacity load runs.

`python -m bench profile` writes, per stage, the pyinstrument session and its
call tree as text (in a temporary directory), and `bench/PROFILE.md`: the
functions where each stage spends its own time in event-loop callbacks.
"""

from __future__ import annotations

import sys
from pathlib import Path

WORK_ROOT = "Handle._run"
"""Event-loop callbacks: the steady-state work (start-up imports and select excluded)."""


def profiler_command() -> list[str]:
    """The wrapper `capacity()` puts in front of each stage; `{out}` is the stage's path."""
    return [
        sys.executable,
        "-m",
        "pyinstrument",
        "--renderer",
        "pyisession",
        "--outfile",
        "{out}.pyisession",
    ]


def hot_functions(session_path: Path, top: int = 12) -> tuple[float, list[tuple[str, float]]]:
    """(seconds in event-loop callbacks, the `top` functions by own time in them)."""
    from pyinstrument.session import Session

    root = Session.load(str(session_path)).root_frame()
    own: dict[str, float] = {}
    stack = [(root, False)] if root is not None else []
    while stack:
        frame, in_work = stack.pop()
        in_work = in_work or _name(frame) == WORK_ROOT
        children = list(frame.children)
        stack.extend((child, in_work) for child in children)
        if in_work and not children:
            owner = frame.parent if frame.is_synthetic_leaf and frame.parent else frame
            where = f"{_name(owner)} ({owner.file_path_short}:{owner.line_no})"
            own[where] = own.get(where, 0.0) + frame.total_self_time
    return sum(own.values()), sorted(own.items(), key=lambda item: item[1], reverse=True)[:top]


def _name(frame: object) -> str:
    cls = getattr(frame, "class_name", None)
    function = getattr(frame, "function", "")
    return f"{cls}.{function}" if cls else function


def write_summary(profile_dir: Path, stages: tuple[str, ...], summary: Path) -> Path:
    """Each stage's call tree as text beside its session, and the hot functions in `summary`."""
    from pyinstrument.renderers import ConsoleRenderer
    from pyinstrument.session import Session

    lines = [
        "# Where each stage spends its time (pyinstrument, sim capacity load)\n",
        "Own time of the functions under the event loop's callbacks (`Handle._run`), "
        "so start-up imports and waiting in select are left out. Wall-clock samples: on "
        "a busy machine they include time a stage waited for a core.\n",
    ]
    for stage in stages:
        path = profile_dir / f"{stage}.pyisession"
        if not path.exists():
            continue
        text = ConsoleRenderer(unicode=True, color=False).render(Session.load(str(path)))
        (profile_dir / f"{stage}.txt").write_text(text)
        busy, hot = hot_functions(path)
        lines += [
            f"## {stage}: {busy:.1f} s in event-loop callbacks\n",
            "| own s | share | function |",
            "|---|---|---|",
        ]
        lines += [f"| {seconds:.2f} | {seconds / busy:.0%} | `{name}` |" for name, seconds in hot]
        lines.append("")
    lines.append(f"Sessions and call trees: `{profile_dir}`\n")
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text("\n".join(lines))
    return summary

"""Which server tools exist, by name: what the model is shown of each (`ToolSpec`),
and how wiring builds the ones an operator turned on (`CHATPIPE_SERVER_TOOLS`)."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.tools import ToolSpec
from servertools import calculator, clock, documents

SPECS: dict[str, ToolSpec] = {
    spec.function.name: spec for spec in (calculator.SPEC, clock.SPEC, documents.SPEC)
}
"""Every server tool chatpipe has."""


def specs(names: Sequence[str]) -> tuple[ToolSpec, ...]:
    """The specs of the tools named, in order; `KeyError` for a name not in `SPECS`."""
    return tuple(SPECS[name] for name in names)

"""Responses API streams read."""

from __future__ import annotations


def deltas(events) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")

"""The server tools an operator turned on, and running one call of the model's: with a
timeout, and every failure (bad arguments, an unknown tool, a raise, the timeout)
turned into an error result for the model, never into a stuck stream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from schemas.tools import ToolCall, ToolSpec
from servertools.core import Caller, Outcome, error_outcome

log = logging.getLogger(__name__)

RESULT_CHARS = 8000
"""The most of a result the model is given (a longer one is an error)."""


class ServerTool(Protocol):
    """A tool chatpipe runs: its spec (what the model is shown) and the call itself,
    which returns a JSON value or raises."""

    spec: ToolSpec

    async def __call__(self, arguments: dict[str, Any], caller: Caller, /) -> Any: ...


class Toolbox:
    """The tools on, by name; `run` one call of the model's."""

    def __init__(self, tools: Iterable[ServerTool], timeout_s: float) -> None:
        self.tools = {tool.spec.function.name: tool for tool in tools}
        self.timeout_s = timeout_s

    async def run(self, call: ToolCall, caller: Caller) -> Outcome:
        name = call.function.name
        tool = self.tools.get(name)
        if tool is None:
            return error_outcome(f"unknown tool {name!r}")
        try:
            arguments = orjson.loads(call.function.arguments or "{}")
        except orjson.JSONDecodeError:
            return error_outcome("the arguments are not JSON")
        if not isinstance(arguments, dict):
            return error_outcome("the arguments are not a JSON object")
        try:
            async with asyncio.timeout(self.timeout_s):
                value = await tool(arguments, caller)
        except TimeoutError:
            return error_outcome(f"{name} took longer than {self.timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - any failure is the model's error result
            log.info("tool %s failed: %r", name, exc)
            return error_outcome(str(exc) or type(exc).__name__)
        content = orjson.dumps(value, default=str).decode()
        if len(content) > RESULT_CHARS:
            return error_outcome(f"the result is longer than {RESULT_CHARS} characters")
        return Outcome(content)

"""The server tools an operator turned on, and running one call of the model's: with a
timeout, and every failure turned into an error result for the model, never into a
stuck stream: bad arguments, an unknown tool, a raise, the timeout, and a result that
is no JSON the bus can carry (`result_outcome`)."""

from __future__ import annotations

import asyncio
import logging
import math
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
        """The call's outcome; it never raises (but for the stage's own cancellation)."""
        try:
            return await self._run(call, caller)
        except Exception:  # a failure of the toolbox itself is still the model's error
            log.exception("running %s failed", call.function.name)
            return error_outcome(f"{call.function.name} failed")

    async def _run(self, call: ToolCall, caller: Caller) -> Outcome:
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
        return result_outcome(name, value)


def result_outcome(name: str, value: Any) -> Outcome:
    """Tool `name`'s `value` as its result's JSON text, or an error result when it is
    no JSON the bus carries: an integer beyond 64 bits, NaN or an infinity, a type JSON
    has no value for (a set, bytes, an object), a key that is not a string, or more
    than `RESULT_CHARS` characters of it."""
    try:
        content = orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:
        log.info("tool %s gave a result that is not JSON: %s", name, exc)
        return error_outcome(f"{name} gave a result that is not JSON: {exc}")
    if len(content) > RESULT_CHARS:
        return error_outcome(f"the result is longer than {RESULT_CHARS} characters")
    if "null" in content and not _finite(value):  # orjson writes NaN and inf as null
        return error_outcome(f"{name} gave a result that is not JSON: a number is not finite")
    return Outcome(content)


def _finite(value: Any) -> bool:
    """No float in `value`'s lists and objects is NaN or an infinity."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True

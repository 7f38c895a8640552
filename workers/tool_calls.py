"""An answer's tool calls, from the text a constrained generation produced (pure).

A required or named tool choice holds the engine's output to a JSON schema, as vLLM's
own OpenAI server builds it (`vllm.tool_parsers.utils.get_json_schema_from_tools`):
named, the output is the function's arguments object; required, a list of
`{"name": ..., "parameters": {...}}`, one item unless parallel calls are allowed.
`constrained_calls` reads that text back into `ToolCalls`. An `auto` answer is read by
the model's own tool parser instead (`workers.vllm_engine`).

"""

from __future__ import annotations

import json
from typing import Any

from schemas.tools import FunctionCall, ToolCall, ToolCalls, ToolUse, call_id


def constrained_calls(text: str, tool_use: ToolUse, request_id: str) -> ToolCalls | None:
    """The calls in a constrained answer's `text`; None when the text is not what the
    constraint makes (it stopped early, at its length limit). A named call's arguments
    are the text itself; each of a list's are written again from the list."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if tool_use.choice == "function":
        if not isinstance(value, dict) or tool_use.function is None:
            return None
        # The arguments as generated, as they were streamed (vLLM passes them on so too).
        call = ToolCall(
            id=call_id(request_id, 0),
            function=FunctionCall(name=tool_use.function, arguments=text.strip()),
        )
        return ToolCalls(calls=(call,))
    if isinstance(value, list):
        pairs = [
            (item.get("name"), item.get("parameters")) for item in value if isinstance(item, dict)
        ]
    else:
        return None
    calls = [
        (name, arguments)
        for name, arguments in pairs
        if isinstance(name, str) and tool_use.spec(name) is not None and isinstance(arguments, dict)
    ]
    if not calls or len(calls) != len(pairs):
        return None
    return ToolCalls(
        calls=tuple(
            ToolCall(
                id=call_id(request_id, index),
                function=FunctionCall(
                    name=name, arguments=json.dumps(arguments, ensure_ascii=False)
                ),
            )
            for index, (name, arguments) in enumerate(calls)
        )
    )


def example_output(tool_use: ToolUse) -> str:
    """Text that meets a constrained tool use: its first (or named) function, called
    with the least arguments its schema takes. The sim engine answers with it."""
    name = tool_use.function or tool_use.tools[0].function.name
    spec = tool_use.spec(name)
    arguments = example_value(spec.parameters if spec and spec.parameters else {})
    if tool_use.choice == "function":
        return json.dumps(arguments)
    return json.dumps([{"name": name, "parameters": arguments}])


EXAMPLE_SIZE = 64
"""The most items or characters an example has (a schema may ask for millions)."""


def example_value(schema: dict[str, Any]) -> Any:
    """A small value valid under simple JSON schemas: each required property, the first
    of an enum, a const, zeros and empties (at most `EXAMPLE_SIZE` long); an object
    where the type is not said."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for keyword in ("anyOf", "oneOf"):
        if schema.get(keyword):
            return example_value(schema[keyword][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0] if kind else "object"
    if kind == "object":
        properties = schema.get("properties", {})
        return {
            name: example_value(properties.get(name, {})) for name in schema.get("required", ())
        }
    if kind == "array":
        item = example_value(schema.get("items", {}))
        return [item] * min(schema.get("minItems", 0), EXAMPLE_SIZE)
    if kind == "string":
        return "x" * min(schema.get("minLength", 0), EXAMPLE_SIZE)
    if kind in ("integer", "number"):
        return max(0, schema.get("minimum", 0))
    return {"boolean": False, "null": None}.get(kind, {})

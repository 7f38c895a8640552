"""The official openai SDK on a stack, and the tools its calls use."""

from __future__ import annotations

import openai

from chatpipe.dev_stack import API_KEY

WEATHER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "unit"],
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
}
CLOCK = {
    "type": "object",
    "additionalProperties": False,
    "required": ["utc"],
    "properties": {"utc": {"type": "boolean"}},
}
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "description": f"{name} of a place", "parameters": schema},
    }
    for name, schema in SCHEMAS.items()
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def sdk(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=API_KEY, max_retries=0)


async def streamed(client, **request):
    """A streamed completion read as OpenAI's clients read it: content joined, tool
    calls assembled by `index` (id and name from their first part, arguments joined)."""
    stream = await client.chat.completions.create(stream=True, **request)
    content, calls, finish = "", {}, None
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for part in choice.delta.tool_calls or ():
                call = calls.setdefault(part.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = part.id or call["id"]
                call["name"] = part.function.name or call["name"]
                call["arguments"] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish

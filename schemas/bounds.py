"""What a number or a JSON value in a request may be: what the bus and the engine take.

The bus encodes events with orjson, which writes integers of 64 bits at most, writes
infinity and NaN as null, and nests at most 254 levels; the engine (vLLM's
`SamplingParams`) refuses a penalty that is not finite. So every integer a request
carries is bounded (`INT32_MAX`; a seed is an unsigned 64-bit integer, `SEED_LIMIT`),
every float is finite (`Finite`), and a JSON schema a request hands the engine is
bounded in depth and size (`json_shape_error`): the gateway checks it with `jsonschema`,
which recurses a level at a time and takes about 100 µs a value. The HTTP models
declare these bounds (`schemas.api`), so the API document shows them and a request
outside them is a 4xx naming the field before anything is charged.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, FiniteFloat

INT32_MAX = 2**31 - 1
"""The largest count, token id or position a request may carry: more than any model's
vocabulary, window or answer, and within what every hop encodes."""

SEED_LIMIT = 1 << 64
"""A seed is an unsigned 64-bit integer, as the engines take it."""

Finite = FiniteFloat
"""A float that is a number: not infinity (nor a literal such as `1e400` that parses to
it) and not NaN."""

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
"""A token id of the model's vocabulary (the gateway checks it against the model's)."""

Seed = Annotated[int, Field(ge=0, lt=SEED_LIMIT, description="0 <= seed < 2**64")]

SCHEMA_MAX_DEPTH = 64
"""The most levels of objects and arrays a JSON schema in a request nests (the schema
itself is the first)."""

SCHEMA_MAX_VALUES = 10_000
"""The most JSON values (objects, arrays, strings, numbers, booleans, nulls; object keys
not counted) a JSON schema in a request holds, itself included."""


def json_shape_error(
    value: object, *, max_depth: int = SCHEMA_MAX_DEPTH, max_values: int = SCHEMA_MAX_VALUES
) -> str | None:
    """Why `value` (parsed JSON) nests deeper than `max_depth` levels of objects and
    arrays or holds more than `max_values` values; None when it is within both. It walks
    the value without recursion, so any depth the JSON parser took is safe to check."""
    pending: list[tuple[object, int]] = [(value, 1)]
    seen = 0
    while pending:
        node, depth = pending.pop()
        seen += 1
        if seen > max_values:
            return f"it holds more than {max_values} values"
        if not isinstance(node, dict | list):
            continue
        if depth > max_depth:
            return f"it nests more than {max_depth} levels of objects and arrays"
        children = node.values() if isinstance(node, dict) else node
        pending.extend((child, depth + 1) for child in children)
    return None

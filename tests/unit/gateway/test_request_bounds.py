"""A client's mistake in a number or a JSON value is a 4xx naming the field, never a 500:
integers the bus or the engine cannot take, floats that are not finite, JSON schemas too
deep or too large to check or compile, bodies nested deeper than the JSON parser goes.
In process, through the gateway's ASGI app (scripted pipeline); an error the app raises
fails the test, as the client would have got a 500. `tests/e2e/test_bad_input.py` sends
the same mistakes over one real keep-alive connection."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from chatpipe.wiring import gateway_config
from gateway.context.builder import ContextBuilder
from gateway.context.tokens import TokenCounter
from gateway.deps import GatewayDeps
from gateway.openai.chat_completions.tool_requests import schema_error
from schemas.api import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, PostMessage
from schemas.bounds import INT32_MAX, SCHEMA_MAX_DEPTH, SCHEMA_MAX_VALUES, json_shape_error
from schemas.codec import encode
from schemas.responses import ResponseRequest
from tests.support.context import WordTokenizer
from tests.support.gateway import ALICE, assert_error, delta, done, gateway_deps, new_conversation

BIG = 10**30
"""An integer orjson cannot encode (over 64 bits)."""

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}]},
    TEXT: {"model": "tiny-random", "prompt": "hi"},
    "/v1/embeddings": {"model": "tiny-random", "input": "hi"},
    "/v1/responses": {"model": "tiny-random", "input": "hi"},
}


class VocabularyTokenizer(WordTokenizer):
    """A word a token, in a vocabulary of 1,000 (what `logit_bias` is checked against)."""

    def __len__(self) -> int:
        return 1000


@pytest.fixture
def deps(settings, store, pipeline) -> GatewayDeps:
    context = ContextBuilder(
        system_prompt=settings.context.system_prompt,
        policy=ContextBuilder.from_config(gateway_config(settings).context).policy,
        counter=lambda model: TokenCounter(VocabularyTokenizer()),
    )
    return gateway_deps(settings, store, pipeline, context, reply_wait_s=0.3)


def _json(value: Any) -> str:
    """JSON text; floats as Python writes them, so `inf` can become `1e400`."""
    if isinstance(value, dict):
        return "{" + ",".join(f'"{key}":{_json(item)}' for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json(item) for item in value) + "]"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, str):
        return '"' + value + '"'
    return str(value)


async def post_raw(client, path: str, text: str):
    return await client.post(
        path, content=text.encode(), headers={**ALICE, "Content-Type": "application/json"}
    )


async def post(client, path: str, fields: dict[str, Any], *, floats: dict[str, str] | None = None):
    """`fields` over the route's smallest body; `floats`: field -> JSON number text
    (`1e400`, `NaN`), written as is."""
    text = _json({**BODIES[path], **fields})
    extra = ",".join(f'"{name}":{number}' for name, number in (floats or {}).items())
    return await post_raw(client, path, text[:-1] + ("," + extra if extra else "") + "}")


# --- integers: at most what the bus and the engine take ------------------------------


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        (CHAT, {"top_k": BIG}, "top_k"),
        (CHAT, {"top_k": INT32_MAX + 1}, "top_k"),
        (CHAT, {"logit_bias": {str(BIG): 1}}, "logit_bias"),
        (CHAT, {"logit_bias": {str(INT32_MAX + 1): 1}}, "logit_bias"),
        (CHAT, {"seed": 2**64}, "seed"),
        (CHAT, {"n": BIG}, "n"),
        (CHAT, {"max_tokens": BIG}, "max_tokens"),
        (CHAT, {"max_completion_tokens": BIG}, "max_completion_tokens"),
        (CHAT, {"logprobs": True, "top_logprobs": BIG}, "top_logprobs"),
        (TEXT, {"top_k": BIG}, "top_k"),
        (TEXT, {"logit_bias": {str(BIG): 1}}, "logit_bias"),
        (TEXT, {"seed": BIG}, "seed"),
        (TEXT, {"max_tokens": BIG}, "max_tokens"),
        (TEXT, {"n": BIG}, "n"),
        (TEXT, {"best_of": BIG}, "best_of"),
        (TEXT, {"logprobs": BIG}, "logprobs"),
        (TEXT, {"prompt": [BIG]}, "prompt"),
        (TEXT, {"prompt": [[1, BIG]]}, "prompt"),
        ("/v1/embeddings", {"dimensions": BIG}, "dimensions"),
        ("/v1/embeddings", {"input": [[BIG]]}, "input"),
        ("/v1/responses", {"max_output_tokens": BIG}, "max_output_tokens"),
    ],
)
async def test_an_integer_the_bus_or_engine_cannot_take_is_422_naming_it(
    client, pipeline, path, fields, param
):
    code = "max_tokens_too_large" if param in OUTPUT_LIMITS else "invalid_request"
    error = assert_error(await post(client, path, fields), 422, code)
    assert error["param"].split(".")[0] == param, error
    assert pipeline.submitted == []


OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""Bounded by CHATPIPE_MAX_TOKENS_LIMIT, refused `max_tokens_too_large`."""


async def test_a_native_turn_refuses_such_integers_naming_them(client, store, pipeline):
    cid = await new_conversation(client)
    url = f"/v1/conversations/{cid}/messages"
    for fields, code, param in [
        ({"seed": BIG}, "invalid_request", "seed"),
        ({"max_tokens": BIG}, "max_tokens_too_large", "max_tokens"),
    ]:
        response = await client.post(url, json={"content": "hi", **fields}, headers=ALICE)
        assert assert_error(response, 422, code)["param"] == param
    assert await store.list_messages(cid) == [] and pipeline.submitted == []


async def test_the_largest_integers_declared_run_and_the_bus_carries_them(client, pipeline):
    pipeline.script(delta("a", 0), done(1))
    response = await post(client, CHAT, {"top_k": INT32_MAX, "seed": 2**64 - 1})
    assert response.status_code == 200, response.text
    sampling = pipeline.submitted[0].sampling
    assert (sampling.top_k, sampling.seed) == (INT32_MAX, 2**64 - 1)
    assert encode(pipeline.submitted[0])


async def test_the_largest_token_id_declared_is_checked_against_the_vocabulary(client, pipeline):
    """Not a 500 from the encoder: the id is one the bus carries, and the model has no
    such token (400, as for any id past its vocabulary)."""
    for path in (CHAT, TEXT):
        response = await post(client, path, {"logit_bias": {str(INT32_MAX): 1}})
        assert assert_error(response, 400, "invalid_logit_bias")["param"] == "logit_bias"
    assert pipeline.submitted == []


# --- floats: finite ------------------------------------------------------------------

SAMPLING_FLOATS = [
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
]


@pytest.mark.parametrize("number", ["1e400", "-1e400", "Infinity", "-Infinity", "NaN"])
@pytest.mark.parametrize(
    ("path", "name"),
    [(CHAT, name) for name in SAMPLING_FLOATS]
    + [(TEXT, name) for name in SAMPLING_FLOATS]
    + [("/v1/responses", "temperature"), ("/v1/responses", "top_p")],
)
async def test_a_float_that_is_not_finite_is_422_naming_it(client, pipeline, path, name, number):
    response = await post(client, path, {}, floats={name: number})
    error = assert_error(response, 422, "invalid_request")
    assert error["param"] == name and "finite" in error["message"], error
    assert pipeline.submitted == []


@pytest.mark.parametrize("path", [CHAT, TEXT])
@pytest.mark.parametrize("number", ["1e400", "NaN"])
async def test_a_bias_that_is_not_finite_is_422_naming_it(client, pipeline, path, number):
    text = _json(BODIES[path])[:-1] + f',"logit_bias":{{"7":{number}}}}}'
    error = assert_error(await post_raw(client, path, text), 422, "invalid_request")
    assert error["param"] == "logit_bias.7", error


@pytest.mark.parametrize("name", ["temperature", "top_p"])
async def test_a_native_turn_refuses_a_float_that_is_not_finite(client, pipeline, name):
    cid = await new_conversation(client)
    response = await post_raw(
        client, f"/v1/conversations/{cid}/messages", f'{{"content":"hi","{name}":1e400}}'
    )
    assert assert_error(response, 422, "invalid_request")["param"] == name


# --- every number a request model declares is bounded --------------------------------

MINIMAL: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (ChatCompletionRequest, BODIES[CHAT]),
    (CompletionRequest, BODIES[TEXT]),
    (EmbeddingRequest, BODIES["/v1/embeddings"]),
    (ResponseRequest, BODIES["/v1/responses"]),
    (PostMessage, {"content": "hi"}),
]


def _number_fields(model: type[BaseModel]) -> dict[str, set[str]]:
    """Each top-level field of `model` whose JSON schema takes an integer or a number,
    with the kinds it takes."""
    found: dict[str, set[str]] = {}
    for name, schema in model.model_json_schema()["properties"].items():
        kinds = {branch.get("type") for branch in [schema, *schema.get("anyOf", [])]}
        if kinds & {"integer", "number"}:
            found[name] = kinds & {"integer", "number"}
    return found


@pytest.mark.parametrize(("model", "body"), MINIMAL, ids=lambda v: getattr(v, "__name__", ""))
def test_every_number_field_of_a_request_model_refuses_what_the_bus_cannot_carry(model, body):
    """A field added without a bound fails here: a float must be finite, an integer at
    most 64 bits (the seed, unsigned) and, but for the seed, 32."""
    fields = _number_fields(model)
    for name in OUTPUT_LIMITS:
        fields.pop(name, None)
    assert fields, model
    for name, kinds in fields.items():
        bad = [float("inf"), float("nan")] if "number" in kinds else []
        bad += [2**64] if name == "seed" else [INT32_MAX + 1] if "integer" in kinds else []
        for value in bad:
            with pytest.raises(ValidationError) as refusal:
                model.model_validate({**body, name: value})
            assert refusal.value.errors()[0]["loc"][0] == name, (name, value)


def test_the_api_document_bounds_every_integer_a_request_carries(app):
    """Every integer of every request body and query parameter has a maximum the bus
    carries, so a client reading the document knows it too."""
    document = app.openapi()
    schemas = document["components"]["schemas"]
    unbounded: list[str] = []

    def walk(node: Any, where: str, seen: frozenset[str]) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, where, seen)
        if not isinstance(node, dict):
            return
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            if name not in seen:
                walk(schemas[name], f"{where}>{name}", seen | {name})
        if node.get("type") == "integer":
            most = node.get("maximum", node.get("exclusiveMaximum"))
            if most is None or most > 2**64 or node.get("minimum", -1) < -(2**63):
                unbounded.append(where)
        for key, value in node.items():
            if key != "if":  # a condition on a value, not what the value may be
                walk(value, f"{where}.{key}", seen)

    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                walk(
                    parameter.get("schema", {}), f"{method} {path}?{parameter['name']}", frozenset()
                )
            for content in operation.get("requestBody", {}).get("content", {}).values():
                walk(content["schema"], f"{method} {path}", frozenset())
    assert unbounded == []


# --- JSON schemas: bounded in depth and size ------------------------------------------


def schema_of_depth(depth: int) -> dict[str, Any]:
    """An object schema `depth` levels of objects and arrays deep."""
    schema: dict[str, Any] = {"type": "object"}
    if depth % 2 == 0:
        schema["required"] = []  # one level more: an array
    for _ in range((depth - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def schema_of_values(values: int) -> dict[str, Any]:
    """An object schema of `values` JSON values (at least 3): its properties take anything."""
    return {"type": "object", "properties": {f"p{i}": {} for i in range(values - 3)}}


def test_the_shape_bounds_count_levels_and_values_as_the_docs_say():
    assert json_shape_error(schema_of_depth(SCHEMA_MAX_DEPTH)) is None
    assert "levels" in (json_shape_error(schema_of_depth(SCHEMA_MAX_DEPTH + 1)) or "")
    assert json_shape_error({"a": [[{}]]}, max_depth=4) is None
    assert json_shape_error({"a": [[{}]]}, max_depth=3) is not None
    assert json_shape_error(schema_of_values(SCHEMA_MAX_VALUES)) is None
    assert "values" in (json_shape_error(schema_of_values(SCHEMA_MAX_VALUES + 1)) or "")
    assert json_shape_error([1, "a", None, {"k": True}], max_values=6) is None
    assert json_shape_error([1, "a", None, {"k": True}], max_values=5) is not None
    deep: list[Any] = []
    for _ in range(100_000):  # far past any recursion limit
        deep = [deep]
    assert json_shape_error(deep) is not None


def _tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize(
    "parameters", [schema_of_depth(SCHEMA_MAX_DEPTH + 1), schema_of_depth(241)], ids=["65", "241"]
)
async def test_a_tool_schema_too_deep_is_400_naming_it(client, pipeline, parameters):
    """241 levels (120 nested objects) was a RecursionError in jsonschema: a 500."""
    fields = {"tools": [_tool({"type": "object"}), _tool(parameters)]}
    error = assert_error(await post(client, CHAT, fields), 400, "invalid_tools")
    assert error["param"] == "tools.1.function.parameters"
    assert f"more than {SCHEMA_MAX_DEPTH} levels" in error["message"]
    assert pipeline.submitted == []


async def test_a_tool_schema_too_large_is_400_naming_it(client, pipeline):
    fields = {"tools": [_tool(schema_of_values(SCHEMA_MAX_VALUES + 1))]}
    error = assert_error(await post(client, CHAT, fields), 400, "invalid_tools")
    assert error["param"] == "tools.0.function.parameters"
    assert f"more than {SCHEMA_MAX_VALUES} values" in error["message"]


async def test_a_tool_schema_as_deep_as_allowed_is_served(client, pipeline):
    pipeline.script(delta("a", 0), done(1))
    response = await post(client, CHAT, {"tools": [_tool(schema_of_depth(SCHEMA_MAX_DEPTH))]})
    assert response.status_code == 200, response.text
    assert encode(pipeline.submitted[0])  # the bus carries it (orjson stops at 254 levels)


@pytest.mark.parametrize("depth", [SCHEMA_MAX_DEPTH + 1, 241])
async def test_a_response_format_schema_too_deep_is_400_naming_it(client, pipeline, depth):
    schema = {"name": "x", "schema": schema_of_depth(depth)}
    fields = {"response_format": {"type": "json_schema", "json_schema": schema}}
    error = assert_error(await post(client, CHAT, fields), 400, "invalid_response_format")
    assert error["param"] == "response_format.json_schema.schema"
    assert pipeline.submitted == []


async def test_a_responses_text_format_is_400_naming_it_however_deep(client, pipeline):
    text = {"format": {"type": "json_schema", "name": "x", "schema": schema_of_depth(241)}}
    response = await post(client, "/v1/responses", {"text": text})
    error = assert_error(response, 400, "invalid_response_format")
    assert error["param"] == "text.format.schema"
    assert pipeline.submitted == []


def test_a_schema_the_validator_cannot_walk_is_refused_not_raised():
    """Should a schema within the bounds still exhaust the stack (a deep caller), the
    check refuses it rather than raising."""
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(SCHEMA_MAX_DEPTH - 1):
        schema = {"not": schema}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(_frames()) + 120)
    try:
        error = schema_error(schema)
    finally:
        sys.setrecursionlimit(limit)
    assert error == "it nests too deeply to be checked"
    assert schema_error(schema) is None


def _frames() -> list[Any]:
    frame, frames = sys._getframe(), []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back  # type: ignore[assignment]
    return frames


# --- bodies the JSON parser does not take -------------------------------------------


NESTED = "[" * 10_000 + "]" * 10_000
LONG_NUMBER = "9" * 5000


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (f'{{"model":"tiny-random","messages":[{{"role":"user","content":{NESTED}}}]}}', "deeper"),
        (_json(BODIES[CHAT])[:-1] + f',"top_k":{LONG_NUMBER}}}', "number"),
    ],
    ids=["10000-nested-arrays", "5000-digit-integer"],
)
async def test_a_body_the_parser_gives_up_on_is_400_invalid_json(client, pipeline, body, says):
    error = assert_error(await post_raw(client, CHAT, body), 400, "invalid_json")
    assert says in error["message"]
    assert pipeline.submitted == []


async def test_a_body_that_is_not_utf8_is_400_invalid_json(client):
    response = await client.post(
        CHAT,
        content=b'{"model":"tiny-random","messages":[{"role":"user","content":"\xff\xfe"}]}',
        headers={**ALICE, "Content-Type": "application/json"},
    )
    assert "UTF-8" in assert_error(response, 400, "invalid_json")["message"]


async def test_a_native_turn_nested_10000_deep_is_400_invalid_json(client, store):
    cid = await new_conversation(client)
    body = f'{{"content":{NESTED}}}'
    response = await post_raw(client, f"/v1/conversations/{cid}/messages", body)
    assert_error(response, 400, "invalid_json")
    assert await store.list_messages(cid) == []

"""The OpenAPI document as the gateway enforces it (served at /openapi.json when on).

FastAPI writes what the routes and models declare; this adds what it cannot know:
* the answers every route of a kind can give, whatever its own declaration: a route
  with a body can answer 400 (malformed JSON), 408 and 413 (the body's limits), 422;
  a route with an id in its path can answer 404; every error is a JSON `ErrorBody`
  (not FastAPI's own validation shape, nor a stream route's media type);
* the limits set by this deployment's settings (chat and text completions): message
  count and length, stop sequences, max_tokens, the models served and the model
  aliases (those of the document's first build: `chatpipe rollout set` may add one
  later), the tools one request offers, the choices (`n`);
* what `gateway.openai.chat_completions.protocol` refuses: unknown fields, OpenAI's
  fields chatpipe cannot honour (null only), fields taking a few values only;
* the rules of tool calling that span fields
  (`gateway.openai.chat_completions.tool_requests`): a tool message names its call, only
  an assistant's carries calls, a tool choice other than none or auto needs tools;
* what a stream carries: in OpenAPI 3.1 the `schema` of `text/event-stream` is one
  event (FastAPI writes a string there);
* the media types an upload's file may be sent as (text, Markdown, PDF; its name may say
  which instead): any other is a 400;
* the links from an answer to the operations that take the ids it holds (a created
  conversation, file or response; a deleted resource's path; a turn's conversation):
  what a client, or a stateful fuzzer, calls next with them. A link is written only
  where its target is in the document.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from gateway.config import RequestLimits
from gateway.errors import error_responses
from gateway.openai.chat_completions.protocol import ACCEPTED, REFUSED
from retrieval.extract import SUPPORTED
from schemas.bounds import SEED_LIMIT

Schema = dict[str, Any]

_ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
_BODY_ERRORS = (400, 408, 413, 422)
_SSE_EVENT: Schema = {
    "type": "object",
    "description": "one server-sent event; `data` is JSON, or `[DONE]` on the last",
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
    "required": ["data"],
}


class _Link(NamedTuple):
    """From `source`'s success answer to `target` (each `METHOD /path`), with the values
    of the target's parameters (and fields of its body) as OpenAPI runtime expressions."""

    source: str
    target: str
    parameters: dict[str, str]
    body: Schema | None = None


_CONVERSATION = "/v1/conversations/{conversation_id}"
_MESSAGE = _CONVERSATION + "/messages/{message_id}"
_FILE = "/v1/files/{file_id}"
_RESPONSE = "/v1/responses/{response_id}"
_CREATED_CONVERSATION = {"conversation_id": "$response.body#/conversation_id"}
_SAME_CONVERSATION = {"conversation_id": "$request.path.conversation_id"}
_LINKS = (
    *(_Link("POST /v1/conversations", target, _CREATED_CONVERSATION)
      for target in (f"GET {_CONVERSATION}", f"PATCH {_CONVERSATION}",
                     f"DELETE {_CONVERSATION}", f"GET {_CONVERSATION}/usage",
                     f"POST {_CONVERSATION}/messages")),
    # A posted message's answer is a stream: its conversation, read next, holds the ids.
    *(_Link(source, f"GET {_CONVERSATION}", _SAME_CONVERSATION)
      for source in (f"POST {_CONVERSATION}/messages", f"POST {_MESSAGE}/edit",
                     f"POST {_MESSAGE}/regenerate", f"PATCH {_CONVERSATION}",
                     f"DELETE {_CONVERSATION}")),
    *(_Link("POST /v1/files", target, {"file_id": "$response.body#/id"})
      for target in (f"GET {_FILE}", f"DELETE {_FILE}")),
    _Link(f"DELETE {_FILE}", f"GET {_FILE}", {"file_id": "$request.path.file_id"}),
    *(_Link("POST /v1/responses", target, {"response_id": "$response.body#/id"})
      for target in (f"GET {_RESPONSE}", f"DELETE {_RESPONSE}", f"POST {_RESPONSE}/cancel",
                     f"GET {_RESPONSE}/input_items")),
    _Link("POST /v1/responses", "POST /v1/responses", {},
          {"previous_response_id": "$response.body#/id"}),
    _Link("POST /v1/responses", f"GET {_CONVERSATION}",
          {"conversation_id": "$response.body#/conversation/id"}),
    *(_Link(f"DELETE {_RESPONSE}", target, {"response_id": "$request.path.response_id"})
      for target in (f"GET {_RESPONSE}", f"GET {_RESPONSE}/input_items")),
    # The list holds every model the caller may name: never none.
    _Link("GET /v1/models", "GET /v1/models/{model}", {"model": "$response.body#/data/0/id"}),
)  # fmt: skip


def api_document(app: FastAPI, limits: RequestLimits, aliases: Sequence[str] = ()) -> Schema:
    document = get_openapi(title=app.title, version=app.version, summary=app.summary,
                           routes=app.routes)  # fmt: skip
    for path, operations in document.get("paths", {}).items():
        for operation in operations.values():
            _declare_shared_errors(path, operation)
    _declare_links(document.get("paths", {}))
    _declare_upload_types(document.get("paths", {}))
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    _declare_limits(schemas, limits, aliases)
    return document


def _declare_shared_errors(path: str, operation: Schema) -> None:
    responses = operation.setdefault("responses", {})
    statuses = [*(_BODY_ERRORS if "requestBody" in operation else ()),
                *((404,) if "{" in path else ())]  # fmt: skip
    for status, response in error_responses(*statuses).items():
        responses.setdefault(str(status), {"description": response["description"]})
    for status, response in responses.items():
        if int(status) >= 400:  # JSON, also from a route whose answer is a stream
            response["content"] = _ERROR_BODY
        stream = response.get("content", {}).get("text/event-stream")
        if stream is not None:
            stream["schema"] = _SSE_EVENT


def _declare_links(paths: Schema) -> None:
    """Each of `_LINKS` whose two operations are in `paths`, on the source's success
    answer, named after the target (`GetConversation`) and pointing at its operationId."""

    def operation(name: str) -> Schema | None:
        method, path = name.split(" ", 1)
        return paths.get(path, {}).get(method.lower())

    for link in _LINKS:
        source, target = operation(link.source), operation(link.target)
        if source is None or target is None:
            continue
        success = min(status for status in source["responses"] if status.startswith("2"))
        definition: Schema = {"operationId": target["operationId"]}
        if link.parameters:
            definition["parameters"] = dict(link.parameters)
        if link.body is not None:
            definition["requestBody"] = dict(link.body)
        links = source["responses"][success].setdefault("links", {})
        links[target["summary"].replace(" ", "")] = definition


def _declare_upload_types(paths: Schema) -> None:
    """`POST /v1/files`: the file part's media types (`retrieval.extract`), which name
    the type of a file whose name does not."""
    form = paths.get("/v1/files", {}).get("post", {}).get("requestBody", {})
    multipart = form.get("content", {}).get("multipart/form-data")
    if multipart is not None:
        multipart["encoding"] = {"file": {"contentType": ", ".join(SUPPORTED)}}


def _declare_limits(
    schemas: dict[str, Schema], limits: RequestLimits, aliases: Sequence[str]
) -> None:
    for name in ("PostMessage", "TurnOptions", "ChatCompletionRequest"):
        if name in schemas:
            # As integers: written as floats, 2**64 - 1 would round up to 2**64.
            _seed_range(schemas[name])
    chars = {"maxLength": limits.max_message_chars}
    models = {"enum": [*limits.models, *aliases]}
    max_tokens = {"maximum": limits.max_tokens_limit}
    for name in ("PostMessage", "TurnOptions"):
        if name in schemas:
            _constrain(schemas[name], "model", models)
            _constrain(schemas[name], "max_tokens", max_tokens)
    if "PostMessage" in schemas:
        # Blank messages are refused (400 empty_message): at least one non-space character.
        _constrain(schemas["PostMessage"], "content", {**chars, "pattern": r"\S"})
    if "TextPart" in schemas:
        _constrain(schemas["TextPart"], "text", chars)
    if "InputMessage" in schemas:
        _constrain(schemas["InputMessage"], "content", chars)
    completion = schemas.get("ChatCompletionRequest")
    if completion is not None:
        _constrain(completion, "model", models)
        _constrain(completion, "max_tokens", max_tokens)
        _constrain(completion, "max_completion_tokens", max_tokens)
        _constrain(completion, "messages", {"maxItems": limits.max_messages}, "array")
        stop_chars = {"minLength": 1, "maxLength": limits.max_stop_chars}
        _constrain(completion, "stop", stop_chars)
        _constrain(
            completion,
            "stop",
            {"maxItems": limits.max_stop_sequences, "items": {"type": "string", **stop_chars}},
            "array",
        )
        _constrain(completion, "tools", {"maxItems": limits.max_tools}, "array")
        _declare_parameters(completion, limits)
    _declare_text_completion_limits(schemas, limits, models)
    _declare_tool_rules(schemas)
    _declare_response_limits(schemas, limits, models)


def _declare_response_limits(schemas: dict[str, Schema], limits: RequestLimits,
                             models: Schema) -> None:  # fmt: skip
    """`POST /v1/responses`: the limits of a completion, and no field but those declared
    (any other is a 400 naming it)."""
    chars = {"maxLength": limits.max_message_chars}
    response = schemas.get("ResponseRequest")
    if response is not None:
        response["additionalProperties"] = False
        _constrain(response, "model", models)
        _constrain(response, "max_output_tokens", {"maximum": limits.max_tokens_limit})
        _constrain(response, "input", {**chars, "pattern": r"\S"})
        _constrain(response, "input", {"maxItems": limits.max_messages}, "array")
        _constrain(response, "instructions", chars)
    if "InputTextPart" in schemas:
        _constrain(schemas["InputTextPart"], "text", chars)
    if "InputItem" in schemas:
        _constrain(schemas["InputItem"], "content", chars)


def _declare_parameters(completion: Schema, limits: RequestLimits) -> None:
    """What `gateway.openai.chat_completions.protocol` refuses: any field not declared, a
    field chatpipe cannot honour unless null, one of a few values only, top_logprobs
    without logprobs."""
    completion["additionalProperties"] = False
    properties = completion.get("properties", {})
    for name in REFUSED:
        properties[name] = {"type": "null", "description": properties[name].get("description")}
    for name, (values, _) in ACCEPTED.items():
        properties[name] = {
            "anyOf": [{"enum": values}, {"type": "null"}],
            "description": properties[name].get("description"),
        }
    _constrain(completion, "n", {"maximum": limits.max_choices})
    _declare_logit_bias(completion)
    completion.setdefault("allOf", []).append(
        {
            "if": {
                "required": ["top_logprobs"],
                "properties": {"top_logprobs": {"type": "integer"}},
            },
            "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
        }
    )


def _declare_logit_bias(completion: Schema) -> None:
    # Token ids, as strings: the document cannot know each model's vocabulary, so it allows
    # the ids every model served has (any tokenizer has more than 10,000); the gateway takes
    # every id of the model's and refuses others (400 invalid_logit_bias).
    _constrain(
        completion, "logit_bias", {"propertyNames": {"pattern": "^(0|[1-9][0-9]{0,3})$"}}, "object"
    )


def _declare_text_completion_limits(
    schemas: dict[str, Schema], limits: RequestLimits, models: Schema
) -> None:
    if "EmbeddingRequest" in schemas:
        schemas["EmbeddingRequest"]["additionalProperties"] = False
    completion = schemas.get("CompletionRequest")
    if completion is None:
        return
    completion["additionalProperties"] = False
    _seed_range(completion)
    _declare_logit_bias(completion)
    _constrain(completion, "model", models)
    _constrain(completion, "max_tokens", {"maximum": limits.max_tokens_limit})
    _constrain(completion, "prompt", {"minLength": 1, "maxLength": limits.max_message_chars})
    stop_chars = {"minLength": 1, "maxLength": limits.max_stop_chars}
    _constrain(completion, "stop", stop_chars)
    _constrain(
        completion,
        "stop",
        {"maxItems": limits.max_stop_sequences, "items": {"type": "string", **stop_chars}},
        "array",
    )


def _declare_tool_rules(schemas: dict[str, Schema]) -> None:
    message, completion = schemas.get("InputMessage"), schemas.get("ChatCompletionRequest")
    if message is not None:
        message["allOf"] = [
            {
                "if": {"properties": {"role": {"const": "tool"}}},
                "then": {
                    "required": ["tool_call_id"],
                    "properties": {"tool_call_id": {"type": "string", "minLength": 1}},
                },
            },
            {
                "if": {"properties": {"role": {"not": {"const": "assistant"}}}},
                "then": {"properties": {"tool_calls": {"type": "null"}}},
            },
        ]
    if completion is not None:
        completion.setdefault("allOf", []).extend(
            [
                {
                    "if": {
                        "required": ["tool_choice"],
                        "properties": {
                            "tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}
                        },
                    },
                    "then": {
                        "required": ["tools"],
                        "properties": {"tools": {"type": "array", "minItems": 1}},
                    },
                },
            ]
        )


def _seed_range(model: Schema) -> None:
    for branch in model.get("properties", {}).get("seed", {}).get("anyOf", []):
        if branch.get("type") == "integer":
            branch.pop("exclusiveMaximum", None)
            branch.update(minimum=0, maximum=SEED_LIMIT - 1)


def _constrain(model: Schema, field: str, constraints: Schema, kind: str | None = None) -> None:
    """Add `constraints` to the `kind` branch of `field` (the string one by default, or
    the field itself when it has no branches of that type)."""
    prop = model.get("properties", {}).get(field)
    if prop is None:
        return
    kind = kind or ("integer" if "maximum" in constraints else "string")
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == kind:
            branch.update(constraints)

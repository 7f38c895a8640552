"""The API that fuzzing cannot break: schemathesis, run as its CLI against a live gateway
(sim engine, real broker, real HTTP), generates requests from the gateway's own OpenAPI
document, valid and invalid, and checks every answer against it; then, statefully, it
chains calls along the document's links (create a conversation, read, rename and delete
it, read it again) with the ids the answers hold.

Bounded (a fixed seed, a few examples per operation) so it fits `make test`; the same
command with a larger `--max-examples` is the long run:

    schemathesis --config-file schemathesis.toml run http://127.0.0.1:8000/openapi.json \
        -H 'Authorization: Bearer KEY'

Found nothing means: no server error on any operation, no status code the document does not list, no
request valid by the document refused, no answer outside its documented schema, no link
whose value the answer does not hold, no resource missing just after it was created, and
none still there after it was deleted.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from chatpipe.dev_stack import API_KEY, running_sim_stack, stack_settings
from chatpipe.wiring import Stack

pytestmark = pytest.mark.timeout(600)

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "positive_data_acceptance",
    "content_type_conformance",
    "response_schema_conformance",
    # Stateful only: a linked read of what was just created is not a 404, one of what was
    # just deleted is.
    "use_after_free",
    "ensure_resource_availability",
)
MAX_EXAMPLES = 12
STATEFUL_EXAMPLES = 150
SEED = 20261130
# Links the stateful phase follows in every run (their sources always succeed).
FOLLOWED = {
    "POST /v1/conversations -> [201] GetConversation -> GET /v1/conversations/{conversation_id}",
    "POST /v1/conversations -> [201] DeleteConversation"
    " -> DELETE /v1/conversations/{conversation_id}",
    "DELETE /v1/conversations/{conversation_id} -> [204] GetConversation"
    " -> GET /v1/conversations/{conversation_id}",
}
CONFIG = (
    "[checks]\nenabled = false\n"
    + "".join(f"{check}.enabled = true\n" for check in CHECKS)
    # The links of the document only: what it says, not what schemathesis guesses.
    + "[phases.stateful]\ninference.algorithms = []\n"
    + f"generation.max-examples = {STATEFUL_EXAMPLES}\n"
    + """
# No status below lists a 5xx: a server error fails both `not_a_server_error`, which runs
# on every operation, and the acceptance of the request that caused it.

# An upload's content is checked beyond its schema (type, text, size, chunks): a
# schema-valid file may be refused with a documented 400 or 413.
[[operations]]
include-path = "/v1/files"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "400", "401", "403", "404", "409", "413", "429"]

# A response's input must end with a non-blank user message, each message's parts
# together within the message limit, and a previous_response_id name one of the
# caller's answers that has ended: rules a JSON schema cannot say (400, 413, 404, 409).
# Its 404 names the model or the previous response, not the operation's own resource.
[[operations]]
include-path = "/v1/responses"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "400", "401", "403", "404", "409", "413", "429"]
checks.ensure_resource_availability.enabled = false

# A turn's body names more than its path's conversation (a model, files, a server tool),
# each a 404 when not found: not the linked conversation missing.
[[operations]]
include-path-regex = "^/v1/conversations/[^/]+/messages"
include-method = "POST"
checks.ensure_resource_availability.enabled = false

# OpenAI's text completion request, declared whole: the fields chatpipe cannot honour
# (n > 1, logprobs, suffix, penalties, token arrays) are refused with a 400 naming them,
# and a prompt must fit the model's window in tokens (413).
[[operations]]
include-path = "/v1/completions"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "400", "401", "403", "404", "413", "429"]

# An embedding request's texts are checked beyond the schema: token arrays and empty
# texts are refused (400), the model is the embedding model's id (404), a text must fit
# the model's window and a request holds a bounded count of them (413), `dimensions`
# must be the model's own (400).
[[operations]]
include-path = "/v1/embeddings"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "400", "401", "404", "413", "429"]
"""
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fuzz_stack(tiny_model_dir, tmp_path_factory) -> AsyncIterator[Stack]:
    """A stack of its own: no rate limits (a fuzzer's burst is not what they are for), a
    fast sim engine, docs served, and request limits that fit the tiny model's 4,096-token
    window — every request the document allows fits (the defaults allow a 32,000-character
    message, which a 4,096-token model refuses with a documented 413 `context_too_long`: a
    window in tokens is not something a JSON schema can say)."""
    settings = stack_settings(
        tmp_path_factory.mktemp("fuzz-stack"),
        engine="sim",
        model=tiny_model_dir,
        sim_tokens_per_s=20_000.0,
        sim_prompt_tokens_per_s=1e6,
        max_slots=32,
        user_requests_per_minute=1_000_000,
        org_requests_per_minute=1_000_000,
        user_tokens_per_minute=1_000_000_000,
        org_tokens_per_minute=1_000_000_000,
        user_files_per_minute=1_000_000,
        org_files_per_minute=1_000_000,
        max_message_chars=200,
        max_tokens_limit=1024,
        max_messages=8,
        auto_titles=False,
        api_docs=True,
    )
    async with running_sim_stack(settings) as stack:
        yield stack


async def test_schemathesis_finds_nothing(fuzz_stack, tmp_path):
    report = tmp_path / "report"
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(config),
        "run",
        f"{fuzz_stack.base_url}/openapi.json",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--header",
        f"Authorization: Bearer {API_KEY}",
        # One worker thread: hypothesis names its strategies with ast.parse, which is not
        # thread-safe on CPython 3.11 ("AST constructor recursion depth mismatch").
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--no-shrink",
        "--suppress-health-check",
        "all",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report / "events.ndjson"),
        "--output-truncate",
        "true",
    ]
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"},
        cwd=tmp_path,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=540)
    text = output.decode(errors="replace")
    found = _failures(report / "events.ndjson")
    assert process.returncode == 0 and not found, (
        f"schemathesis found {sum(found.values())} failure(s): {dict(found)}\n"
        f"errors: {_errors(report / 'events.ndjson')}\n{text[-12000:]}"
    )
    assert "Failed to extract data from response" not in text, text[-12000:]
    requests = _requests_made(report / "events.ndjson")
    assert requests >= 200, f"only {requests} requests were generated:\n{text[-4000:]}"
    links = await _links(fuzz_stack.base_url)
    assert _transitions_total(report / "events.ndjson") == len(links)
    followed = _links_followed(report / "events.ndjson")
    assert followed >= FOLLOWED, f"followed only {sorted(followed)}"
    assert len(followed) >= 6, f"followed only {sorted(followed)}"


async def test_the_document_links_what_is_created_to_what_takes_its_id(fuzz_stack):
    """Each create operation's answer links to the operations that take its id, by the
    field that holds it, and every link names an operation in the document."""
    links = await _links(fuzz_stack.base_url)
    by_id = {"$response.body#/id"}
    for source, name, parameter, expressions in (
        ("POST /v1/conversations", "GetConversation", "conversation_id",
         {"$response.body#/conversation_id"}),
        ("POST /v1/conversations", "DeleteConversation", "conversation_id",
         {"$response.body#/conversation_id"}),
        ("POST /v1/conversations", "PostMessage", "conversation_id",
         {"$response.body#/conversation_id"}),
        ("POST /v1/files", "GetFile", "file_id", by_id),
        ("POST /v1/files", "DeleteFile", "file_id", by_id),
        ("POST /v1/responses", "RetrieveResponse", "response_id", by_id),
        ("POST /v1/responses", "DeleteResponse", "response_id", by_id),
        ("POST /v1/responses", "ListInputItems", "response_id", by_id),
        ("DELETE /v1/files/{file_id}", "GetFile", "file_id", {"$request.path.file_id"}),
    ):  # fmt: skip
        assert links[source, name]["parameters"][parameter] in expressions, (source, name)
    assert links["POST /v1/responses", "CreateResponse"]["requestBody"] == {
        "previous_response_id": "$response.body#/id"
    }


async def _links(base_url: str) -> dict[tuple[str, str], dict]:
    """The served document's links by (source operation, link name), each checked to
    name an operation of the document and the parameters that operation has."""
    async with httpx.AsyncClient(base_url=base_url) as client:
        response = await client.get("/openapi.json")
    response.raise_for_status()
    operations = {
        operation["operationId"]: operation
        for methods in response.json()["paths"].values()
        for operation in methods.values()
    }
    links = {}
    for path, methods in response.json()["paths"].items():
        for method, operation in methods.items():
            for status, answer in operation["responses"].items():
                for name, link in answer.get("links", {}).items():
                    assert status.startswith("2"), (method, path, status)
                    target = operations[link["operationId"]]
                    names = {parameter["name"] for parameter in target.get("parameters", [])}
                    assert set(link.get("parameters", {})) <= names, (method, path, name)
                    links[f"{method.upper()} {path}", name] = link
    return links


def _failures(events: Path) -> Counter[str]:
    """Failures by check name, from schemathesis's ndjson event log."""
    found: Counter[str] = Counter()
    for line in events.read_text().splitlines():
        for check in _checks_in(json.loads(line)):
            if check.get("status") == "FAILURE":
                found[check.get("name", "?")] += 1
    return found


def _errors(events: Path) -> list[str]:
    """What went wrong outside the checks (a connection reset, a timeout), as logged."""
    return [
        line[:2000]
        for line in events.read_text().splitlines()
        if line.startswith('{"NonFatalError"')
    ]


def _transitions_total(events: Path) -> int:
    """The links the stateful phase was given, as its start event counts them."""
    for line in events.read_text().splitlines():
        started = json.loads(line).get("PhaseStarted", {})
        if started.get("phase", {}).get("name") == "stateful":
            assert started["payload"]["inferred_transitions"] == 0
            return started["payload"]["transitions_total"]
    raise AssertionError("the stateful phase never started")


def _links_followed(events: Path) -> set[str]:
    """The links (`SOURCE -> [STATUS] NAME -> TARGET`) the stateful phase called along
    with the value its source's answer gave."""
    followed = set()
    for line in events.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished", {})
        if finished.get("phase") != "stateful":
            continue
        for case in finished["recorder"]["cases"].values():
            if case.get("transition") and case.get("is_transition_applied"):
                followed.add(case["transition"]["id"])
    return followed


def _requests_made(events: Path) -> int:
    return sum(
        1
        for line in events.read_text().splitlines()
        for check in _checks_in(json.loads(line))
        if check.get("name") == "not_a_server_error"
    )


def _checks_in(node: object) -> list[dict]:
    """Every check result anywhere in an event (the layout varies by event type)."""
    found: list[dict] = []
    if isinstance(node, dict):
        if "name" in node and "status" in node and isinstance(node.get("name"), str):
            found.append(node)
        for value in node.values():
            found.extend(_checks_in(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_checks_in(value))
    return found

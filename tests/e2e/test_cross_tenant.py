"""Tenants never meet: a caller of another org — even one whose user id is the same —
tries every `/v1` route that names a resource with the victim's ids, and reads nothing,
changes nothing.

The routes come from the gateway's own OpenAPI document, so a route added later is
tried too.
"""

from __future__ import annotations

import uuid

import httpx

from chatpipe.wiring import DEV_USER
from conversations.store import ApiKey
from schemas.topics import Tier
from tests.support.chat import post_message
from tests.support.stack import client_for

_BODIES = {
    "content": "what did they say?",
    "title": "renamed by someone else",
    "rating": "down",
}


async def _key_for(stack, user_id: str, org_id: str) -> str:
    key = f"cp-test-{uuid.uuid4().hex}"
    await stack.store.add_api_key(key, ApiKey(user_id=user_id, org_id=org_id, tier=Tier.FREE))
    return key


async def _victim_resources(client: httpx.AsyncClient) -> dict[str, str]:
    """A conversation with one answered turn, and a file; their ids by path parameter
    name."""
    created = await client.post("/v1/conversations", json={"title": "private"})
    assert created.status_code == 201, created.text
    conversation_id = created.json()["conversation_id"]
    turn = await post_message(client, conversation_id, {"content": "a secret: 7421"})
    assert turn.status == 200 and turn.ended_with_done
    request = turn.request
    uploaded = await client.post(
        "/v1/files",
        data={"purpose": "assistants"},
        files={"file": ("private.txt", b"a secret: 7421", "text/plain")},
    )
    assert uploaded.status_code == 200, uploaded.text
    return {
        "conversation_id": conversation_id,
        "message_id": request["user_message_id"],
        "request_id": request["request_id"],
        "file_id": uploaded.json()["id"],
        "response_id": "resp_" + request["message_id"],
    }


async def _snapshot(client: httpx.AsyncClient, conversation_id: str) -> dict:
    response = await client.get(f"/v1/conversations/{conversation_id}")
    assert response.status_code == 200, response.text
    files = await client.get("/v1/files")
    return {**response.json(), "files": files.json()}


def _operations(openapi: dict, ids: dict[str, str]) -> list[tuple[str, str, dict | None]]:
    """(method, path with the victim's ids, a body valid for it) of every /v1 operation
    whose path names a resource."""
    operations = []
    for path, methods in openapi["paths"].items():
        if not path.startswith("/v1/") or "{" not in path:
            continue
        if path.startswith("/v1/models/"):
            continue  # a served model is every caller's, no tenant's resource
        filled = path.format(**ids)
        for method, operation in methods.items():
            body = None
            if "requestBody" in operation:
                schema = operation["requestBody"]["content"]["application/json"]["schema"]
                schema = _resolved(openapi, schema)
                body = {
                    name: _BODIES[name] for name in schema.get("required", []) if name in _BODIES
                }
            operations.append((method.upper(), filled, body))
    return operations


def _resolved(openapi: dict, schema: dict) -> dict:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    node = openapi
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


async def test_another_org_reads_and_writes_nothing(sim_stack):
    async with client_for(sim_stack) as victim:
        ids = await _victim_resources(victim)
        before = await _snapshot(victim, ids["conversation_id"])
        assert before["files"]["data"]
        openapi = (await victim.get("/openapi.json")).json()
    same_user_other_org = await _key_for(sim_stack, DEV_USER, f"org-{uuid.uuid4().hex[:6]}")
    stranger = await _key_for(sim_stack, "mallory", f"org-{uuid.uuid4().hex[:6]}")
    operations = _operations(openapi, ids)
    assert len(operations) >= 8, operations
    for key in (same_user_other_org, stranger):
        async with client_for(sim_stack, api_key=key) as attacker:
            listed = await attacker.get("/v1/conversations")
            assert listed.status_code == 200
            assert ids["conversation_id"] not in listed.text
            assert ids["file_id"] not in (await attacker.get("/v1/files")).text
            for method, path, body in operations:
                response = await attacker.request(method, path, json=body)
                assert response.status_code in (403, 404), (
                    method,
                    path,
                    response.status_code,
                    response.text[:300],
                )
                assert "7421" not in response.text and "private" not in response.text
    async with client_for(sim_stack) as victim:
        after = await _snapshot(victim, ids["conversation_id"])
    assert after == before

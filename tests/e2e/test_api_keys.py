"""Tenant provisioning through running gateways: keys made and revoked with the real
`chatpipe keys` CLI (a separate process on the gateway's database) open and close at
once; expired keys are refused; ownership is (org, user); a gateway run alone has no
dev user unless CHATPIPE_DEV_API_KEY is set, and no key secret means no start."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from bench.process_pipeline import KEY_SECRET, prints_logs_on_failure, running_pipeline
from chatpipe.api_keys import secret_file
from chatpipe.wiring import DEV_USER, Stack
from conversations.sqlite_store import SQLiteStore
from conversations.store import ApiKey
from schemas.topics import Tier
from tests.support.chat import post_message, read_sse
from tests.support.stack import client_for

REPO = Path(__file__).resolve().parents[2]


async def keys_cli(database: Path, *args: str, key_secret: str | None = None) -> str:
    """`python -m chatpipe.cli keys …` on `database`; its stdout (it must succeed).
    Without `key_secret` the CLI finds the one `chatpipe up` keeps beside the file."""
    env = {k: v for k, v in os.environ.items() if k != "CHATPIPE_KEY_SECRET"}
    env.update(CHATPIPE_DATABASE_PATH=str(database), CHATPIPE_STORE="sqlite")
    if key_secret is not None:
        env["CHATPIPE_KEY_SECRET"] = key_secret
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "chatpipe.cli", "keys", *args, env=env, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, (out + err).decode()
    return out.decode()


async def create_key(database: Path, *args: str, key_secret: str | None = None) -> str:
    out = await keys_cli(database, "create", *args, key_secret=key_secret)
    return out.splitlines()[-1]


def key_id(key: str) -> str:
    return key.split("-")[1]


async def status(base_url: str, key: str) -> int:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        response = await client.get("/v1/conversations",
                                    headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        return response.status_code


# --- under chatpipe up (its secret kept beside the database) ----------------------------


async def test_a_revoked_key_is_refused_at_once(sim_stack: Stack) -> None:
    database = sim_stack.settings.storage.database_path
    assert secret_file(database).exists()  # the CLI uses it: no CHATPIPE_KEY_SECRET here
    user = f"user-{uuid.uuid4().hex[:6]}"
    key = await create_key(database, "--user", user, "--org", "acme", "--tier", "pro")
    kept = await create_key(database, "--user", user, "--org", "acme", "--tier", "pro")
    assert await status(sim_stack.base_url, key) == 200

    await keys_cli(database, "revoke", key_id(key))

    async with httpx.AsyncClient(base_url=sim_stack.base_url, timeout=30) as client:
        refused = await client.get("/v1/conversations",
                                   headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert "revoked" in refused.json()["error"]["message"]
    assert refused.headers["www-authenticate"] == "Bearer"
    assert await status(sim_stack.base_url, kept) == 200
    rows = {row["id"]: row for row in json.loads(await keys_cli(database, "list", "--json"))}
    assert rows[key_id(key)]["revoked"] is True and rows[key_id(kept)]["revoked"] is False


async def test_an_expired_key_is_refused(sim_stack: Stack) -> None:
    database = sim_stack.settings.storage.database_path
    expires_in_s = 3.0
    key = await create_key(database, "--user", "erin", "--org", "acme", "--tier", "free",
                           "--expires-in", str(expires_in_s / 86_400))  # fmt: skip
    made = time.time()
    assert await status(sim_stack.base_url, key) == 200

    await asyncio.sleep(max(0.0, made + expires_in_s + 0.5 - time.time()))

    async with client_for(sim_stack, key) as client:
        refused = await client.get("/v1/conversations")
    assert refused.status_code == 401 and "expired" in refused.json()["error"]["message"]
    past = f"cp-past-{uuid.uuid4().hex}"  # stored already past its expiry
    await sim_stack.store.add_api_key(past, ApiKey("erin", "acme", Tier.FREE,
                                                   expires_at=time.time() - 1))  # fmt: skip
    assert await status(sim_stack.base_url, past) == 401


async def test_a_key_created_with_its_own_concurrency_limit_is_held_to_it(
    sim_stack: Stack,
) -> None:
    database = sim_stack.settings.storage.database_path
    key = await create_key(database, "--user", "cara", "--org", f"org-{uuid.uuid4().hex[:6]}",
                           "--tier", "pro", "--max-concurrent-requests", "1")  # fmt: skip
    body = {"model": "tiny-random",
            "messages": [{"role": "user", "content": "[[sim:length=2000]]"}],
            "max_tokens": 2000, "stream": True}  # fmt: skip
    async with client_for(sim_stack, key) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as running:
            assert running.status_code == 200
            # Keep the reader: an abandoned one is closed when collected, which closes the
            # stream, and a client gone gives its place back at once.
            lines = running.aiter_lines()
            async for line in lines:
                if line.startswith("data:"):
                    break
            refused = await client.post("/v1/chat/completions", json=body)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "too_many_concurrent_requests"
        # The client went away: the stream is cancelled and the key has its place back.
        deadline = time.monotonic() + 10
        while (again := await client.post("/v1/chat/completions",
                                          json={**body, "max_tokens": 2, "stream": False})
               ).status_code == 429:  # fmt: skip
            assert time.monotonic() < deadline, again.text
            await asyncio.sleep(0.05)
        assert again.status_code == 200, again.text
    rows = {row["id"]: row for row in json.loads(await keys_cli(database, "list", "--json"))}
    assert rows[key_id(key)]["max_concurrent"] == 1


async def test_the_same_user_id_in_another_org_sees_nothing(sim_stack: Stack) -> None:
    """The stack's dev key is user `dev` of org `dev`; another org's `dev` is someone else:
    their conversation, stored request and live request are all 404 to it."""
    other = f"cp-other-{uuid.uuid4().hex}"
    await sim_stack.store.add_api_key(other, ApiKey(DEV_USER, f"org-{uuid.uuid4().hex[:6]}",
                                                    Tier.PRO))  # fmt: skip
    async with client_for(sim_stack) as owner, client_for(sim_stack, other) as stranger:
        created = await owner.post("/v1/conversations", json={"title": "dev's own"})
        cid = created.json()["conversation_id"]
        turn = await post_message(owner, cid, {"content": "[[sim:reply=mine only]]"})
        assert turn.ended_with_done, turn
        request_id = turn.request["request_id"]

        listed = await stranger.get("/v1/conversations")
        assert listed.status_code == 200 and cid not in listed.text
        for method, path, body in [
            ("GET", f"/v1/conversations/{cid}", None),
            ("PATCH", f"/v1/conversations/{cid}", {"title": "taken"}),
            ("GET", f"/v1/conversations/{cid}/usage", None),
            ("POST", f"/v1/conversations/{cid}/messages", {"content": "hi"}),
            ("GET", f"/v1/requests/{request_id}/events", None),
            ("POST", f"/v1/requests/{request_id}/cancel", None),
            ("DELETE", f"/v1/conversations/{cid}", None),
        ]:  # fmt: skip
            response = await stranger.request(method, path, json=body)
            assert response.status_code == 404, (method, path, response.text)
            assert "mine only" not in response.text
        mine = await owner.get(f"/v1/conversations/{cid}")
        assert mine.status_code == 200 and mine.json()["title"] == "dev's own"

        # A live request (OpenAI-compatible: known only to this gateway's live table).
        async with owner.stream("POST", "/v1/chat/completions", json={
            "model": sim_stack.settings.inference.model_name, "stream": True, "max_tokens": 2000,
            "messages": [{"role": "user", "content": "[[sim:length=2000]]"}],
        }) as response:  # fmt: skip
            assert response.status_code == 200
            live_id = response.headers["x-request-id"]
            refused = await stranger.post(f"/v1/requests/{live_id}/cancel")
            assert refused.status_code == 404, refused.text
            cancelled = await owner.post(f"/v1/requests/{live_id}/cancel")
            assert cancelled.status_code == 202, cancelled.text
            events = await read_sse(response)
    finishes = [json.loads(e.data)["choices"][0].get("finish_reason") for e in events
                if e.data != "[DONE]" and json.loads(e.data).get("choices")]  # fmt: skip
    assert [f for f in finishes if f] and len(finishes) < 2000


# --- gateways run alone (stage processes) -----------------------------------------------


@pytest.fixture
async def pipeline(tmp_path: Path):
    async with running_pipeline(tmp_path, auto_titles=False) as pipe:
        yield pipe


@prints_logs_on_failure
async def test_a_gateway_alone_has_no_dev_user_and_every_gateway_refuses_a_revoked_key(
    pipeline,
) -> None:
    """Two gateways run alone without CHATPIPE_DEV_API_KEY on one database: no dev user
    exists; a key made by the CLI opens on both, and once revoked, on neither."""
    database = Path(pipeline.env()["CHATPIPE_DATABASE_PATH"])
    for name in ("g1", "g2"):
        await pipeline.start(name, "gateway", dev_api_key="")
    await pipeline.wait_for_gateway("g1")
    await pipeline.wait_for_gateway("g2")

    store = SQLiteStore(database)  # no secret: it lists, it cannot check
    await store.open()
    try:
        assert [k for k in await store.list_api_keys() if k.user_id == DEV_USER] == []
    finally:
        await store.close()
    assert not secret_file(database).exists()
    gateways = [pipeline.base_url(name) for name in ("g1", "g2")]
    for url in gateways:
        assert await status(url, "faults-dev-key") == 401  # the harness's usual dev key

    key = await create_key(database, "--user", "frank", "--org", "acme", "--tier", "pro",
                           key_secret=KEY_SECRET)  # fmt: skip
    assert [await status(url, key) for url in gateways] == [200, 200]
    await keys_cli(database, "revoke", key_id(key))
    assert [await status(url, key) for url in gateways] == [401, 401]


@prints_logs_on_failure
async def test_a_gateway_alone_with_a_dev_key_has_the_dev_user(pipeline) -> None:
    await pipeline.start("gateway", dev_api_key="chosen-dev-key")
    await pipeline.wait_for_gateway()

    async with pipeline.http(api_key="chosen-dev-key") as client:
        response = await client.post("/v1/conversations", json={})
    assert response.status_code == 201


@prints_logs_on_failure
async def test_a_gateway_alone_without_a_key_secret_does_not_start(pipeline) -> None:
    await pipeline.start("gateway", key_secret="")

    assert await pipeline.exited("gateway", timeout_s=60) != 0
    assert "CHATPIPE_KEY_SECRET" in pipeline.log_tail("gateway")

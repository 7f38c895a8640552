"""Model aliases (`gateway.rollout`): the pure picking, weights and rollback, then the
gateway in process (real SQLite, scripted pipeline: see test_gateway_app) picking a
version per conversation and taking feedback on answers."""

from __future__ import annotations

from collections import Counter

import pytest

from chatpipe.settings import Settings
from gateway.app import create_app
from gateway.rollout import (
    ModelAliases,
    ModelChoice,
    RolloutError,
    check_weights,
    hash_point,
    parse_weights,
    pick,
    rollback_weights,
)
from schemas.api import FEEDBACK_TEXT_CHARS
from schemas.events import RolloutSet
from tests.support.gateway import (
    ALICE,
    BOB,
    ScriptedPipeline,
    assert_error,
    done,
    gateway_deps,
    new_conversation,
)

SERVED = ("v1", "v2", "v3")
CONVERSATIONS = [f"c-{i}" for i in range(4000)]


def shares(weights: dict[str, float], alias: str = "chat") -> Counter[str]:
    return Counter(pick(alias, weights, cid) for cid in CONVERSATIONS)


# --- picking ----------------------------------------------------------------------------


def test_a_conversation_always_gets_the_same_version():
    weights = {"v1": 0.5, "v2": 0.5}
    assert [pick("chat", weights, "c-7") for _ in range(5)] == [pick("chat", weights, "c-7")] * 5
    assert ModelAliases({"chat": weights}, SERVED).choose("chat", "c-7") == ModelChoice(
        pick("chat", weights, "c-7"), "chat"
    )


def test_the_hash_is_spread_and_differs_per_alias():
    points = [hash_point("chat", cid) for cid in CONVERSATIONS]
    assert all(0 <= p < 1 for p in points)
    assert sum(p < 0.5 for p in points) == pytest.approx(2000, abs=150)
    assert [pick("a", {"v1": 1, "v2": 1}, c) for c in CONVERSATIONS[:50]] != [
        pick("b", {"v1": 1, "v2": 1}, c) for c in CONVERSATIONS[:50]
    ]


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ({"v1": 0.9, "v2": 0.1}, {"v1": 0.9, "v2": 0.1}),
        ({"v1": 9, "v2": 1}, {"v1": 0.9, "v2": 0.1}),  # only the ratio counts
        ({"v1": 1, "v2": 1, "v3": 2}, {"v1": 0.25, "v2": 0.25, "v3": 0.5}),
        ({"v1": 0, "v2": 1}, {"v2": 1.0}),  # weight 0: never picked
        ({"v2": 1.0}, {"v2": 1.0}),
    ],
)
def test_versions_are_picked_by_weight(weights, expected):
    counted = shares(weights)
    assert set(counted) == set(expected)
    for version, share in expected.items():
        assert counted[version] / len(CONVERSATIONS) == pytest.approx(share, abs=0.03)


def test_a_weight_change_moves_only_the_conversations_it_must():
    before = {cid: pick("chat", {"v1": 0.9, "v2": 0.1}, cid) for cid in CONVERSATIONS}
    after = {cid: pick("chat", {"v1": 0.8, "v2": 0.2}, cid) for cid in CONVERSATIONS}
    moved = [cid for cid in CONVERSATIONS if before[cid] != after[cid]]
    assert all(before[cid] == "v1" and after[cid] == "v2" for cid in moved)
    assert len(moved) / len(CONVERSATIONS) == pytest.approx(0.1, abs=0.02)
    assert all(after[cid] == "v2" for cid in CONVERSATIONS if before[cid] == "v2")


# --- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "weights", "says"),
    [
        ("chat", {}, "at least one version"),
        ("chat", {"v9": 1.0}, "v9 not served"),
        ("chat", {"v1": -0.1, "v2": 1}, "must be a number >= 0"),
        ("chat", {"v1": float("nan")}, "must be a number >= 0"),
        ("chat", {"v1": float("inf")}, "must be a number >= 0"),
        ("chat", {"v1": 0, "v2": 0}, "sum to more than 0"),
        ("v1", {"v2": 1.0}, "is a served model"),
    ],
)
def test_bad_weights_are_refused_saying_why(alias, weights, says):
    with pytest.raises(RolloutError, match=says):
        check_weights(alias, weights, SERVED)


def test_good_weights_pass_as_given():
    assert check_weights("chat", {"v1": 0.9, "v2": 0.1}, SERVED) == {"v1": 0.9, "v2": 0.1}
    assert check_weights("chat", {"v1": 0, "v3": 2}, SERVED) == {"v1": 0, "v3": 2}


@pytest.mark.parametrize(
    ("pairs", "says"),
    [
        (["v1"], "VERSION=WEIGHT"),
        (["=1"], "VERSION=WEIGHT"),
        (["v1=x"], "not a number"),
        (["v1=1", "v1=2"], "named twice"),
    ],
)
def test_cli_pairs_that_do_not_parse(pairs, says):
    with pytest.raises(RolloutError, match=says):
        parse_weights(pairs)


def test_cli_pairs_parse_in_order():
    assert list(parse_weights(["v2=0.1", "v1=0.9"]).items()) == [("v2", 0.1), ("v1", 0.9)]


def test_a_rollout_record_refuses_weights_that_pick_nothing():
    with pytest.raises(ValueError):
        RolloutSet(alias="chat", weights={"v1": 0})
    with pytest.raises(ValueError):
        RolloutSet(alias="chat", weights={"v1": -1, "v2": 2})


# --- live changes and rollback -----------------------------------------------------------


def test_the_last_record_of_an_alias_wins():
    aliases = ModelAliases({"chat": {"v1": 1.0}}, SERVED)
    aliases.apply(RolloutSet(alias="chat", weights={"v2": 1.0}))
    aliases.apply(RolloutSet(alias="new", weights={"v3": 1.0}))
    assert aliases.choose("chat", "c-1") == ModelChoice("v2", "chat")
    assert aliases.choose("new", "c-1") == ModelChoice("v3", "new")
    assert aliases.choose("v1", "c-1") is None and aliases.choose(None, "c-1") is None
    assert aliases.names == ["chat", "new"]


def test_a_record_naming_a_version_not_served_is_refused_and_changes_nothing():
    aliases = ModelAliases({"chat": {"v1": 1.0}}, SERVED)
    with pytest.raises(RolloutError):
        aliases.apply(RolloutSet(alias="chat", weights={"v9": 1.0}))
    assert aliases.weights("chat") == {"v1": 1.0}


@pytest.mark.parametrize(
    ("history", "to", "expected"),
    [
        ([{"v1": 1.0}, {"v1": 0.9, "v2": 0.1}], None, {"v1": 1.0}),
        (
            [{"v1": 1.0}, {"v1": 0.9, "v2": 0.1}, {"v1": 0.5, "v2": 0.5}],
            None,
            {"v1": 0.9, "v2": 0.1},
        ),
        ([{"v1": 0.5, "v2": 0.5}], "v2", {"v2": 1.0}),
        ([], "v1", {"v1": 1.0}),
    ],
)
def test_rollback_goes_to_the_weights_before_or_to_one_version(history, to, expected):
    assert rollback_weights("chat", history, to, SERVED) == expected


@pytest.mark.parametrize(
    ("history", "to", "says"),
    [
        ([{"v1": 1.0}], None, "no earlier weights"),
        ([], None, "no earlier weights"),
        ([{"v1": 1.0}, {"v2": 1.0}], "v9", "v9 not served"),
    ],
)
def test_a_rollback_with_nowhere_to_go_is_refused(history, to, says):
    with pytest.raises(RolloutError, match=says):
        rollback_weights("chat", history, to, SERVED)


# --- the gateway ---------------------------------------------------------------------------


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(
        model_name="v1",
        served_models=list(SERVED),
        model_aliases={"chat": {"v1": 0.5, "v2": 0.5}},
        default_max_tokens=16,
        database_path=tmp_path / "chat.db",
    )


@pytest.fixture
def pipeline() -> ScriptedPipeline:
    return ScriptedPipeline()


@pytest.fixture
def aliases(settings: Settings) -> ModelAliases:
    return ModelAliases(settings.scheduler.model_aliases, settings.models)


@pytest.fixture
async def app(settings, store, pipeline, aliases):
    deps = gateway_deps(settings, store, pipeline, aliases=aliases)
    yield create_app(deps)
    await deps.background.close()


async def answered_turn(client, pipeline, cid: str, model: str = "chat") -> dict:
    pipeline.script(done(0))
    response = await client.post(
        f"/v1/conversations/{cid}/messages", headers=ALICE, json={"content": "hi", "model": model}
    )
    assert response.status_code == 200, response.text
    return pipeline.submitted[-1]


async def test_every_turn_of_a_conversation_runs_on_its_version(client, pipeline, store):
    cid = await new_conversation(client)
    first = await answered_turn(client, pipeline, cid)
    second = await answered_turn(client, pipeline, cid)
    pipeline.script(done(0))
    response = await client.post(
        f"/v1/conversations/{cid}/messages/{second.message_id}/regenerate",
        headers=ALICE,
        json={"model": "chat"},
    )
    assert response.status_code == 200, response.text
    regenerated = pipeline.submitted[-1]

    version = pick("chat", {"v1": 0.5, "v2": 0.5}, cid)
    assert [(r.model, r.alias) for r in (first, second, regenerated)] == [(version, "chat")] * 3
    answers = [m for m in await store.list_messages(cid) if m.role.value == "assistant"]
    assert [(m.model, m.alias) for m in answers] == [(version, "chat")] * 3
    detail = (await client.get(f"/v1/conversations/{cid}", headers=ALICE)).json()
    assert {(m["model"], m["alias"]) for m in detail["messages"] if m["role"] == "assistant"} == {
        (version, "chat")
    }


async def test_conversations_spread_over_the_versions_and_follow_a_change(
    client, pipeline, aliases
):
    cids = [await new_conversation(client) for _ in range(12)]
    for cid in cids:
        await answered_turn(client, pipeline, cid)
    assert {r.model for r in pipeline.submitted} == {"v1", "v2"}
    aliases.apply(RolloutSet(alias="chat", weights={"v3": 1.0}))
    await answered_turn(client, pipeline, cids[0])
    assert (pipeline.submitted[-1].model, pipeline.submitted[-1].alias) == ("v3", "chat")


async def test_a_model_named_directly_has_no_alias(client, pipeline):
    cid = await new_conversation(client)
    request = await answered_turn(client, pipeline, cid, model="v2")
    assert (request.model, request.alias) == ("v2", None)


async def test_openai_completions_pick_a_version_and_models_list_the_alias(client, pipeline):
    pipeline.script(done(0))
    response = await client.post(
        "/v1/chat/completions",
        headers=ALICE,
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200, response.text
    [request] = pipeline.submitted
    assert request.alias == "chat" and request.model in ("v1", "v2")
    assert request.model == pick("chat", {"v1": 0.5, "v2": 0.5}, request.conversation_id)
    models = (await client.get("/v1/models", headers=ALICE)).json()
    assert [m["id"] for m in models["data"]] == [*SERVED, "chat"]
    alias = (await client.get("/v1/models/chat", headers=ALICE)).json()
    assert (alias["id"], alias["kind"]) == ("chat", "chat")


async def test_feedback_on_an_answer_reaches_the_pipeline(client, pipeline, store):
    cid = await new_conversation(client)
    request = await answered_turn(client, pipeline, cid)
    response = await client.post(
        f"/v1/messages/{request.message_id}/feedback",
        headers=ALICE,
        json={"rating": "down", "text": "wrong"},
    )
    assert response.status_code == 202, response.text
    assert response.json() == {
        "message_id": request.message_id,
        "rating": "down",
        "status": "recorded",
    }
    [event] = pipeline.feedback_events
    assert (event.message_id, event.conversation_id, event.request_id) == (
        request.message_id,
        cid,
        request.request_id,
    )
    assert (event.user_id, event.org_id, event.model, event.alias, event.rating, event.text) == (
        "alice",
        "org-a",
        request.model,
        "chat",
        "down",
        "wrong",
    )


async def test_feedback_is_for_the_owner_of_an_answer_only(client, pipeline, store):
    cid = await new_conversation(client)
    request = await answered_turn(client, pipeline, cid)
    [user] = [m for m in await store.list_messages(cid) if m.role.value == "user"]
    url = f"/v1/messages/{request.message_id}/feedback"

    assert_error(
        await client.post(url, headers=BOB, json={"rating": "up"}), 404, "message_not_found"
    )
    assert_error(
        await client.post("/v1/messages/nope/feedback", headers=ALICE, json={"rating": "up"}),
        404,
        "message_not_found",
    )
    assert_error(
        await client.post(
            f"/v1/messages/{user.message_id}/feedback", headers=ALICE, json={"rating": "up"}
        ),
        400,
        "not_an_answer",
    )
    for body in (
        {"rating": "meh"},
        {},
        {"rating": "up", "text": "x" * (FEEDBACK_TEXT_CHARS + 1)},
        {"rating": "up", "stars": 5},
    ):
        assert_error(await client.post(url, headers=ALICE, json=body), 422, "invalid_request")
    assert (await client.post(url, json={"rating": "up"})).status_code == 401
    assert pipeline.feedback_events == []

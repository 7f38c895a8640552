"""Event contracts: the committed export is current, no event changed incompatibly within
its version, the compatibility rule itself, and the AsyncAPI document is valid AsyncAPI 3.

The AsyncAPI 3.0.0 JSON Schema in tests/fixtures is the official one
(github.com/asyncapi/spec-json-schemas, `schemas/3.0.0-without-$id.json`, Apache-2.0),
minified.
"""

from __future__ import annotations

import copy
import json
from enum import StrEnum
from pathlib import Path
from typing import Literal

import jsonschema
import orjson
import pytest
import yaml
from pydantic import Field, create_model

from chatpipe import kafka_acls as acls
from schemas import contracts, events, topics
from schemas.codec import encode
from schemas.compatibility import incompatibilities
from schemas.contracts import (
    ASYNCAPI_FILE,
    CHANNELS,
    GROUPS,
    OPERATIONS,
    REGENERATE,
    IncompatibleChange,
    check_compatible,
    event_schema,
    export,
    stale,
)
from schemas.events import Event
from schemas.lifecycle import RequestStatus

ROOT = Path(__file__).resolve().parents[3]
CONTRACTS = ROOT / "contracts"
ASYNCAPI_SCHEMA = ROOT / "tests" / "fixtures" / "asyncapi-3.0.0.schema.json"


# --- the committed export ------------------------------------------------------------


def test_the_committed_contracts_are_the_current_export() -> None:
    out_of_date = stale(CONTRACTS)
    assert not out_of_date, f"contracts/ is out of date ({out_of_date}); regenerate: {REGENERATE}"


def test_no_event_changed_incompatibly_within_its_published_version() -> None:
    problems = check_compatible(CONTRACTS)
    assert not problems, (
        "an event changed incompatibly without a new schema_version: bump "
        "its schema_version (the old version's file stays), then "
        f"{REGENERATE}\n" + "\n".join(problems)
    )


def test_export_refuses_to_rewrite_a_published_version_incompatibly(tmp_path: Path) -> None:
    assert sorted(export(tmp_path)) == sorted(contracts.contract_files())
    assert export(tmp_path) == []  # nothing changed: nothing written
    published = tmp_path / contracts.schema_path(events.UsageEvent)
    schema = json.loads(published.read_text())
    schema["properties"]["region"] = {"type": "string"}  # the published v1 had a field
    published.write_text(json.dumps(schema))
    (tmp_path / ASYNCAPI_FILE).write_text("stale")

    with pytest.raises(IncompatibleChange, match=r"UsageEvent v1: region: removed"):
        export(tmp_path)
    assert (tmp_path / ASYNCAPI_FILE).read_text() == "stale"  # nothing written


class _Thing(Event):
    type: Literal["thing"] = "thing"
    name: str


class _ThingV2(Event):
    schema_version: int = 2
    type: Literal["thing"] = "thing"
    label: str


def test_a_new_schema_version_is_checked_against_its_own_file_only(tmp_path: Path) -> None:
    _ThingV2.__name__ = "_Thing"  # the same event, renamed field, version bumped
    published = tmp_path / contracts.schema_path(_Thing)
    published.parent.mkdir()
    published.write_text(json.dumps(event_schema(_Thing)))
    assert contracts.schema_path(_ThingV2) == "events/_Thing.v2.json"
    assert check_compatible(tmp_path, [_ThingV2]) == []
    renamed_in_place = tmp_path / contracts.schema_path(_ThingV2)
    renamed_in_place.write_text(published.read_text())
    assert check_compatible(tmp_path, [_ThingV2]) == [
        "_Thing v2: name: removed (or renamed)",
        "_Thing v2: label: new field is required",
    ]


# --- the compatibility rule ------------------------------------------------------------


class Color(StrEnum):
    RED = "red"
    GREEN = "green"


class WideColor(StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class NarrowColor(StrEnum):
    RED = "red"


class Base(Event):
    type: Literal["sample"] = "sample"
    request_id: str
    tokens: int = 0
    color: Color = Color.RED
    status: RequestStatus = RequestStatus.WAITING
    note: str | None = None
    ids: tuple[int, ...] = ()
    limit: int = Field(10, ge=1)


def _variant(**fields: tuple | None) -> type[Event]:
    """`Base` with `fields` replaced: (type,) required, (type, default or Field), or None
    to remove the field."""
    spec: dict[str, object] = {
        name: (info.annotation, info) for name, info in Base.model_fields.items()
    }
    for name, change in fields.items():
        spec.pop(name, None)
        if change is not None:
            spec[name] = change if len(change) == 2 else (change[0], ...)
    return create_model("Base", __base__=Event, **spec)


COMPATIBLE = {
    "identical": {},
    "an optional field added": {"region": (str, "eu")},
    "an optional nullable field added": {"cache_salt": (str | None, None)},
    "an enum widened": {"color": (WideColor, WideColor.RED)},
    "a required field made optional": {"request_id": (str, "")},
    "a constraint loosened": {"limit": (int, Field(10, ge=0))},
    "a description added": {"tokens": (int, Field(0, description="tokens so far"))},
    "a default changed": {"tokens": (int, 5)},
}
INCOMPATIBLE = {
    "a field removed": ({"note": None}, "note: removed"),
    "a field renamed": ({"tokens": None, "token_count": (int, 0)}, "tokens: removed"),
    "a type changed": ({"tokens": (str, "0")}, "tokens: type changed"),
    "int widened to float": ({"tokens": (float, 0.0)}, "tokens: type changed"),
    "an optional field made required": ({"tokens": (int,)}, "optional field made required"),
    "a required field added": ({"region": (str,)}, "region: new field is required"),
    "an enum narrowed": ({"color": (NarrowColor, NarrowColor.RED)}, "enum narrowed"),
    "a nullable field made non-null": ({"note": (str, "")}, "note: type changed"),
    "a field made nullable": ({"tokens": (int | None, 0)}, "tokens: type changed"),
    "an array's items changed": ({"ids": (tuple[str, ...], ())}, "ids[items]: type changed"),
    "a constraint narrowed": ({"limit": (int, Field(10, ge=2))}, "minimum narrowed"),
    "the type literal changed": ({"type": (Literal["other"], "other")}, "const changed"),
}


@pytest.mark.parametrize("change", COMPATIBLE)
def test_compatible_changes_keep_the_version(change: str) -> None:
    new = _variant(**COMPATIBLE[change])
    assert incompatibilities(Base.model_json_schema(), new.model_json_schema()) == []


@pytest.mark.parametrize("change", INCOMPATIBLE)
def test_incompatible_changes_need_a_new_version(change: str) -> None:
    fields, reason = INCOMPATIBLE[change]
    new = _variant(**fields)
    problems = incompatibilities(Base.model_json_schema(), new.model_json_schema())
    assert any(reason in problem for problem in problems), problems


def test_a_change_inside_a_nested_model_counts() -> None:
    old = events.GenerationRequest.model_json_schema()
    new = copy.deepcopy(old)
    del new["$defs"]["SamplingOptions"]["properties"]["seed"]
    new["$defs"]["Tier"]["enum"].remove("free")
    assert incompatibilities(old, new) == [
        "tier: enum narrowed, ['free'] no longer allowed",
        "sampling.seed: removed (or renamed)",
    ]


# --- the AsyncAPI document ---------------------------------------------------------------


@pytest.fixture(scope="module")
def document() -> dict:
    return yaml.safe_load((CONTRACTS / ASYNCAPI_FILE).read_text())


@pytest.fixture(scope="module")
def asyncapi_validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads(ASYNCAPI_SCHEMA.read_text()))


def test_the_document_is_valid_asyncapi_3(document, asyncapi_validator) -> None:
    errors = [
        f"{list(e.path)}: {e.message[:200]}" for e in asyncapi_validator.iter_errors(document)
    ]
    assert errors == []
    assert document["asyncapi"] == "3.0.0"


@pytest.mark.parametrize("breakage", ["action", "address", "no info"])
def test_the_validator_rejects_a_broken_document(document, asyncapi_validator, breakage) -> None:
    broken = copy.deepcopy(document)
    if breakage == "action":
        broken["operations"]["billing-receive-usage"]["action"] = "subscribe"  # AsyncAPI 2
    elif breakage == "address":
        broken["channels"]["usage"]["address"] = 7
    else:
        del broken["info"]
    assert list(asyncapi_validator.iter_errors(broken))


def test_channels_are_the_topics_and_messages_point_at_the_committed_schemas(document) -> None:
    addresses = {channel["address"] for channel in document["channels"].values()}
    for topic in [*topics.shared_topics(), topics.deliver_topic("gw-1", "a1b2c3")]:
        assert [c.id for c in contracts.channels_for(topic)], f"{topic} has no channel"
    assert "chat.requests.{tier}" in addresses and "chat.deliver.{gateway_id}.{start}" in addresses
    for channel_id, channel in document["channels"].items():
        assert channel["messages"], channel_id
        for name, message in channel["messages"].items():
            ref = message["payload"]["schema"]["$ref"]
            schema = json.loads((CONTRACTS / ref).read_text())
            version = schema["properties"]["schema_version"]["default"]
            assert schema["title"] == name and ref == f"events/{name}.v{version}.json"
            assert (
                message["headers"]["properties"]["event-type"]["const"]
                == schema["properties"]["type"]["const"]
            )
            assert {"event-type", "schema-version"} <= set(message["headers"]["required"])
            assert "traceparent" in message["headers"]["properties"]
            assert message["bindings"]["kafka"]["key"]["type"] == "string"


def test_every_stage_sends_and_receives_through_declared_messages(document) -> None:
    stages = {"gateway", *GROUPS}
    for stage in stages:
        actions = {
            op["action"]
            for op_id, op in document["operations"].items()
            if op_id.startswith(f"{stage}-")
        }
        assert actions == {"send", "receive"}, stage
    for op_id, operation in document["operations"].items():
        channel_id = operation["channel"]["$ref"].removeprefix("#/channels/")
        assert channel_id in document["channels"], op_id
        assert operation["messages"], op_id
        for ref in operation["messages"]:
            prefix = f"#/channels/{channel_id}/messages/"
            assert ref["$ref"].startswith(prefix), (op_id, ref)
            assert ref["$ref"].removeprefix(prefix) in document["channels"][channel_id]["messages"]


def test_every_event_class_is_on_some_channel() -> None:
    published = set(contracts.events())
    concrete = {
        cls
        for cls in vars(events).values()
        if isinstance(cls, type) and issubclass(cls, Event) and "type" in cls.model_fields
    }
    assert concrete - published == set()


def test_operations_agree_with_the_stages_kafka_grants() -> None:
    """chatpipe/kafka_acls.py is checked against what the stages really use (test_kafka_acls)."""
    action_of = {"send": acls.Operation.WRITE, "receive": acls.Operation.READ}
    for operation in OPERATIONS:
        if operation.stage not in acls.GRANTS:
            continue
        [channel] = [c for c in CHANNELS if c.id == operation.channel]
        assert acls.allowed(
            operation.stage,
            action_of[operation.action],
            acls.Resource.TOPIC,
            channel.example_address(),
        ), operation.id
    for stage, grants in acls.GRANTS.items():
        for grant in grants:
            if grant.resource is acls.Resource.GROUP:
                assert GROUPS[stage] == grant.name
                continue
            action = {v: k for k, v in action_of.items()}.get(grant.operation)
            if action is None:
                continue
            declared = [
                op
                for op in OPERATIONS
                if op.stage == stage
                and op.action == action
                and any(
                    c.id == op.channel
                    for c in contracts.channels_for(grant.name + ("x" if grant.prefixed else ""))
                )
            ]
            assert declared, f"{stage} may {action} {grant.name} but no operation says so"


def _samples() -> list[Event]:
    request = events.GenerationRequest(
        request_id="r1",
        conversation_id="c1",
        message_id="m1",
        user_id="u1",
        org_id="o1",
        tier=topics.Tier.PRO,
        model="tiny-random",
        reply_to="chat.deliver.gw",
        messages=(events.ChatMessage(role=events.Role.USER, content="hi"),),
        stream=events.StreamPosition(partition=1, start_offset=3, attempt_offset=3),
    )
    return [
        request,
        events.WorkAssignment(worker_id="w1", request=request, epoch=2),
        events.TokenChunk(
            **events.stream_fields(request, 0),
            text="Hel",
            token_count=2,
            completion_tokens=2,
            token_ids=(5, 6),
        ),
        events.GenerationDone(
            **events.stream_fields(request, 1),
            status=RequestStatus.FINISHED_STOPPED,
            usage=events.Usage(prompt_tokens=3, completion_tokens=2),
        ),
        events.WorkerHeartbeat(
            worker_id="w1",
            model="tiny-random",
            partitions=(0, 1),
            max_slots=4,
            consumed={0: 12},
            assignments={"r1": (0, 11)},
        ),
        events.SchedulerStatus(
            tiers={
                topics.Tier.PRO: events.TierStatus(waiting=1, expected_wait_s=None, shedding=False)
            }
        ),
        events.UsageEvent(
            request_id="r1",
            conversation_id="c1",
            user_id="u1",
            org_id="o1",
            tier=topics.Tier.PRO,
            model="tiny-random",
            worker_id="w1",
            status=RequestStatus.FINISHED_STOPPED,
            prompt_tokens=3,
            completion_tokens=2,
            cached_tokens=0,
            gpu_ms=1.5,
        ),
        events.ModerationEvent(request_id="r1", action="retract", category="pii", reason="x"),
    ]


@pytest.mark.parametrize("event", _samples(), ids=lambda e: type(e).__name__)
def test_events_as_sent_match_their_published_schema(event: Event) -> None:
    schema = json.loads((CONTRACTS / contracts.schema_path(type(event))).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(orjson.loads(encode(event)))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(
            {**orjson.loads(encode(event)), "type": "not-this-event"}
        )

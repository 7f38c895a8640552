"""Scheduler shards by model (`scheduler/shards.py`, docs/architecture/scale.md): which scheduler
decides for which model, claims that fence only their own shard, the settings that name
the shards, and the gateway's shedding per shard."""

from __future__ import annotations

import gc

import pytest
from pydantic import ValidationError

from bus.config import KafkaConfig
from bus.topics import TopicLayout
from chatpipe.settings import Settings
from chatpipe.wiring import scheduler_stage, scheduling_policy
from gateway.admission.shedding import STATUS_FRESH_S, Shedding
from ops.bus_records import kind_of
from scheduler.claims import fences
from scheduler.shards import UNFREEZE_EVERY, HeapFreezer, Shard
from schemas import contracts, topics
from schemas.codec import WORK_EVENT
from schemas.events import SchedulerClaim, SchedulerStatus, TierStatus
from schemas.topics import Tier

SHARDS = {"big": ["llama-70b", "llama-405b"], "small": ["llama-8b"]}


@pytest.mark.parametrize(
    ("name", "model", "decides"),
    [
        ("big", "llama-70b", True),
        ("big", "llama-405b", True),
        ("big", "llama-8b", False),
        ("big", "mistral", False),
        ("small", "llama-8b", True),
        ("small", "llama-70b", False),
        ("", "mistral", True),  # the unnamed shard: every model no named shard lists
        ("", "llama-70b", False),
        ("", "llama-8b", False),
    ],
)
def test_each_model_is_decided_by_exactly_one_shard(name, model, decides):
    assert Shard.of(SHARDS, name).decides(model) is decides
    deciding = [shard for shard in ("", *SHARDS) if Shard.of(SHARDS, shard).decides(model)]
    assert len(deciding) == 1


@pytest.mark.parametrize(
    ("name", "work_topic", "group", "sharded"),
    [
        ("big", "chat.work.big", "chatpipe-scheduler-big", True),
        ("", "chat.work", "chatpipe-scheduler", True),
    ],
)
def test_a_shard_has_its_own_journal_and_group(name, work_topic, group, sharded):
    shard = Shard.of(SHARDS, name)
    assert (shard.work_topic, shard.group, shard.sharded) == (work_topic, group, sharded)


def test_without_shards_the_one_scheduler_decides_everything_as_before():
    shard = Shard.of({}, "")
    assert shard == Shard() and not shard.sharded
    assert shard.decides("anything") and shard.work_topic == topics.WORK
    assert shard.group == "chatpipe-scheduler"


@pytest.mark.parametrize(
    ("claim", "shard", "fenced"),
    [
        (SchedulerClaim(scheduler_id="other", epoch=11, shard="big"), "big", True),
        (SchedulerClaim(scheduler_id="other", epoch=10, shard="big"), "big", False),
        (SchedulerClaim(scheduler_id="me", epoch=12, shard="big"), "big", False),
        # Another shard's scheduler decides beside this one, whatever its epoch.
        (SchedulerClaim(scheduler_id="other", epoch=99, shard="small"), "big", False),
        (SchedulerClaim(scheduler_id="other", epoch=99, shard=""), "big", False),
        (SchedulerClaim(scheduler_id="other", epoch=99, shard="big"), "", False),
        (SchedulerClaim(scheduler_id="other", epoch=11), "", True),
    ],
)
def test_a_claim_fences_only_an_older_scheduler_of_its_own_shard(claim, shard, fenced):
    assert fences(claim, "me", 10, shard) is fenced


def test_settings_name_the_shards_and_each_models_shard():
    settings = Settings(scheduler_shards=SHARDS, scheduler_shard="big")
    assert settings.shard_of("llama-405b") == "big"
    assert settings.shard_of("llama-8b") == "small"
    assert settings.shard_of("mistral") == ""
    assert settings.shard_models("small") == frozenset({"llama-8b"})
    assert settings.shard_models("") is None


@pytest.mark.parametrize(
    "wrong",
    [
        {"scheduler_shards": {"Big": ["a"]}},  # not a topic-safe name
        {"scheduler_shards": {"a.b": ["a"]}},
        {"scheduler_shards": {"one": ["m"], "two": ["m"]}},  # two schedulers for one model
        {"scheduler_shards": {"one": ["m"]}, "scheduler_shard": "two"},  # no such shard
        {"scheduler_gc_freeze_s": -1},
    ],
)
def test_wrong_shard_settings_are_refused(wrong):
    with pytest.raises(ValidationError):
        Settings(**wrong)


@pytest.mark.parametrize(("setting", "alone", "every_s"), [
    ({}, True, 1.0),  # `chatpipe scheduler`: its own process, frozen every second
    ({}, False, 0.0),  # `chatpipe up`: every stage shares the heap, never frozen
    ({"scheduler_gc_freeze_s": 0}, True, 0.0),
    ({"scheduler_gc_freeze_s": 5}, False, 5.0),
])  # fmt: skip
def test_a_scheduler_alone_freezes_its_heap_unless_told_otherwise(setting, alone, every_s):
    stage = scheduler_stage(KafkaConfig("127.0.0.1:1"), Settings(**setting), alone=alone)
    assert stage.heap.every_s == every_s


def test_routes_between_models_stay_inside_a_shard():
    settings = Settings(
        scheduler_shards={"big": ["llama-70b"]},
        fallback_models={"llama-70b": "llama-8b", "mistral": "llama-8b"},
        small_model="llama-8b",
        simple_request_max_chars=40,
    )
    big = scheduling_policy(settings, Shard.of(settings.scheduler.scheduler_shards, "big"))
    assert big.fallback_models == {} and big.small_model is None
    unnamed = scheduling_policy(settings, Shard.of(settings.scheduler.scheduler_shards, ""))
    assert unnamed.fallback_models == {"mistral": "llama-8b"}
    assert unnamed.small_model == "llama-8b"


def test_every_shard_gets_a_journal_topic_and_its_records_read_as_chat_work():
    layout = TopicLayout(work_partitions=16, shards=("big", "small"))
    counts = layout.partitions()
    assert counts[topics.WORK] == counts["chat.work.big"] == counts["chat.work.small"] == 16
    assert "chat.work." not in counts
    assert kind_of("chat.work.big") is WORK_EVENT and kind_of(topics.WORKERS) is not WORK_EVENT
    assert [c.id for c in contracts.channels_for("chat.work.big")] == ["work_shard"]
    assert [c.id for c in contracts.channels_for(topics.WORKERS)] == ["workers"]


def _status(
    shard: str,
    models: tuple[str, ...],
    shedding: bool,
    sent_at: float,
    retry_after_s: float | None = 7.0,
) -> SchedulerStatus:
    tier = TierStatus(
        waiting=5, expected_wait_s=40.0, shedding=shedding, retry_after_s=retry_after_s
    )
    return SchedulerStatus(tiers={Tier.FREE: tier}, shard=shard, models=models, sent_at=sent_at)


NOW = 1_000.0


@pytest.mark.parametrize(
    ("statuses", "tier", "model", "retry_after"),
    [
        ([], Tier.FREE, "llama-70b", None),  # no scheduler heard of: admitted
        ([_status("big", ("llama-70b",), True, NOW)], Tier.FREE, "llama-70b", 7.0),
        ([_status("big", ("llama-70b",), True, NOW)], Tier.PRO, "llama-70b", None),
        # One shard shedding leaves the other shards' models admitted.
        (
            [_status("big", ("llama-70b",), True, NOW), _status("", (), False, NOW)],
            Tier.FREE,
            "mistral",
            None,
        ),
        ([_status("big", ("llama-70b",), True, NOW)], Tier.FREE, "mistral", None),
        (
            [_status("big", ("llama-70b",), False, NOW), _status("", (), True, NOW)],
            Tier.FREE,
            "mistral",
            7.0,
        ),
        (
            [_status("big", ("llama-70b",), False, NOW), _status("", (), True, NOW)],
            Tier.FREE,
            "llama-70b",
            None,
        ),
        # The newest status of a shard replaces its earlier one.
        (
            [_status("big", ("llama-70b",), True, NOW), _status("big", ("llama-70b",), False, NOW)],
            Tier.FREE,
            "llama-70b",
            None,
        ),
        # A stale status says nothing about now.
        (
            [_status("big", ("llama-70b",), True, NOW - STATUS_FRESH_S - 1)],
            Tier.FREE,
            "llama-70b",
            None,
        ),
        ([_status("", (), True, NOW, retry_after_s=None)], Tier.FREE, "any", 1.0),
    ],
)
def test_the_gateway_sheds_a_model_by_its_own_shards_status(statuses, tier, model, retry_after):
    shedding = Shedding()
    for status in statuses:
        shedding.update(status)
    assert shedding.retry_after(tier, model, NOW) == retry_after


def test_the_heap_freezer_freezes_on_its_interval_and_thaws_now_and_then():
    clock = [0.0]
    freezer = HeapFreezer(1.0, lambda: clock[0])
    gc.unfreeze()
    try:
        freezer.tick()
        assert gc.get_freeze_count() == 0  # not due yet
        clock[0] = 1.0
        freezer.tick()
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
        for _ in range(UNFREEZE_EVERY - 1):
            clock[0] += 1.0
            freezer.tick()
        assert gc.get_freeze_count() == 0  # the UNFREEZE_EVERY-th: thawed
    finally:
        gc.unfreeze()


def test_a_heap_freezer_at_zero_never_freezes():
    clock = [0.0]
    freezer = HeapFreezer(0.0, lambda: clock[0])
    gc.unfreeze()
    clock[0] = 100.0
    freezer.tick()
    assert gc.get_freeze_count() == 0

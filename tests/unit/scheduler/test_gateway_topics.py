"""Gateways come and go: which delivery topics belong to gateways that are gone
(scheduler/gateways.py), who may delete them, and which limits one gateway keeps alone."""

from __future__ import annotations

import pytest

from chatpipe.kafka_acls import GRANTS, Operation, Resource, allowed
from gateway.admission.rate_limits import per_process
from scheduler.gateways import GatewayWatch

G1, G2, G3 = "chat.deliver.g1", "chat.deliver.g2", "chat.deliver.g3"


def test_a_gateway_silent_longer_than_the_ttl_is_gone_a_heartbeating_one_never():
    watch = GatewayWatch(grace_s=5, topic_ttl_s=60)
    watch.heartbeat(G1, now=0)
    watch.heartbeat(G2, now=0)
    assert watch.gone_topics([G1, G2], set(), now=60) == [], "silent exactly the TTL"
    watch.heartbeat(G2, now=50)
    assert watch.gone_topics([G1, G2], set(), now=61) == [G1]
    assert watch.gone_topics([G1, G2], set(), now=109) == [G1]
    assert watch.gone_topics([G1, G2], set(), now=111) == [G1, G2]


def test_a_topic_a_waiting_or_running_request_delivers_to_is_kept():
    watch = GatewayWatch(grace_s=5, topic_ttl_s=60)
    watch.heartbeat(G1, now=0)
    assert watch.gone_topics([G1], {G1}, now=1000) == []
    assert watch.gone_topics([G1], set(), now=1000) == [G1], "once that request ended"


def test_a_topic_no_gateway_ever_heartbeated_for_is_gone_a_ttl_after_it_was_first_listed():
    watch = GatewayWatch(grace_s=5, topic_ttl_s=60)
    assert watch.gone_topics([G3], set(), now=100) == [], "listed at 100: left from before"
    assert watch.gone_topics([G3], set(), now=160) == []
    assert watch.gone_topics([G3], set(), now=161) == [G3]


def test_a_gateway_that_heartbeats_after_a_silence_is_alive_again():
    watch = GatewayWatch(grace_s=5, topic_ttl_s=60)
    watch.heartbeat(G1, now=0)
    watch.heartbeat(G1, now=100)
    assert watch.gone_topics([G1], set(), now=120) == []


def test_a_deleted_topic_that_shows_up_again_is_judged_from_then_on():
    watch = GatewayWatch(grace_s=5, topic_ttl_s=60)
    watch.heartbeat(G1, now=0)
    assert watch.gone_topics([G1], set(), now=100) == [G1]
    watch.deleted([G1])
    assert watch.gone_topics([], set(), now=110) == []
    assert watch.gone_topics([G1], set(), now=120) == [], "made again: listed at 120"
    assert watch.gone_topics([G1], set(), now=181) == [G1]


def test_a_topic_no_longer_listed_is_forgotten():
    watch = GatewayWatch(grace_s=5, topic_ttl_s=60)
    watch.gone_topics([G3], set(), now=0)
    watch.gone_topics([], set(), now=30)  # deleted by someone else
    assert watch.gone_topics([G3], set(), now=70) == [], "listed again at 70"


def test_ttl_zero_deletes_nothing_and_a_ttl_within_the_grace_is_refused():
    watch = GatewayWatch(grace_s=5, topic_ttl_s=0)
    watch.heartbeat(G1, now=0)
    assert watch.gone_topics([G1], set(), now=1e9) == []
    with pytest.raises(ValueError, match="longer than the resume grace"):
        GatewayWatch(grace_s=5, topic_ttl_s=5)


def test_only_the_scheduler_may_delete_delivery_topics():
    deleting = {user for user in GRANTS if allowed(user, Operation.DELETE, Resource.TOPIC, G1)}
    assert deleting == {"scheduler"}
    assert not allowed("scheduler", Operation.DELETE, Resource.TOPIC, "chat.tokens")


def test_a_heartbeat_is_news_of_now_while_it_is_younger_than_the_grace_or_a_few_seconds():
    assert GatewayWatch(grace_s=0, topic_ttl_s=60).fresh(sent_at=96, wall_now=100)
    assert not GatewayWatch(grace_s=0, topic_ttl_s=60).fresh(sent_at=90, wall_now=100)
    assert GatewayWatch(grace_s=15, topic_ttl_s=60).fresh(sent_at=90, wall_now=100)


def test_rate_limits_in_memory_are_flagged_as_one_gateway_s_own():
    assert "N times" in per_process("memory://")
    assert per_process("redis://redis:6379") is None

"""Streams whose gateway died and that nobody resumed (scheduler/gateways.py)."""

from __future__ import annotations

from scheduler.gateways import GatewayWatch
from schemas.events import GenerationRequest


def request(rid: str, reply_to: str = "chat.deliver.g1") -> GenerationRequest:
    return GenerationRequest(
        request_id=rid,
        conversation_id="c",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="free",
        model="tiny-random",
        messages=(),
        reply_to=reply_to,
    )


def test_a_silent_gateway_s_streams_are_abandoned_once_after_the_grace():
    watch = GatewayWatch(grace_s=5)
    watch.heartbeat("chat.deliver.g1", now=0)
    watch.heartbeat("chat.deliver.g2", now=0)
    streams = [request("a"), request("b", "chat.deliver.g2")]
    assert watch.abandoned(streams, now=4) == []
    watch.heartbeat("chat.deliver.g2", now=4)
    assert [r.request_id for r in watch.abandoned(streams, now=6)] == ["a"]
    assert watch.abandoned(streams, now=7) == [], "each stream once"


def test_a_resumed_stream_belongs_to_the_gateway_that_resumed_it():
    watch = GatewayWatch(grace_s=5)
    watch.heartbeat("chat.deliver.g1", now=0)
    watch.rerouted("a", "chat.deliver.g2")
    watch.heartbeat("chat.deliver.g2", now=9)
    assert watch.abandoned([request("a")], now=10) == []


def test_gateways_never_heard_from_are_not_judged_and_zero_grace_judges_nothing():
    assert GatewayWatch(grace_s=5).abandoned([request("a")], now=100) == []
    never = GatewayWatch(grace_s=0)
    never.heartbeat("chat.deliver.g1", now=0)
    assert never.abandoned([request("a")], now=100) == []


def test_only_the_gateway_relaying_a_stream_may_have_it_cancelled():
    watch = GatewayWatch(grace_s=5)
    assert watch.holds("chat.deliver.g1", "a", asked_through="chat.deliver.g1")
    assert not watch.holds("chat.deliver.g2", "a", asked_through="chat.deliver.g1")
    watch.rerouted("a", "chat.deliver.g2")  # resumed on g2
    assert not watch.holds("chat.deliver.g1", "a", asked_through="chat.deliver.g1")
    watch.rerouted("a", "chat.deliver.g1")  # and back on g1
    assert watch.holds("chat.deliver.g1", "a", asked_through="chat.deliver.g1")
    assert not watch.holds("chat.deliver.g2", "a", asked_through="chat.deliver.g1")
    assert watch.holds("chat.deliver.g9", "unknown", asked_through=None), (
        "a request unknown here: the cancel goes on (it may have finished anyway)"
    )


def test_the_requests_are_walked_once_per_gateway_death_not_once_per_decision():
    watch = GatewayWatch(grace_s=5)
    watch.heartbeat("chat.deliver.g1", now=0)
    watch.heartbeat("chat.deliver.g2", now=0)
    assert not watch.worth_walking(now=4), "nobody is silent"
    watch.heartbeat("chat.deliver.g2", now=5.5)
    assert watch.worth_walking(now=6), "g1 went silent"
    assert not watch.worth_walking(now=7), "the same silent set, walked a moment ago"
    assert watch.worth_walking(now=12), "g2 went silent too"
    assert not watch.worth_walking(now=13)
    assert watch.worth_walking(now=17.5), "a grace later, once more (a request read since)"
    watch.heartbeat("chat.deliver.g1", now=18)
    watch.heartbeat("chat.deliver.g2", now=18)
    assert not watch.worth_walking(now=19), "both are back"
    assert not GatewayWatch(grace_s=0).worth_walking(now=100)

"""FetchPace: a consumer with nothing to do fetches with the long wait; work brings the short one
back."""

import asyncio

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.fetch_pace import FetchPace, set_fetch_wait
from schemas import topics


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def batch(topic: str) -> dict[TopicPartition, list[ConsumerRecord]]:
    record = ConsumerRecord(topic, 0, 0, 0, 0, None, b"{}", None, 0, 2, [])
    return {TopicPartition(topic, 0): [record]}


def test_idle_after_a_quiet_spell_and_short_again_at_the_first_record():
    clock = Clock()
    pace = FetchPace(20, 250, idle_after_s=2.0, clock=clock)
    assert pace.polled({}) == 20
    clock.now = 1.9
    assert pace.polled({}) == 20
    clock.now = 2.0
    assert pace.polled({}) == 250
    assert pace.polled(batch(topics.TOKENS)) == 20
    clock.now = 3.9
    assert pace.polled({}) == 20


def test_heartbeats_and_status_are_no_work_but_a_busy_stage_is():
    clock = Clock()
    busy = False
    pace = FetchPace(20, 250, idle_after_s=1.0, busy=lambda: busy, clock=clock)
    pace.polled({})
    clock.now = 5.0
    for topic in (topics.WORKERS, topics.SCHEDULER, topics.CONTROL):
        assert pace.polled(batch(topic)) == 250
    busy = True
    assert pace.polled({}) == 20
    busy = False
    clock.now = 5.5
    assert pace.polled({}) == 20
    clock.now = 6.0
    assert pace.polled({}) == 250


def test_a_stage_says_which_topics_are_work():
    clock = Clock()
    pace = FetchPace(
        20,
        250,
        idle_after_s=1.0,
        clock=clock,
        wakes=lambda topic: topic.startswith(topics.REQUESTS_PREFIX),
    )
    pace.polled({})
    clock.now = 2.0
    assert pace.polled(batch(topics.TOKENS)) == 250
    assert pace.polled(batch(topics.requests_topic(topics.Tier.FREE))) == 20


async def test_the_wait_reaches_the_fetch_requests_aiokafka_builds():
    kafka = KafkaConfig("127.0.0.1:1", idle_fetch_wait_ms=250)
    consumer = kafka.consumer()
    assert consumer.pace is not None and consumer.pace.idle_ms == 250
    consumer._fetcher = type("Fetcher", (), {"_fetch_max_wait_ms": 20})()
    set_fetch_wait(consumer, 250)
    assert consumer._fetcher._fetch_max_wait_ms == 250
    assert KafkaConfig("127.0.0.1:1").consumer().pace is None  # 0: never longer
    await asyncio.sleep(0)


def test_aiokafka_builds_fetch_requests_from_the_attribute_set_here():
    # set_fetch_wait relies on aiokafka's Fetcher reading _fetch_max_wait_ms per request.
    import inspect

    from aiokafka.consumer.fetcher import Fetcher

    assert "self._fetch_max_wait_ms" in inspect.getsource(Fetcher._get_actions_per_node)


def test_a_loaded_stage_fetches_with_the_loaded_wait_and_short_again_below_it():
    clock = Clock()
    streams = 0
    pace = FetchPace(
        20, 250, idle_after_s=1.0, busy=lambda: streams, clock=clock, loaded_ms=50, loaded_at=32
    )
    streams = 31
    assert pace.polled({}) == 20
    streams = 32
    assert pace.polled({}) == 50
    streams = 1
    assert pace.polled({}) == 20
    streams = 0
    clock.now = 5.0
    assert pace.polled({}) == 250


def test_no_loaded_wait_unless_set_and_longer_than_the_busy_one():
    assert FetchPace(20, 250, 1.0, busy=lambda: 500).polled({}) == 20
    assert FetchPace(20, 250, 1.0, busy=lambda: 500, loaded_ms=10, loaded_at=1).polled({}) == 20
    assert FetchPace(20, 250, 1.0, busy=lambda: True, loaded_ms=50, loaded_at=2).polled({}) == 20


async def test_the_loaded_wait_alone_makes_a_paced_consumer():
    consumer = KafkaConfig("127.0.0.1:1", loaded_fetch_wait_ms=50, loaded_streams=8).consumer()
    assert consumer.pace is not None
    assert (consumer.pace.busy_ms, consumer.pace.idle_ms) == (20, 20)
    assert (consumer.pace.loaded_ms, consumer.pace.loaded_at) == (50, 8)


async def test_the_first_event_wait_alone_makes_a_paced_consumer():
    consumer = KafkaConfig("127.0.0.1:1", first_event_fetch_wait_ms=5).consumer()
    assert consumer.pace is not None and consumer.pace.eager_ms == 5
    assert (
        KafkaConfig("127.0.0.1:1", first_event_fetch_wait_ms=5).consumer(bulk=True).pace is None
    )  # nobody waits on a bulk consumer's first event


async def test_a_consumer_stops_fetching_partitions_and_resumes_them_with_the_short_wait():
    clock = Clock()
    consumer = KafkaConfig("127.0.0.1:1", idle_fetch_wait_ms=250).consumer()
    consumer.pace.clock = clock
    consumer._fetcher = type("Fetcher", (), {"_fetch_max_wait_ms": 250})()
    partitions = [TopicPartition(topics.CONTROL, 0), TopicPartition(topics.CONTROL, 1)]
    consumer.assign(partitions)
    consumer.pace.polled({})
    clock.now = 20.0
    assert consumer.pace.polled({}) == 250
    consumer.listen(partitions, on=False)
    assert consumer.paused() == set(partitions)
    consumer.listen(partitions, on=True)
    assert consumer.paused() == set()
    assert consumer._fetcher._fetch_max_wait_ms == 20
    assert consumer.pace.polled({}) == 20  # awake from now on, not idle


def test_a_stage_awaiting_a_first_event_fetches_eagerly_unless_loaded():
    streams, eager = 1, True
    pace = FetchPace(
        20,
        250,
        idle_after_s=1.0,
        busy=lambda: streams,
        eager=lambda _: eager,
        eager_ms=5,
        loaded_ms=50,
        loaded_at=32,
    )
    assert pace.polled({}) == 5
    eager = False
    assert pace.polled({}) == 20
    streams, eager = 40, True
    assert pace.polled({}) == 50
    assert FetchPace(20, 250, 1.0, eager=lambda _: True).polled({}) == 20  # no eager_ms: none


def test_a_stage_that_expects_a_first_event_fetches_eagerly_from_the_next_fetch():
    """The gateway queues a request: eager at once (a poll returns only with records, so at
    one stream at a time the first event itself would be the first poll to say so), awake
    if it was idle, and never shorter than the loaded wait under load."""
    clock, streams = Clock(), 1
    pace = FetchPace(
        20,
        250,
        idle_after_s=1.0,
        busy=lambda: streams,
        eager_ms=5,
        loaded_ms=50,
        loaded_at=32,
        clock=clock,
    )
    assert pace.expecting() == 5
    streams, clock.now = 0, 5.0
    assert pace.polled({}) == 250
    assert pace.expecting() == 5 and not pace.idle
    streams = 40
    assert pace.expecting() is None
    assert FetchPace(20, 250, 1.0).expecting() == 20  # no eager wait: the short one


async def test_expect_sets_the_wait_aiokafka_builds_the_next_fetch_with():
    consumer = KafkaConfig("127.0.0.1:1", first_event_fetch_wait_ms=5).consumer()
    consumer._fetcher = type("Fetcher", (), {"_fetch_max_wait_ms": 20})()
    consumer.busy_while(lambda: 1)
    consumer.expect()
    assert consumer._fetcher._fetch_max_wait_ms == 5

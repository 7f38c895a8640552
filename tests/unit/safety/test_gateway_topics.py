"""A delivery to a gateway topic that was deleted (its gateway gone) is dropped and
counted by the safety stage: the stored answer still ends normally on `chat.answers`
(where a gateway that resumed the stream reads it), and the gone topic is not asked
again for each later event (each ask can wait the producer's whole request timeout)."""

from __future__ import annotations

from aiokafka.errors import UnknownTopicOrPartitionError
from prometheus_client import REGISTRY

from bus.produce_failures import RecordRejected
from schemas import topics
from schemas.events import DeliveryDone, Delta
from tests.support.safety import RecordingPublisher, feed, stage_with

GONE = "chat.deliver.gw"  # the topic test_safety's streams are delivered to
DROPPED = "chatpipe:deliveries_dropped_total"


class GoneGatewayPublisher(RecordingPublisher):
    """The bus as it is once GONE was deleted, with topic auto-creation off."""

    def __init__(self) -> None:
        super().__init__()
        self.asked_gone = 0

    async def send(self, topic, event, key=None, partition=None):
        if topic == GONE:
            self.asked_gone += 1
            raise RecordRejected(topic, UnknownTopicOrPartitionError())
        await super().send(topic, event, key, partition)


async def test_deliveries_to_a_deleted_gateway_topic_are_dropped_the_answer_goes_on():
    stage, _ = stage_with()
    out = stage.runner.publisher = GoneGatewayPublisher()  # type: ignore[assignment]
    dropped_before = REGISTRY.get_sample_value(DROPPED) or 0
    await feed(stage, ["Hello ", "world"])
    answers = [event for topic, event in out.sent if topic == topics.ANSWERS]
    assert [type(e) for e in answers] == [Delta, Delta, DeliveryDone], answers
    assert out.asked_gone == 1, "a topic found gone is not asked again"
    assert (REGISTRY.get_sample_value(DROPPED) or 0) - dropped_before == 3

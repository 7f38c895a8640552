"""The producer's partitioner: Kafka's default placement, with the key hash cached."""

import os

from aiokafka.partitioner import DefaultPartitioner

from bus.clients import keyed_partition


def test_keyed_partition_places_keys_as_kafkas_default_partitioner():
    for partitions in ([0], [0, 1], list(range(8)), list(range(12))):
        for _ in range(300):
            key = os.urandom(16).hex().encode()
            assert keyed_partition(key, partitions, partitions) == DefaultPartitioner()(
                key, partitions, partitions)


def test_a_key_keeps_its_partition_and_no_key_goes_to_an_available_one():
    key = b"conversation-1"
    assert len({keyed_partition(key, [0, 1, 2, 3], [0, 1, 2, 3]) for _ in range(20)}) == 1
    assert {keyed_partition(None, [0, 1, 2, 3], [2]) for _ in range(20)} == {2}

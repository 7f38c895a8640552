"""The bus's access table (chatpipe/kafka_acls.py): who may write requests, token chunks and
deliveries, and the script the deployments run is the table's."""

from pathlib import Path

import pytest

from chatpipe.cli import STAGES
from chatpipe.kafka_acls import (
    ADMIN,
    GRANTS,
    Operation,
    Resource,
    allowed,
    password_variable,
    script,
)
from schemas import topics

ROOT = Path(__file__).resolve().parents[3]
R, W, C = Operation.READ, Operation.WRITE, Operation.CREATE
TOPIC = Resource.TOPIC
STAGE_USERS = tuple(GRANTS)


def who(operation: Operation, topic: str) -> set[str]:
    return {user for user in STAGE_USERS if allowed(user, operation, TOPIC, topic)}


def test_one_user_per_deployed_stage_and_none_is_the_admin():
    assert set(STAGE_USERS) == set(STAGES)
    assert ADMIN not in STAGE_USERS


@pytest.mark.parametrize("tier", list(topics.Tier))
def test_only_gateways_and_the_tools_stage_write_requests(tier):
    """The tools stage queues a server-tools turn's next round."""
    assert who(W, topics.requests_topic(tier)) == {"gateway", "tools"}
    assert who(R, topics.requests_topic(tier)) == {"scheduler"}


def test_the_safety_stage_asks_nothing_the_judge_is_the_gateways():
    """The judge checks input only, through the gateway's own client: the safety stage
    never writes a request nor makes a delivery topic."""
    assert not allowed("safety", W, TOPIC, topics.requests_topic(topics.Tier.FREE))
    assert not allowed("safety", C, TOPIC, topics.deliver_topic("safety-gw1", "a1b2c3"))


def test_token_chunks_come_from_workers_and_the_scheduler_only():
    """Workers write the chunks; the scheduler an attempt's start marker and the end of
    a request no worker served; the tools stage a server tool's result."""
    assert who(W, topics.TOKENS) == {"worker", "scheduler", "tools"}
    assert who(R, topics.TOKENS) == {"safety", "worker"}


def test_deliveries_are_written_by_safety_and_only_read_by_gateways():
    """Clients see text only after the safety stage; the scheduler's queue positions and
    a resuming gateway's reroute notice carry none."""
    delivery = topics.deliver_topic("gateway-7d4b9c-x2x5q", "a1b2c3")
    assert who(W, delivery) == {"safety", "scheduler", "gateway"}
    assert who(R, delivery) == {"gateway"}
    assert who(C, delivery) == {"gateway"}


@pytest.mark.parametrize(
    ("topic", "writers", "readers"),
    [
        (topics.WORK, {"scheduler"}, {"scheduler", "worker"}),
        (topics.WORKERS, {"worker"}, {"scheduler"}),
        (topics.USAGE, {"worker", "gateway"}, {"billing"}),  # gateway: response cache hits
        (topics.ANSWERS, {"gateway", "scheduler", "safety"}, {"gateway", "recorder"}),
        (topics.CONTROL, {"gateway", "scheduler", "safety"}, {"scheduler", "worker"}),
        (topics.SCHEDULER, {"scheduler"}, {"scheduler", "gateway"}),
        (topics.MODERATION, {"gateway", "safety"}, set()),
        (topics.ROLLOUT, set(), {"gateway"}),  # written by operators (`chatpipe rollout`)
        (topics.FEEDBACK, {"gateway"}, set()),
        (topics.DLQ, set(STAGES), set()),
    ],
)
def test_who_writes_and_reads_each_shared_topic(topic, writers, readers):
    assert who(W, topic) == writers
    assert who(R, topic) == readers


def test_no_stage_creates_shared_topics_but_every_stage_can_list_them():
    for topic in topics.shared_topics():
        assert who(C, topic) == set(), topic
        assert who(Operation.DESCRIBE, topic) == set(STAGES), topic


def test_consumer_groups_are_the_stages_own():
    from scheduler.shards import GROUP

    assert {u for u in STAGE_USERS if allowed(u, R, Resource.GROUP, GROUP)} == {"scheduler"}
    assert not allowed("worker", R, Resource.GROUP, "chatpipe-anything")


def test_tool_rounds_go_from_workers_to_the_tools_stage():
    assert who(W, topics.TOOLS) == {"worker"}
    assert who(R, topics.TOOLS) == {"tools"}


def test_the_deployed_script_is_generated_from_the_table():
    deployed = (ROOT / "k8s" / "kafka-acls.sh").read_text()
    assert deployed == script(), (
        "k8s/kafka-acls.sh is stale: python -m chatpipe.kafka_acls > k8s/kafka-acls.sh"
    )
    for user in STAGE_USERS:
        assert f'user {user} "${password_variable(user)}"' in deployed
    assert "--allow-principal" in deployed and "--deny-principal" not in deployed

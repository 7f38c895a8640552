"""Topic names: the one place they are spelled."""

from __future__ import annotations

from enum import StrEnum


class Tier(StrEnum):
    """Priority tiers, highest first when iterated."""

    ENTERPRISE = "enterprise"
    PRO = "pro"
    FREE = "free"

    @property
    def rank(self) -> int:
        """0 for the highest tier."""
        return list(Tier).index(self)


REQUESTS_PREFIX = "chat.requests."
WORK = "chat.work"
WORK_SHARD_PREFIX = "chat.work."
"""A scheduler shard's own journal: `chat.work.<shard>` (`work_topic`)."""
WORKERS = "chat.workers"
SCHEDULER = "chat.scheduler"
TOKENS = "chat.tokens"
ANSWERS = "chat.answers"
DELIVER_PREFIX = "chat.deliver."
CONTROL = "chat.control"
USAGE = "chat.usage"
MODERATION = "chat.moderation"
ROLLOUT = "chat.rollout"
FEEDBACK = "chat.feedback"
DLQ = "chat.dlq"
TOOLS = "chat.tools"
"""Server tool calls to run (`ToolRound`), keyed by conversation."""


def requests_topic(tier: Tier | str) -> str:
    return f"{REQUESTS_PREFIX}{Tier(tier).value}"


def request_topics() -> list[str]:
    return [requests_topic(tier) for tier in Tier]


def work_topic(shard: str = "") -> str:
    """The `chat.work` journal of a scheduler shard: `chat.work` for the unnamed one."""
    return f"{WORK_SHARD_PREFIX}{shard}" if shard else WORK


def deliver_topic(gateway_id: str, start: str) -> str:
    """A gateway's delivery topic for one process start (`start`, fresh each time): one
    started again under the same id reads none of what the last one was sent."""
    return f"{DELIVER_PREFIX}{gateway_id}.{start}"


def delivering_gateway(topic: str) -> str:
    """The gateway id of a delivery topic (`deliver_topic`)."""
    return topic.removeprefix(DELIVER_PREFIX).rpartition(".")[0]


def shared_topics() -> list[str]:
    """Every topic except the per-gateway delivery topics."""
    return [
        *request_topics(),
        WORK,
        WORKERS,
        SCHEDULER,
        TOKENS,
        ANSWERS,
        CONTROL,
        USAGE,
        MODERATION,
        ROLLOUT,
        FEEDBACK,
        DLQ,
        TOOLS,
    ]

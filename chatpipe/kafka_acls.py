"""Who may do what on the bus: one Kafka user per stage, and what each one may touch.

`GRANTS` is the one table: the topics each stage reads, writes and creates and the
consumer group it joins, taken from the stages' producers and consumers
(tests/integration/test_kafka_acls.py runs the stages and checks every topic they
really use against it). `python -m chatpipe.kafka_acls > k8s/kafka-acls.sh` writes the script the
deployments run as the Kafka admin once the broker is up (compose: `kafka-init`; k8s: the
topics Job's init container): it sets each stage's SCRAM password and adds its ACLs. The
broker denies everything else (`allow.everyone.if.no.acl.found=false`); only the admin
(the broker itself, topic creation) is a super user.
"""

from __future__ import annotations

import shlex
import sys
from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum

from billing.stage import GROUP as BILLING_GROUP
from recorder.stage import GROUP as RECORDER_GROUP
from safety.stage import GROUP as SAFETY_GROUP
from scheduler.shards import GROUP as SCHEDULER_GROUP
from schemas import topics
from servertools.stage import GROUP as TOOLS_GROUP
from workers.stage import GROUP as WORKER_GROUP

ADMIN = "admin"
"""The super user: the broker's own connections, topic creation, this script."""
MECHANISM = "SCRAM-SHA-512"
TOPICS_PREFIX = "chat."


class Operation(StrEnum):
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DESCRIBE = "Describe"
    DELETE = "Delete"


class Resource(StrEnum):
    TOPIC = "topic"
    GROUP = "group"


@dataclass(frozen=True)
class Grant:
    """One ACL: `operation` on the topic or group `name` (every name starting with it
    when `prefixed`)."""

    operation: Operation
    resource: Resource
    name: str
    prefixed: bool = False

    def covers(self, operation: Operation, resource: Resource, name: str) -> bool:
        if (operation, resource) != (self.operation, self.resource):
            return False
        return name.startswith(self.name) if self.prefixed else name == self.name


def reads(*names: str) -> tuple[Grant, ...]:
    return tuple(Grant(Operation.READ, Resource.TOPIC, name) for name in names)


def writes(*names: str) -> tuple[Grant, ...]:
    return tuple(Grant(Operation.WRITE, Resource.TOPIC, name) for name in names)


def on_prefix(prefix: str, *operations: Operation) -> tuple[Grant, ...]:
    return tuple(Grant(op, Resource.TOPIC, prefix, prefixed=True) for op in operations)


def joins(group: str, prefixed: bool = False) -> Grant:
    return Grant(Operation.READ, Resource.GROUP, group, prefixed=prefixed)


R, W, C = Operation.READ, Operation.WRITE, Operation.CREATE

EVERY_STAGE = on_prefix(TOPICS_PREFIX, Operation.DESCRIBE)
"""Topic metadata only (names, partitions): each stage lists the topics at start and
creates none when all are there."""

GRANTS: dict[str, tuple[Grant, ...]] = {
    "gateway": (
        *on_prefix(topics.REQUESTS_PREFIX, W),  # (and the tools stage: a turn's next round)
        # Its own delivery topic, made at start and named after the pod; a stream resumed
        # here tells the gateway that held it (on that one's delivery topic).
        *on_prefix(topics.DELIVER_PREFIX, R, W, C),
        *reads(topics.SCHEDULER, topics.ANSWERS, topics.ROLLOUT),  # model aliases' weights
        # chat.usage: an answer replayed from the response cache (gateway.cache.cached_pipeline)
        *writes(
            topics.ANSWERS,
            topics.CONTROL,
            topics.MODERATION,
            topics.USAGE,
            topics.FEEDBACK,
            topics.DLQ,
        ),
    ),
    "scheduler": (
        *on_prefix(topics.REQUESTS_PREFIX, R),
        *reads(topics.CONTROL, topics.WORKERS, topics.SCHEDULER, topics.WORK),
        *on_prefix(topics.WORK_SHARD_PREFIX, R, W),  # a scheduler shard's journal
        # Queue positions and routes go to the gateway holding the stream; an unserved
        # request's end and each attempt's start marker go on chat.tokens. It deletes
        # the delivery topics of gateways that are gone (scheduler.delivery_topics).
        *on_prefix(topics.DELIVER_PREFIX, W, Operation.DELETE),
        *writes(
            topics.SCHEDULER, topics.WORK, topics.TOKENS, topics.CONTROL, topics.ANSWERS, topics.DLQ
        ),
        joins(SCHEDULER_GROUP, prefixed=True),  # a shard's group: chatpipe-scheduler-<shard>
    ),
    "worker": (
        *reads(topics.WORK, topics.CONTROL, topics.TOKENS),  # chat.tokens: a resumed attempt
        *on_prefix(topics.WORK_SHARD_PREFIX, R),  # its model's scheduler shard's
        # chat.tools: a server-tools round that called tools, for the tools stage to run
        *writes(topics.TOKENS, topics.USAGE, topics.WORKERS, topics.TOOLS, topics.DLQ),
        joins(WORKER_GROUP, prefixed=True),  # a shard's workers: chatpipe-workers-<shard>
    ),
    "safety": (
        *reads(topics.TOKENS),
        *on_prefix(topics.DELIVER_PREFIX, W),  # what clients see, once checked
        *writes(topics.ANSWERS, topics.CONTROL, topics.MODERATION, topics.DLQ),
        joins(SAFETY_GROUP),
    ),
    "recorder": (*reads(topics.ANSWERS), *writes(topics.DLQ), joins(RECORDER_GROUP)),
    "billing": (*reads(topics.USAGE), *writes(topics.DLQ), joins(BILLING_GROUP)),
    "tools": (
        *reads(topics.TOOLS),
        # each call's result on the stream, then the turn's next round to the scheduler
        *on_prefix(topics.REQUESTS_PREFIX, W),
        *writes(topics.TOKENS, topics.DLQ),
        joins(TOOLS_GROUP),
    ),
}


def allowed(user: str, operation: Operation, resource: Resource, name: str) -> bool:
    """Whether the table lets `user` do `operation` on `name`."""
    grants = (*GRANTS.get(user, ()), *EVERY_STAGE)
    return user == ADMIN or any(g.covers(operation, resource, name) for g in grants)


def password_variable(user: str) -> str:
    """Where the deployments keep `user`'s password (compose `.env`, the init container)."""
    return f"KAFKA_{user.upper()}_PASSWORD"


def _acl_lines(user: str, grants: tuple[Grant, ...]) -> list[str]:
    """One kafka-acls call per resource, with every operation granted on it."""
    operations: dict[tuple[Resource, str, bool], list[Operation]] = defaultdict(list)
    for grant in grants:
        operations[grant.resource, grant.name, grant.prefixed].append(grant.operation)
    lines = []
    for (resource, name, prefixed), ops in operations.items():
        args = [
            user,
            *(a for op in ops for a in ("--operation", op.value)),
            f"--{resource.value}",
            name,
        ]
        if prefixed:
            args += ["--resource-pattern-type", "prefixed"]
        lines.append("allow " + shlex.join(args))
    return lines


# The admin's login, for the script's client config.
ADMIN_JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    f'username="{ADMIN}" password="$KAFKA_ADMIN_PASSWORD";'
)

SCRIPT_HEAD = f"""\
#!/bin/sh
# Generated from chatpipe/kafka_acls.py by
# `python -m chatpipe.kafka_acls > k8s/kafka-acls.sh`: change the table there, not this
# file (tests/unit/chatpipe/test_kafka_acls.py checks they agree).
#
# Run as the Kafka admin once the broker is up, in the apache/kafka image: sets each
# stage's SCRAM password (creating the user, or rotating it) and adds its ACLs. Safe to
# run again. Needs KAFKA_ADMIN_PASSWORD and {password_variable("<stage>")} for every stage;
# KAFKA_BOOTSTRAP (default kafka:9092). ACLs the table no longer has are not removed.
set -eu
bin=/opt/kafka/bin
server="${{KAFKA_BOOTSTRAP:-kafka:9092}}"
admin=$(mktemp)
trap 'rm -f "$admin"' EXIT
cat > "$admin" <<EOF
security.protocol=SASL_PLAINTEXT
sasl.mechanism={MECHANISM}
sasl.jaas.config={ADMIN_JAAS}
EOF

user() {{  # user NAME PASSWORD
  "$bin/kafka-configs.sh" --bootstrap-server "$server" --command-config "$admin" --alter \\
    --entity-type users --entity-name "$1" --add-config "{MECHANISM}=[password=$2]"
}}

allow() {{  # allow USER ACL-OPTIONS...
  principal="User:$1"; shift
  "$bin/kafka-acls.sh" --bootstrap-server "$server" --command-config "$admin" --add \\
    --allow-principal "$principal" "$@" > /dev/null
}}
"""


def script() -> str:
    """The shell script that provisions every stage's user and ACLs (see SCRIPT_HEAD)."""
    lines = [SCRIPT_HEAD]
    for user in GRANTS:
        lines.append(f'user {user} "${password_variable(user)}"')
    for user, grants in GRANTS.items():
        lines.append(f"\n# {user}")
        lines += _acl_lines(user, (*EVERY_STAGE, *grants))
    lines.append('echo "kafka users and ACLs of ' + ", ".join(GRANTS) + ' are in place"')
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(script())

"""Writes kafka-users.yaml, the Strimzi KafkaUsers, from chatpipe/kafka_acls.py's table:

python k8s/operators/kafka_users.py > k8s/operators/kafka-users.yaml
"""

from __future__ import annotations

import sys
from collections import defaultdict

from chatpipe.kafka_acls import ADMIN, EVERY_STAGE, GRANTS, Grant

HEAD = """\
# Generated from chatpipe/kafka_acls.py by `python k8s/operators/kafka_users.py >
# k8s/operators/kafka-users.yaml` (tests/unit/project/test_k8s_schemas.py checks they agree):
# every stage's Kafka user and ACLs for the Strimzi cluster (kafka.yaml here), in place
# of kafka-acls.sh. The User Operator sets each SCRAM password from the Secret the stage
# reads it from (chatpipe-kafka-<user>, docs/operating/deployment.md), so both
# deployments take the same Secrets.
"""


def kafka_user(user: str, grants: tuple[Grant, ...] | None) -> str:
    text = f"""\
apiVersion: kafka.strimzi.io/v1
kind: KafkaUser
metadata:
  name: {user}
  labels:
    strimzi.io/cluster: chatpipe
spec:
  authentication:
    type: scram-sha-512
    password:
      valueFrom:
        secretKeyRef:
          name: chatpipe-kafka-{user}
          key: password
"""
    if grants is None:  # a super user (kafka.yaml: superUsers)
        return text
    operations: dict[tuple[str, str, bool], list[str]] = defaultdict(list)
    for grant in grants:
        operations[grant.resource.value, grant.name, grant.prefixed].append(grant.operation.value)
    text += "  authorization:\n    type: simple\n    acls:\n"
    for (resource, name, prefixed), ops in operations.items():
        text += f"""\
      - resource:
          type: {resource}
          name: {name}
          patternType: {"prefix" if prefixed else "literal"}
        operations: [{", ".join(ops)}]
"""
    return text


def manifest() -> str:
    users = [kafka_user(ADMIN, None)]
    users += [kafka_user(user, (*EVERY_STAGE, *grants)) for user, grants in GRANTS.items()]
    return HEAD + "---\n".join(users)


if __name__ == "__main__":
    sys.stdout.write(manifest())

#!/bin/sh
# Generated from chatpipe/kafka_acls.py by
# `python -m chatpipe.kafka_acls > k8s/kafka-acls.sh`: change the table there, not this
# file (tests/unit/chatpipe/test_kafka_acls.py checks they agree).
#
# Run as the Kafka admin once the broker is up, in the apache/kafka image: sets each
# stage's SCRAM password (creating the user, or rotating it) and adds its ACLs. Safe to
# run again. Needs KAFKA_ADMIN_PASSWORD and KAFKA_<STAGE>_PASSWORD for every stage;
# KAFKA_BOOTSTRAP (default kafka:9092). ACLs the table no longer has are not removed.
set -eu
bin=/opt/kafka/bin
server="${KAFKA_BOOTSTRAP:-kafka:9092}"
admin=$(mktemp)
trap 'rm -f "$admin"' EXIT
cat > "$admin" <<EOF
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$KAFKA_ADMIN_PASSWORD";
EOF

user() {  # user NAME PASSWORD
  "$bin/kafka-configs.sh" --bootstrap-server "$server" --command-config "$admin" --alter \
    --entity-type users --entity-name "$1" --add-config "SCRAM-SHA-512=[password=$2]"
}

allow() {  # allow USER ACL-OPTIONS...
  principal="User:$1"; shift
  "$bin/kafka-acls.sh" --bootstrap-server "$server" --command-config "$admin" --add \
    --allow-principal "$principal" "$@" > /dev/null
}

user gateway "$KAFKA_GATEWAY_PASSWORD"
user scheduler "$KAFKA_SCHEDULER_PASSWORD"
user worker "$KAFKA_WORKER_PASSWORD"
user safety "$KAFKA_SAFETY_PASSWORD"
user recorder "$KAFKA_RECORDER_PASSWORD"
user billing "$KAFKA_BILLING_PASSWORD"
user tools "$KAFKA_TOOLS_PASSWORD"

# gateway
allow gateway --operation Describe --topic chat. --resource-pattern-type prefixed
allow gateway --operation Write --topic chat.requests. --resource-pattern-type prefixed
allow gateway --operation Read --operation Write --operation Create --topic chat.deliver. --resource-pattern-type prefixed
allow gateway --operation Read --topic chat.scheduler
allow gateway --operation Read --operation Write --topic chat.answers
allow gateway --operation Read --topic chat.rollout
allow gateway --operation Write --topic chat.control
allow gateway --operation Write --topic chat.moderation
allow gateway --operation Write --topic chat.usage
allow gateway --operation Write --topic chat.feedback
allow gateway --operation Write --topic chat.dlq

# scheduler
allow scheduler --operation Describe --topic chat. --resource-pattern-type prefixed
allow scheduler --operation Read --topic chat.requests. --resource-pattern-type prefixed
allow scheduler --operation Read --operation Write --topic chat.control
allow scheduler --operation Read --topic chat.workers
allow scheduler --operation Read --operation Write --topic chat.scheduler
allow scheduler --operation Read --operation Write --topic chat.work
allow scheduler --operation Read --operation Write --topic chat.work. --resource-pattern-type prefixed
allow scheduler --operation Write --operation Delete --topic chat.deliver. --resource-pattern-type prefixed
allow scheduler --operation Write --topic chat.tokens
allow scheduler --operation Write --topic chat.answers
allow scheduler --operation Write --topic chat.dlq
allow scheduler --operation Read --group chatpipe-scheduler --resource-pattern-type prefixed

# worker
allow worker --operation Describe --topic chat. --resource-pattern-type prefixed
allow worker --operation Read --topic chat.work
allow worker --operation Read --topic chat.control
allow worker --operation Read --operation Write --topic chat.tokens
allow worker --operation Read --topic chat.work. --resource-pattern-type prefixed
allow worker --operation Write --topic chat.usage
allow worker --operation Write --topic chat.workers
allow worker --operation Write --topic chat.tools
allow worker --operation Write --topic chat.dlq
allow worker --operation Read --group chatpipe-workers --resource-pattern-type prefixed

# safety
allow safety --operation Describe --topic chat. --resource-pattern-type prefixed
allow safety --operation Read --topic chat.tokens
allow safety --operation Write --topic chat.deliver. --resource-pattern-type prefixed
allow safety --operation Write --topic chat.answers
allow safety --operation Write --topic chat.control
allow safety --operation Write --topic chat.moderation
allow safety --operation Write --topic chat.dlq
allow safety --operation Read --group chatpipe-safety

# recorder
allow recorder --operation Describe --topic chat. --resource-pattern-type prefixed
allow recorder --operation Read --topic chat.answers
allow recorder --operation Write --topic chat.dlq
allow recorder --operation Read --group chatpipe-recorder

# billing
allow billing --operation Describe --topic chat. --resource-pattern-type prefixed
allow billing --operation Read --topic chat.usage
allow billing --operation Write --topic chat.dlq
allow billing --operation Read --group chatpipe-billing

# tools
allow tools --operation Describe --topic chat. --resource-pattern-type prefixed
allow tools --operation Read --topic chat.tools
allow tools --operation Write --topic chat.requests. --resource-pattern-type prefixed
allow tools --operation Write --topic chat.tokens
allow tools --operation Write --topic chat.dlq
allow tools --operation Read --group chatpipe-tools
echo "kafka users and ACLs of gateway, scheduler, worker, safety, recorder, billing, tools are in place"

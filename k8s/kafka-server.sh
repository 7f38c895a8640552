#!/bin/sh
# Starts the single Apache Kafka node (KRaft: broker and controller in one process) with
# SASL/SCRAM and ACLs, for docker-compose.yml and k8s/kafka.yaml (apache/kafka image).
#
# Clients authenticate with SCRAM-SHA-512 on SASL_PLAINTEXT: credentials are checked, but
# traffic is not encrypted, so the broker must stay on a private network (the compose
# network, the cluster's pod network) — put TLS in front (SASL_SSL) before it leaves one.
# The controller listens on the pod's loopback only (PLAIN, the admin's password).
# Nothing is allowed without an ACL; the admin is the only super user. The admin's SCRAM
# credential is written when the storage is first formatted (the broker needs it before it
# can take connections); every stage's user and ACLs come from kafka-acls.sh afterwards.
#
# Environment: CLUSTER_ID, KAFKA_ADMIN_PASSWORD (hex: it goes into JAAS and SCRAM
# configs unquoted), KAFKA_ADVERTISED_HOST, KAFKA_LOG_DIRS, KAFKA_HEAP_OPTS.
set -eu
: "${CLUSTER_ID:?}" "${KAFKA_ADMIN_PASSWORD:?}" "${KAFKA_ADVERTISED_HOST:?}" "${KAFKA_LOG_DIRS:?}"
config=/opt/kafka/config/chatpipe-server.properties
admin=/opt/kafka/config/chatpipe-admin.properties
umask 077

cat > "$config" <<EOF
node.id=1
process.roles=broker,controller
controller.quorum.voters=1@localhost:9093
controller.listener.names=CONTROLLER
listeners=BROKER://:9092,CONTROLLER://localhost:9093
advertised.listeners=BROKER://$KAFKA_ADVERTISED_HOST:9092
listener.security.protocol.map=BROKER:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT
inter.broker.listener.name=BROKER
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.broker.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.broker.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$KAFKA_ADMIN_PASSWORD";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$KAFKA_ADMIN_PASSWORD" user_admin="$KAFKA_ADMIN_PASSWORD";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin
log.dirs=$KAFKA_LOG_DIRS
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
# Stages create every topic explicitly (the topics step, each gateway its own delivery
# topic); an auto-created topic would get the wrong partition count.
auto.create.topics.enable=false
# Producers send up to 8 MiB (a rendered prompt can be large); default is 1 MiB.
message.max.bytes=9437184
# Consumer groups form at once instead of waiting 3 s for more members.
group.initial.rebalance.delay.ms=0
EOF

# For the readiness probe and an operator's kafka-*.sh --command-config.
cat > "$admin" <<EOF
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$KAFKA_ADMIN_PASSWORD";
EOF

/opt/kafka/bin/kafka-storage.sh format --ignore-formatted --cluster-id "$CLUSTER_ID" \
  --config "$config" --add-scram "SCRAM-SHA-512=[name=admin,password=$KAFKA_ADMIN_PASSWORD]"
exec /opt/kafka/bin/kafka-server-start.sh "$config"

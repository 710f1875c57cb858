#!/usr/bin/env bash
# Run a real Apache Kafka broker (KRaft, combined broker+controller, one node) for CI
# without Docker: jars come from Maven Central through Maven, the broker runs on the
# local JVM (Java 17+) on 127.0.0.1.
#
# Kafka version: 4.4.0 (org.apache.kafka:kafka_2.13 + kafka-tools 4.4.0, log4j2 2.25.5).
# Override with KAFKA_VERSION; 4.x and 3.9.x are supported (3.9 uses log4j 1 / reload4j).
#
# Usage: scripts/kafka.sh start|stop|status|restart [--keep-data] [--secure]
#        scripts/kafka.sh acl-spec        print the principals' ACLs (no broker needed)
#        scripts/kafka.sh apply-acls      SCRAM users + ACLs on a running broker (compose)
#        scripts/kafka.sh certs DIR       CA + broker certificate for docker-compose.yml
#
# By default every start begins with empty storage and stop deletes it (tests start
# from a clean broker). With --keep-data, stop leaves the log dirs and metadata in
# place and start reuses them (a durable restart: topics, records, committed offsets
# and consumer groups survive), formatting only when there is nothing to keep.
#
# Environment (defaults):
#   KAFKA_VERSION=4.4.0
#   KAFKA_PORT=19092              client listener      PLAINTEXT://127.0.0.1:$KAFKA_PORT
#   KAFKA_CONTROLLER_PORT=19093   KRaft controller     CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
#   KAFKA_HOME_DIR=/tmp/stepguard-kafka   state dir: jars, config, data, logs, pid file
#   KAFKA_LIBS_DIR=$KAFKA_HOME_DIR/libs-$KAFKA_VERSION   the jars (share one between brokers)
#   KAFKA_HEAP_OPTS="-Xms256m -Xmx512m"
#   KAFKA_START_TIMEOUT=90        seconds to wait for the broker to answer
#   KAFKA_BIN_DIR=/opt/kafka/bin  apply-acls uses Kafka's scripts there when present
#                                 (the apache/kafka image), else the jars
#
# Layout under $KAFKA_HOME_DIR:
#   fetch-<ver>/pom.xml   generated pom (Maven caches the jars in ~/.m2)
#   libs-<ver>/           copied jars (kept across stop/start, so a warm start skips Maven)
#   config/               server.properties, log4j configs, tools client config
#   data/                 log.dirs + metadata (removed by stop unless --keep-data)
#   logs/                 server.log, kafka.out (stdout/stderr), fetch log
#   kafka.pid
#
# `start` prints KAFKA_BOOTSTRAP=127.0.0.1:<port> as its last line.
#
# --secure: SASL_SSL (SCRAM-SHA-512) on the client listener, mutual TLS on the
# controller listener, StandardAuthorizer with ACLs (nothing is allowed unless an ACL
# says so), one principal per stepguard service (see `acl-spec` and docs/kafka-acls.md).
# Every start makes a fresh private folder (mktemp -d, mode 700) holding a new CA and
# broker certificate (openssl, EC P-256, SAN 127.0.0.1/localhost), random passwords,
# the broker's config, and one env file per principal (<principal>.env, mode 600, the
# STEPGUARD_KAFKA_* settings of that service). SCRAM users are created when the
# storage is formatted, ACLs through the Admin API as the super user `admin`; no
# password ever appears on a command line (java reads its arguments from a file in the
# private folder). stop removes the folder. `start --secure` prints
# KAFKA_SECURE_DIR=<folder> before KAFKA_BOOTSTRAP. ACLs name the topics of
#   KAFKA_ACL_TOPIC_PREFIX=${STEPGUARD_TOPIC_PREFIX:-}   and consumer groups of
#   KAFKA_ACL_GROUP=${STEPGUARD_CONSUMER_GROUP:-stepguard}
# --keep-data is not supported with --secure.
#
# The state dir is trusted only if it is a real directory (not a link) owned by this
# user and writable by nobody else; a missing one is created with mode 700.
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
KAFKA_PORT="${KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-19093}"
KAFKA_HOME_DIR="${KAFKA_HOME_DIR:-/tmp/stepguard-kafka}"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
KAFKA_BIN_DIR="${KAFKA_BIN_DIR:-/opt/kafka/bin}"

LOG4J2_VERSION="2.25.5"            # matches what kafka-server 4.4.0 brings
DEP_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.6.1"

KAFKA_ACL_TOPIC_PREFIX="${KAFKA_ACL_TOPIC_PREFIX:-${STEPGUARD_TOPIC_PREFIX:-}}"
KAFKA_ACL_GROUP="${KAFKA_ACL_GROUP:-${STEPGUARD_CONSUMER_GROUP:-stepguard}}"

STATE="$KAFKA_HOME_DIR"
LIBS="${KAFKA_LIBS_DIR:-$STATE/libs-$KAFKA_VERSION}"
KEEP_DATA=0
SECURE=0
SECURE_DIR=""             # the private folder of a --secure broker (see load_secure_dir)
SECURE_REF="$STATE/secure-dir"   # holds that folder's path while the broker runs
FETCH="$STATE/fetch-$KAFKA_VERSION"
CONF="$STATE/config"
DATA="$STATE/data"
LOGS="$STATE/logs"
PIDFILE="$STATE/kafka.pid"
BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
MAJOR="${KAFKA_VERSION%%.*}"

log() { echo "kafka.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- helpers

# pid of our running broker, or nothing. Checks the command line so a stale pid file
# that now points at some other process is never trusted.
running_pid() {
  [[ -f "$PIDFILE" ]] || return 0
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  local cmdline
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  if [[ "$cmdline" == *"kafka.Kafka $CONF/server.properties"* ]] ||
     [[ -n "$SECURE_DIR" && "$cmdline" == *"kafka.Kafka $SECURE_DIR/server.properties"* ]]; then
    echo "$pid"
  fi
}

# A directory is trusted only when it is ours: a real directory (not a symlink), owned
# by this user, writable by nobody else. Anyone could have made /tmp/<name> first.
check_private_dir() {
  local dir="$1" owner mode
  [[ -L "$dir" ]] && die "$dir is a symbolic link: refusing to use it"
  [[ -d "$dir" ]] || die "$dir is not a directory"
  owner="$(stat -c %u "$dir")"
  [[ "$owner" == "$(id -u)" ]] || die "$dir belongs to uid $owner, not to us: refusing to use it"
  mode="$(stat -c %a "$dir")"
  (( (8#$mode & 8#022) == 0 )) || die "$dir is writable by others (mode $mode): refusing to use it"
}

# The state dir: created private when missing, checked when it exists.
ensure_state_dir() {
  if [[ -e "$STATE" || -L "$STATE" ]]; then
    check_private_dir "$STATE"
  else
    mkdir -p "$(dirname "$STATE")"
    mkdir -m 700 "$STATE"
  fi
}

# SECURE_DIR from the reference a --secure start left, if it is still a private folder
# of ours (mode 700); a reference to anything else is ignored, never followed.
load_secure_dir() {
  SECURE_DIR=""
  [[ -f "$SECURE_REF" && ! -L "$SECURE_REF" ]] || return 0
  local dir
  dir="$(head -n 1 "$SECURE_REF")"
  [[ "$dir" == /* && -d "$dir" && ! -L "$dir" ]] || return 0
  [[ "$(stat -c %u "$dir")" == "$(id -u)" && "$(stat -c %a "$dir")" == 700 ]] || return 0
  [[ -f "$dir/.stepguard-kafka-secure" ]] || return 0
  SECURE_DIR="$dir"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

classpath() { echo "$LIBS/*"; }

# Run a Kafka CLI class quietly (tool logging goes to stderr at WARN).
kafka_tool() {
  local cls="$1"; shift
  java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    "${TOOL_LOG_OPTS[@]}" -cp "$(classpath)" "$cls" "$@"
}

print_log_tail() {
  local f
  for f in "$LOGS/kafka.out" "$LOGS/server.log"; do
    if [[ -s "$f" ]]; then
      echo "----- last 60 lines of $f -----" >&2
      tail -n 60 "$f" >&2
    fi
  done
}

# ---------------------------------------------------------------- fetch

fetch_jars() {
  if [[ -f "$LIBS/.complete" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (needed once to fetch the Kafka jars)"
  mkdir -p "$FETCH" "$LOGS"
  local logging_deps
  if [[ "$MAJOR" -ge 4 ]]; then
    # kafka-server brings log4j-api/core; the slf4j (1.7) binding is not a dependency.
    logging_deps="
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J2_VERSION</version></dependency>"
  else
    logging_deps="
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>"
  fi
  cat >"$FETCH/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by scripts/kafka.sh: only used to fetch the broker's jars -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.stepguard</groupId>
  <artifactId>kafka-broker-jars</artifactId>
  <version>$KAFKA_VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version></dependency>$logging_deps
  </dependencies>
</project>
EOF
  log "fetching Kafka $KAFKA_VERSION jars with Maven (cached in ~/.m2) ..."
  rm -rf "$LIBS.tmp"
  if ! mvn -B -q -f "$FETCH/pom.xml" "$DEP_PLUGIN:copy-dependencies" \
      -DincludeScope=runtime -DoutputDirectory="$LIBS.tmp" >"$LOGS/fetch.log" 2>&1; then
    tail -n 40 "$LOGS/fetch.log" >&2
    die "Maven could not fetch Kafka $KAFKA_VERSION (full log: $LOGS/fetch.log)"
  fi
  [[ -f "$LIBS.tmp/kafka_2.13-$KAFKA_VERSION.jar" ]] || die "kafka_2.13-$KAFKA_VERSION.jar missing after fetch"
  touch "$LIBS.tmp/.complete"
  rm -rf "$LIBS"
  mv "$LIBS.tmp" "$LIBS"
}

# ---------------------------------------------------------------- config

write_config() {
  mkdir -p "$CONF" "$LOGS"
  cat >"$CONF/server.properties" <<EOF
# generated by scripts/kafka.sh (Kafka $KAFKA_VERSION, KRaft combined mode)
node.id=1
process.roles=broker,controller
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
# dynamic quorum (KIP-853), storage formatted with --standalone
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
log.dirs=$DATA/kafka-logs
metadata.log.dir=$DATA/metadata
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=24
log.segment.bytes=104857600
EOF

  if [[ "$MAJOR" -ge 4 ]]; then
    cat >"$CONF/log4j2.properties" <<EOF
# broker logging: everything to $LOGS/server.log, nothing on the console
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $LOGS/server.log
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
    cat >"$CONF/tools-log4j2.properties" <<'EOF'
status = error
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
    BROKER_LOG_OPTS=(-Dlog4j2.configurationFile="$CONF/log4j2.properties")
    TOOL_LOG_OPTS=(-Dlog4j2.configurationFile="$CONF/tools-log4j2.properties")
  else
    cat >"$CONF/log4j.properties" <<EOF
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$LOGS/server.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
EOF
    cat >"$CONF/tools-log4j.properties" <<'EOF'
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
    BROKER_LOG_OPTS=(-Dlog4j.configuration="file:$CONF/log4j.properties")
    TOOL_LOG_OPTS=(-Dlog4j.configuration="file:$CONF/tools-log4j.properties")
  fi

  cat >"$CONF/tools-client.properties" <<'EOF'
request.timeout.ms=5000
default.api.timeout.ms=10000
EOF
}

set_log_opts() {
  if [[ "$MAJOR" -ge 4 ]]; then
    TOOL_LOG_OPTS=(-Dlog4j2.configurationFile="$CONF/tools-log4j2.properties")
  else
    TOOL_LOG_OPTS=(-Dlog4j.configuration="file:$CONF/tools-log4j.properties")
  fi
}

# Kafka cluster ids are 16 random bytes, base64url without padding (22 chars). One in 64
# starts with '-', which the storage tool reads as an option ("--cluster-id: expected one
# argument"): drawn again then, as Kafka's own Uuid.randomUuid() does.
random_cluster_id() {
  local cid
  while :; do
    cid=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    [[ $cid == -* ]] || break
  done
  printf '%s' "$cid"
}

# ---------------------------------------------------------------- secure mode

# One principal per service; `admin` is the super user (topics, ACLs, inter-broker).
PRINCIPALS=(exporter simulator worker actuator executor listener operator archiver alertmanager)

# Who may do what: "principal resource-type pattern-type name operations", one line per
# principal and resource. The trust table of docs/kafka-acls.md, spelled for Kafka.
# READ and WRITE imply DESCRIBE. Nothing else is allowed (no ACL means denied).
acl_spec() {
  local t="${KAFKA_ACL_TOPIC_PREFIX}stepguard." g="$KAFKA_ACL_GROUP" who ops topic
  allow() {
    who="$1" ops="$2"
    shift 2
    for topic in "$@"; do echo "User:$who TOPIC LITERAL $t$topic $ops"; done
  }
  # exporters (training ranks, node agents): telemetry in, nothing read
  allow exporter WRITE steps health lifecycle
  # the simulator plays exporters and writes the ground truth
  allow simulator WRITE steps health lifecycle truth
  # the worker: telemetry, commands and results in; signed alerts and dead letters out;
  # its own internal topics (the jobs topic; the table changelog and Faust's leader
  # topic, both named after its app id) and its consumer group
  allow worker READ steps health lifecycle commands results control
  allow worker WRITE decisions deadletter
  echo "User:worker TOPIC LITERAL ${t}steps.worker-jobs.$g READ,WRITE,CREATE"
  echo "User:worker TOPIC PREFIXED $g.worker- READ,WRITE,CREATE,DESCRIBE_CONFIGS,ALTER_CONFIGS"
  echo "User:worker GROUP LITERAL $g.worker READ"
  # the actuator: alerts, approvals and control in; commands, action records and its
  # own guardrail alerts out; reads back commands, actions, control and results
  allow actuator READ decisions approvals control commands actions results
  allow actuator WRITE decisions commands actions acks deadletter
  echo "User:actuator GROUP LITERAL $g.actuator READ"
  # executors: commands in, results out (each executor its own group)
  allow executor READ commands results
  allow executor WRITE results deadletter
  echo "User:executor GROUP PREFIXED $g.executor. READ"
  # the training-side command listener: commands in; results and job events out
  allow listener READ commands results
  allow listener WRITE results lifecycle
  # operators (stepguard approve/reject/control/pending)
  allow operator WRITE approvals control
  allow operator READ actions acks
  # the archiver reads everything and writes dead letters
  allow archiver READ steps health truth decisions commands results lifecycle approvals \
    control actions acks deadletter
  allow archiver WRITE deadletter
  echo "User:archiver GROUP LITERAL $g.archiver READ"
  # the Alertmanager bridge (stepguard alertmanager): alerts in, dead letters out
  allow alertmanager READ decisions
  allow alertmanager WRITE deadletter
  echo "User:alertmanager GROUP LITERAL $g.alertmanager READ"
}

random_secret() { head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32; }

# A CA (ca.pem, ca.key) and a broker certificate for subjectAltName $2, in folder $1:
# broker.pem is Kafka's PEM key store (PKCS#8 key, certificate, CA), CN=stepguard-broker
# (the broker's principal on the mutual-TLS controller listener).
make_certs() {
  local dir="$1" san="$2"
  (
    umask 077
    cd "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \
      -subj "/CN=stepguard-kafka-ca" -keyout ca.key -out ca.pem >/dev/null 2>&1
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -subj "/CN=stepguard-broker" -keyout broker.key -out broker.csr >/dev/null 2>&1
    printf '%s\n' "subjectAltName=$san" "extendedKeyUsage=serverAuth,clientAuth" >broker.ext
    openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 365 \
      -extfile broker.ext -out broker.crt >/dev/null 2>&1
    openssl pkcs8 -topk8 -nocrypt -in broker.key -out broker.pk8
    cat broker.pk8 broker.crt ca.pem >broker.pem
    rm -f broker.csr broker.ext broker.key broker.pk8 broker.crt ca.srl
  )
}

# certs DIR: the TLS material of docker-compose.yml's broker (SAN kafka, localhost) in
# a new folder DIR (which must not exist: an existing folder is never trusted).
cmd_certs() {
  local dir="${1:?usage: $0 certs DIR}"
  command -v openssl >/dev/null || die "openssl not found"
  [[ -e "$dir" || -L "$dir" ]] && die "$dir exists: give a new folder"
  mkdir -m 700 "$dir"
  make_certs "$dir" "DNS:kafka,DNS:localhost,IP:127.0.0.1" || die "openssl failed"
  # the apache/kafka image runs as uid 1000 (appuser): it must read the key store
  chmod 640 "$dir/broker.pem"
  chmod 644 "$dir/ca.pem"
  log "CA and broker certificate in $dir (keep ca.key offline; mount broker.pem and ca.pem)"
}

# A fresh private folder with a CA, a broker certificate, passwords, the broker config,
# the admin's client config and an env file per principal. Sets SECURE_DIR.
make_secure_dir() {
  command -v openssl >/dev/null || die "openssl not found (needed for --secure)"
  local dir
  dir="$(mktemp -d "${TMPDIR:-/tmp}/stepguard-kafka-secure.XXXXXXXX")"
  chmod 700 "$dir"
  make_certs "$dir" "IP:127.0.0.1,DNS:localhost" || {
    rm -rf "$dir"
    die "openssl could not make the certificates"
  }
  rm -f "$dir/ca.key"  # this broker's certificate is the only one it will ever sign
  touch "$dir/.stepguard-kafka-secure"
  SECURE_DIR="$dir"
  echo "$dir" >"$SECURE_REF"
  local who
  for who in admin "${PRINCIPALS[@]}"; do
    (umask 077; random_secret >"$dir/$who.password")
  done
}

password_of() { cat "$SECURE_DIR/$1.password"; }

write_secure_config() {
  local d="$SECURE_DIR" admin_pw
  admin_pw="$(password_of admin)"
  (
    umask 077
    cp "$CONF/server.properties" "$d/server.properties"
    # replace the plaintext listeners; everything else as in the plain broker
    sed -i -e '/^listeners=/d' -e '/^advertised.listeners=/d' \
      -e '/^listener.security.protocol.map=/d' -e '/^inter.broker.listener.name=/d' \
      -e '/^auto.create.topics.enable=/d' "$d/server.properties"
    cat >>"$d/server.properties" <<EOF
# --secure: SASL_SSL (SCRAM-SHA-512) for clients and between brokers, mutual TLS for
# the controller, ACLs enforced by StandardAuthorizer
listeners=SASL_SSL://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=SASL_SSL://127.0.0.1:$KAFKA_PORT
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
listener.name.controller.ssl.client.auth=required
ssl.keystore.type=PEM
ssl.keystore.location=$d/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=$d/ca.pem
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:CN=stepguard-broker
auto.create.topics.enable=false
EOF
    cat >"$d/admin.properties" <<EOF
bootstrap.servers=$BOOTSTRAP
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
ssl.truststore.type=PEM
ssl.truststore.location=$d/ca.pem
request.timeout.ms=5000
default.api.timeout.ms=10000
EOF
    local who
    for who in admin "${PRINCIPALS[@]}"; do
      cat >"$d/$who.env" <<EOF
STEPGUARD_KAFKA_BOOTSTRAP=$BOOTSTRAP
STEPGUARD_BROKER_FLAVOR=kafka
STEPGUARD_KAFKA_SECURITY_PROTOCOL=SASL_SSL
STEPGUARD_KAFKA_SASL_MECHANISM=SCRAM-SHA-512
STEPGUARD_KAFKA_SASL_USERNAME=$who
STEPGUARD_KAFKA_SASL_PASSWORD=$(password_of "$who")
STEPGUARD_KAFKA_SSL_CAFILE=$d/ca.pem
STEPGUARD_TOPIC_PREFIX=$KAFKA_ACL_TOPIC_PREFIX
STEPGUARD_CONSUMER_GROUP=$KAFKA_ACL_GROUP
EOF
    done
  )
}

# Format the storage with every principal's SCRAM credential (KIP-900). The arguments,
# passwords included, go through a java @argfile in the private folder: never argv.
format_secure() {
  local args="$SECURE_DIR/format.args" cid who
  cid="$(random_cluster_id)"
  (
    umask 077
    {
      printf '%s\n' -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 "${TOOL_LOG_OPTS[@]}" \
        -cp "$(classpath)" kafka.tools.StorageTool format --cluster-id "$cid" \
        --config "$SECURE_DIR/server.properties" --standalone
      for who in admin "${PRINCIPALS[@]}"; do
        printf '%s\n' --add-scram "SCRAM-SHA-512=[name=$who,password=$(password_of "$who")]"
      done
    } >"$args"
  )
  local rc=0
  java "@$args" >"$LOGS/format.log" 2>&1 || rc=$?
  rm -f "$args"
  if [[ $rc != 0 ]]; then
    cat "$LOGS/format.log" >&2
    die "formatting the storage failed"
  fi
}

# Create the ACLs of acl_spec through the Admin API, as admin, in one JVM (a tiny Java
# program run from source: one start instead of one kafka-acls per line).
create_acls() {
  local d="$SECURE_DIR"
  acl_spec >"$d/acls.txt"
  cat >"$d/StepguardAcls.java" <<'EOF'
import java.io.Reader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

/** Reads "principal resource-type pattern-type name op,op,..." lines; allows each. */
public class StepguardAcls {
  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    try (Reader r = Files.newBufferedReader(Path.of(args[0]))) { props.load(r); }
    List<AclBinding> acls = new ArrayList<>();
    for (String line : Files.readAllLines(Path.of(args[1]))) {
      String[] f = line.strip().split("\\s+");
      if (f.length != 5) throw new IllegalArgumentException("bad ACL line: " + line);
      ResourcePattern pattern = new ResourcePattern(
          ResourceType.fromString(f[1]), f[3], PatternType.fromString(f[2]));
      for (String op : f[4].split(",")) {
        AclOperation operation = AclOperation.fromString(op);
        if (operation == AclOperation.UNKNOWN) throw new IllegalArgumentException("bad operation: " + op);
        acls.add(new AclBinding(pattern, new AccessControlEntry(
            f[0], "*", operation, AclPermissionType.ALLOW)));
      }
    }
    try (Admin admin = Admin.create(props)) {
      admin.createAcls(acls).all().get();
    }
    System.out.println(acls.size());
  }
}
EOF
  local n
  if ! n="$(java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 "${TOOL_LOG_OPTS[@]}" \
      -cp "$(classpath)" "$d/StepguardAcls.java" "$d/admin.properties" "$d/acls.txt" \
      2>"$LOGS/acls.log")"; then
    cat "$LOGS/acls.log" >&2
    return 1
  fi
  log "created $n ACLs for ${#PRINCIPALS[@]} principals (topics ${KAFKA_ACL_TOPIC_PREFIX}stepguard.*, groups $KAFKA_ACL_GROUP.*)"
}

# Kafka's own tools: its bin scripts where they exist (the apache/kafka image), else
# the same main classes from the jars.
kafka_cli() {
  local name="$1"
  shift
  if [[ -x "$KAFKA_BIN_DIR/$name.sh" ]]; then
    "$KAFKA_BIN_DIR/$name.sh" "$@"
    return
  fi
  [[ -f "$LIBS/.complete" ]] || die "no $KAFKA_BIN_DIR/$name.sh and no jars in $LIBS"
  set_log_opts
  case "$name" in
    kafka-acls) kafka_tool org.apache.kafka.tools.AclCommand "$@" ;;
    kafka-configs) kafka_tool org.apache.kafka.tools.ConfigCommand "$@" ;;
    *) die "unknown tool $name" ;;
  esac
}

# DESCRIBE_CONFIGS -> DescribeConfigs (how kafka-acls spells operations)
pascal_case() {
  local out="" word words
  IFS=_ read -ra words <<<"${1,,}"
  for word in "${words[@]}"; do out+="${word^}"; done
  echo "$out"
}

# apply-acls: on a running broker with SASL_SSL and an authorizer (docker-compose's
# kafka-init), create each principal's SCRAM-SHA-512 credential and the ACLs of
# acl_spec, as an admin. Needs KAFKA_BOOTSTRAP_SERVERS, KAFKA_ADMIN_CONFIG (the admin's
# client properties) and KAFKA_PASSWORD_<PRINCIPAL> (e.g. KAFKA_PASSWORD_WORKER) for
# every principal.
cmd_apply_acls() {
  : "${KAFKA_BOOTSTRAP_SERVERS:?set KAFKA_BOOTSTRAP_SERVERS}"
  : "${KAFKA_ADMIN_CONFIG:?set KAFKA_ADMIN_CONFIG (the admin client properties)}"
  local who var pw
  for who in "${PRINCIPALS[@]}"; do
    var="KAFKA_PASSWORD_${who^^}"
    [[ -n "${!var:-}" ]] || die "$var is not set (the SCRAM password of principal $who)"
  done
  local admin=(--bootstrap-server "$KAFKA_BOOTSTRAP_SERVERS" --command-config "$KAFKA_ADMIN_CONFIG")
  for who in "${PRINCIPALS[@]}"; do
    var="KAFKA_PASSWORD_${who^^}"
    pw="${!var}"
    # kafka-configs takes SCRAM passwords on its command line only (its
    # --add-config-file refuses SCRAM-SHA-512): run this where nobody else can see argv
    # (the one-shot kafka-init container), never on a shared host
    kafka_cli kafka-configs "${admin[@]}" --alter --entity-type users --entity-name "$who" \
      --add-config "SCRAM-SHA-512=[password=$pw]" >/dev/null ||
      die "could not set the SCRAM credential of $who"
  done
  # one kafka-acls per principal, resource kind and operations (all its names at once)
  local principal rtype ptype ops names n args op
  while read -r principal rtype ptype ops names; do
    args=("${admin[@]}" --add --allow-principal "$principal" --resource-pattern-type "${ptype,,}")
    for op in ${ops//,/ }; do args+=(--operation "$(pascal_case "$op")"); done
    for n in $names; do
      case "$rtype" in
        TOPIC) args+=(--topic "$n") ;;
        GROUP) args+=(--group "$n") ;;
        *) die "unknown resource type $rtype" ;;
      esac
    done
    kafka_cli kafka-acls "${args[@]}" >/dev/null || die "kafka-acls failed for $principal"
  done < <(acl_spec | awk '{ k = $1 " " $2 " " $3 " " $5; if (!(k in n)) o[++c] = k; n[k] = n[k] " " $4 }
                           END { for (i = 1; i <= c; i++) print o[i] n[o[i]] }')
  log "SCRAM credentials and ACLs applied for ${#PRINCIPALS[@]} principals"
}

# ---------------------------------------------------------------- commands

broker_answers() {
  local client="$CONF/tools-client.properties"
  [[ -n "$SECURE_DIR" ]] && client="$SECURE_DIR/admin.properties"
  kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" \
    --command-config "$client" --list >/dev/null 2>>"$LOGS/readiness.log"
}

print_env() {
  [[ -n "$SECURE_DIR" ]] && echo "KAFKA_SECURE_DIR=$SECURE_DIR"
  echo "KAFKA_BOOTSTRAP=$BOOTSTRAP"
}

cmd_start() {
  command -v java >/dev/null || die "java not found (Java 17+ needed)"
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    set_log_opts
    if [[ "$SECURE" == 1 && -z "$SECURE_DIR" ]] || [[ "$SECURE" == 0 && -n "$SECURE_DIR" ]]; then
      die "a broker (pid $pid) already runs $([[ -n "$SECURE_DIR" ]] && echo with || echo without) --secure in $STATE: stop it first"
    fi
    if broker_answers; then
      log "already running (pid $pid)"
      print_env
      return 0
    fi
    log "pid $pid exists but the broker does not answer: restarting it"
    cmd_stop
  fi
  for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
    if port_open "$p"; then
      die "port 127.0.0.1:$p is already in use by another process (set KAFKA_PORT / KAFKA_CONTROLLER_PORT)"
    fi
  done

  if [[ "$SECURE" == 1 && "$KEEP_DATA" == 1 ]]; then
    die "--keep-data is not supported with --secure (every secure start makes new keys)"
  fi
  ensure_state_dir
  mkdir -p "$LOGS"
  fetch_jars
  write_config
  local config="$CONF/server.properties"
  if [[ -n "$SECURE_DIR" ]]; then  # left by a secure broker that is gone
    rm -rf "$SECURE_DIR"
    SECURE_DIR=""
  fi
  rm -f "$SECURE_REF"
  if [[ "$SECURE" == 1 ]]; then
    make_secure_dir
    write_secure_config
    config="$SECURE_DIR/server.properties"
  fi

  : >"$LOGS/readiness.log"
  if [[ "$KEEP_DATA" == 1 && -f "$DATA/metadata/meta.properties" ]]; then
    log "reusing the storage in $DATA (--keep-data)"
  elif [[ "$SECURE" == 1 ]]; then
    rm -rf "$DATA"
    mkdir -p "$DATA"
    : >"$LOGS/server.log"
    format_secure
  else
    # a fresh broker: empty, formatted storage
    rm -rf "$DATA"
    mkdir -p "$DATA"
    : >"$LOGS/server.log"
    local cid
    cid="$(random_cluster_id)"
    if ! kafka_tool kafka.tools.StorageTool format --cluster-id "$cid" \
        --config "$CONF/server.properties" --standalone >"$LOGS/format.log" 2>&1; then
      cat "$LOGS/format.log" >&2
      die "formatting the storage failed"
    fi
  fi

  log "starting Kafka $KAFKA_VERSION on $BOOTSTRAP (controller 127.0.0.1:$KAFKA_CONTROLLER_PORT)$([[ "$SECURE" == 1 ]] && echo ", SASL_SSL + ACLs, secrets in $SECURE_DIR"), state in $STATE"
  # shellcheck disable=SC2086  # KAFKA_HEAP_OPTS is a list of JVM flags
  setsid java $KAFKA_HEAP_OPTS -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
    -Djava.awt.headless=true "${BROKER_LOG_OPTS[@]}" \
    -Dkafka.logs.dir="$LOGS" \
    -cp "$(classpath)" kafka.Kafka "$config" \
    </dev/null >"$LOGS/kafka.out" 2>&1 &
  pid=$!
  echo "$pid" >"$PIDFILE"

  local t0=$SECONDS deadline=$((SECONDS + KAFKA_START_TIMEOUT))
  # 1) the listener accepts TCP connections
  until port_open "$KAFKA_PORT"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      print_log_tail
      rm -f "$PIDFILE"
      die "the broker exited during start-up"
    fi
    if ((SECONDS >= deadline)); then
      print_log_tail
      cmd_stop
      die "port $KAFKA_PORT not open after ${KAFKA_START_TIMEOUT}s"
    fi
    sleep 0.2
  done
  # 2) a real Kafka API round trip (Metadata via AdminClient)
  until broker_answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      print_log_tail
      rm -f "$PIDFILE"
      die "the broker exited during start-up"
    fi
    if ((SECONDS >= deadline)); then
      print_log_tail
      tail -n 20 "$LOGS/readiness.log" >&2 || true
      cmd_stop
      die "broker did not answer a Kafka request within ${KAFKA_START_TIMEOUT}s"
    fi
    sleep 1
  done
  if [[ "$SECURE" == 1 ]] && ! create_acls; then
    cmd_stop
    die "creating the ACLs failed (log: $LOGS/acls.log)"
  fi
  log "ready after $((SECONDS - t0))s (pid $pid, logs in $LOGS)"
  if [[ "$SECURE" == 1 ]]; then
    log "one env file per principal (STEPGUARD_KAFKA_* settings): $SECURE_DIR/{admin,$(IFS=,; echo "${PRINCIPALS[*]}")}.env"
  fi
  print_env
}

cmd_stop() {
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    log "stopping broker (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "still alive after 20s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 25; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
      done
    fi
  else
    log "not running"
  fi
  rm -f "$PIDFILE"
  if [[ -n "$SECURE_DIR" ]]; then
    rm -rf "$SECURE_DIR"
    SECURE_DIR=""
  fi
  rm -f "$SECURE_REF"
  if [[ "$KEEP_DATA" == 1 ]]; then
    log "storage kept in $DATA (--keep-data)"
  else
    rm -rf "$DATA"
  fi
}

cmd_status() {
  local pid
  pid="$(running_pid)"
  if [[ -z "$pid" ]]; then
    echo "kafka: stopped"
    return 3
  fi
  set_log_opts
  if broker_answers; then
    echo "kafka: running (pid $pid, version $KAFKA_VERSION$([[ -n "$SECURE_DIR" ]] && echo ", secure: $SECURE_DIR")), KAFKA_BOOTSTRAP=$BOOTSTRAP"
  else
    echo "kafka: process $pid alive but the broker does not answer on $BOOTSTRAP"
    return 1
  fi
}

usage() {
  echo "usage: $0 start|stop|status|restart [--keep-data] [--secure] | acl-spec | apply-acls | certs DIR" >&2
  exit 2
}
if [[ "${1:-}" == certs ]]; then
  cmd_certs "${2:-}"
  exit 0
fi
for opt in "${@:2}"; do
  case "$opt" in
    --keep-data) KEEP_DATA=1 ;;
    --secure) SECURE=1 ;;
    *) usage ;;
  esac
done

if [[ -d "$STATE" && ! -L "$STATE" ]]; then
  load_secure_dir
fi

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  restart) cmd_stop; cmd_start ;;
  acl-spec) acl_spec ;;
  apply-acls) cmd_apply_acls ;;
  *) usage ;;
esac

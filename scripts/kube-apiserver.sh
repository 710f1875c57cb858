#!/usr/bin/env bash
# Run a real kube-apiserver (built from the Go module proxy) on Debian's etcd for CI and
# local tests, without Docker, kubelet or systemd. Nodes are hand-made Node objects.
#
# Usage: scripts/kube-apiserver.sh build|start|stop|status|env
#
#   build    build kube-apiserver $KUBE_VERSION into $KUBE_APISERVER_BIN unless it is
#            there already (cold: ~15 CPU-minutes and ~2.7 GB of Go build cache)
#   start    install etcd-server if missing, build if missing, start etcd and the
#            apiserver on 127.0.0.1, wait for /readyz, print the env lines below
#   stop     stop both (TERM, then KILL) and remove the state dir
#   status   exit 0 and print the env lines when /readyz answers
#   env      print the env lines (no check)
#
# Environment (defaults):
#   KUBE_VERSION=v1.37.2
#   KUBE_CACHE_DIR=~/.cache/stepguard
#   KUBE_APISERVER_BIN=$KUBE_CACHE_DIR/kube-apiserver-$KUBE_VERSION/kube-apiserver
#   KUBE_HOME_DIR=/tmp/stepguard-kube    state dir (private: a real directory owned by
#                                   this user, writable by nobody else; mode 700)
#   KUBE_APISERVER_PORT=34443       apiserver (HTTPS) on 127.0.0.1
#   KUBE_ETCD_PORT=34379            etcd client port on 127.0.0.1
#   KUBE_ETCD_PEER_PORT=34380       etcd peer port on 127.0.0.1
#   KUBE_START_TIMEOUT=120          seconds to wait for /readyz
#   KUBE_ADMISSION_DISABLE=TaintNodesByCondition   admission plugins to disable (a
#                                   hand-made Node has no kubelet to clear not-ready)
#   KUBE_FEATURE_GATES=             --feature-gates for the apiserver (empty: none)
#   KUBE_RUNTIME_CONFIG=            --runtime-config for the apiserver (empty: none)
#
# Layout under $KUBE_HOME_DIR:
#   .stepguard-kube (marker: stop removes only a dir that has it)
#   pki/     ca.crt ca.key server.crt server.key sa.key sa.pub (openssl, made per start)
#   tokens.csv   one admin token (group system:masters), mode 600
#   admin.kubeconfig   kubeconfig for that admin (mode 600)
#   etcd/    etcd data        log/  etcd.log apiserver.log
#   etcd.pid apiserver.pid
#
# `start`, `status` and `env` print, last line KUBECONFIG:
#   KUBE_APISERVER_URL=https://127.0.0.1:$KUBE_APISERVER_PORT
#   KUBE_CA_FILE=$KUBE_HOME_DIR/pki/ca.crt
#   KUBE_ADMIN_TOKEN_FILE=$KUBE_HOME_DIR/admin.token
#   KUBECONFIG=$KUBE_HOME_DIR/admin.kubeconfig
# Every start begins from an empty etcd and new keys; the admin token never appears on
# a command line.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
KUBE_CACHE_DIR="${KUBE_CACHE_DIR:-$HOME/.cache/stepguard}"
KUBE_APISERVER_BIN="${KUBE_APISERVER_BIN:-$KUBE_CACHE_DIR/kube-apiserver-$KUBE_VERSION/kube-apiserver}"
KUBE_HOME_DIR="${KUBE_HOME_DIR:-/tmp/stepguard-kube}"
KUBE_APISERVER_PORT="${KUBE_APISERVER_PORT:-34443}"
KUBE_ETCD_PORT="${KUBE_ETCD_PORT:-34379}"
KUBE_ETCD_PEER_PORT="${KUBE_ETCD_PEER_PORT:-34380}"
KUBE_START_TIMEOUT="${KUBE_START_TIMEOUT:-120}"
KUBE_ADMISSION_DISABLE="${KUBE_ADMISSION_DISABLE-TaintNodesByCondition}"
KUBE_FEATURE_GATES="${KUBE_FEATURE_GATES:-}"
KUBE_RUNTIME_CONFIG="${KUBE_RUNTIME_CONFIG:-}"

STATE="$KUBE_HOME_DIR"
MARKER="$STATE/.stepguard-kube"
PKI="$STATE/pki"
LOGS="$STATE/log"
ETCD_PID="$STATE/etcd.pid"
API_PID="$STATE/apiserver.pid"
URL="https://127.0.0.1:$KUBE_APISERVER_PORT"
ETCD_BIN="${KUBE_ETCD_BIN:-/usr/bin/etcd}"
BUILD_DIR="$(dirname "$KUBE_APISERVER_BIN")"

log() { echo "kube-apiserver.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now_ms() { date +%s%3N; }

check_settings() {
  local v
  for v in "$KUBE_APISERVER_PORT" "$KUBE_ETCD_PORT" "$KUBE_ETCD_PEER_PORT" "$KUBE_START_TIMEOUT"; do
    [[ "$v" =~ ^[0-9]+$ ]] || die "not a number: '$v'"
  done
  [[ "$KUBE_VERSION" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "KUBE_VERSION must look like v1.37.2: '$KUBE_VERSION'"
  case "$STATE" in
    /*) ;;
    *) die "KUBE_HOME_DIR must be an absolute path: '$STATE'" ;;
  esac
  case "${STATE%/}" in
    "" | /tmp | /var | /var/tmp | /home | /root | /usr | /etc | /opt | /srv | /work)
      die "refusing to use '$STATE' as KUBE_HOME_DIR" ;;
  esac
}

# ---------------------------------------------------------------- build

# The 33 staging modules k8s.io/kubernetes replaces with ./staging/...; a module that
# requires k8s.io/kubernetes must replace each with its published v0.X.Y twin.
STAGING=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
  cloud-provider cluster-bootstrap code-generator component-base component-helpers
  controller-manager cri-api cri-client cri-streaming csi-translation-lib
  dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
  kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
  mount-utils pod-security-admission sample-apiserver streaming)

cmd_build() {
  if [[ -x "$KUBE_APISERVER_BIN" ]]; then
    log "already built: $KUBE_APISERVER_BIN"
    return 0
  fi
  command -v go >/dev/null 2>&1 || die "go is not on PATH (Go 1.26+ builds $KUBE_VERSION)"
  local t0 staging_ver work
  t0="$(now_ms)"
  staging_ver="v0.${KUBE_VERSION#v1.}"
  mkdir -p "$BUILD_DIR"
  # one build at a time (CI and a test fixture may both ask); the second waits for it
  exec 9>"$BUILD_DIR/.build.lock"
  flock 9
  if [[ -x "$KUBE_APISERVER_BIN" ]]; then
    log "built meanwhile: $KUBE_APISERVER_BIN"
    return 0
  fi
  work="$BUILD_DIR/src"
  rm -rf -- "$work"
  mkdir -p "$work"
  log "building kube-apiserver $KUBE_VERSION in $work (staging modules at $staging_ver)"
  {
    echo "module stepguard.local/kube-apiserver"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    local m
    for m in "${STAGING[@]}"; do
      echo "replace k8s.io/$m => k8s.io/$m $staging_ver"
    done
  } >"$work/go.mod"
  cat >"$work/tools.go" <<GO
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
  (
    cd "$work"
    go mod download "k8s.io/kubernetes@$KUBE_VERSION"
    go mod tidy -e
    go build -trimpath \
      -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION" \
      -o "$KUBE_APISERVER_BIN.tmp" k8s.io/kubernetes/cmd/kube-apiserver
  ) >&2 || die "build failed"
  mv -f "$KUBE_APISERVER_BIN.tmp" "$KUBE_APISERVER_BIN"
  rm -rf -- "$work"
  log "built $KUBE_APISERVER_BIN in $(( ($(now_ms) - t0) / 1000 )) s"
}

# ---------------------------------------------------------------- run

# pid in $1 if it is alive and its command line contains $2 (a stale pid file that now
# points at some other process is never trusted), else nothing
pid_of() {
  local file="$1" needle="$2" pid cmdline
  [[ -f "$file" ]] || return 0
  pid="$(head -n 1 "$file" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  [[ "$cmdline" == *"$needle"* ]] && echo "$pid"
  return 0
}
etcd_pid() { pid_of "$ETCD_PID" "--data-dir=$STATE/etcd"; }
api_pid() { pid_of "$API_PID" "--etcd-servers=http://127.0.0.1:$KUBE_ETCD_PORT"; }

check_private_dir() {
  local dir="$1" owner mode
  [[ -L "$dir" ]] && die "$dir is a symbolic link: refusing to use it"
  [[ -d "$dir" ]] || die "$dir is not a directory"
  owner="$(stat -c %u "$dir")"
  [[ "$owner" == "$(id -u)" ]] || die "$dir belongs to uid $owner, not to us: refusing to use it"
  mode="$(stat -c %a "$dir")"
  (( (8#$mode & 8#022) == 0 )) || die "$dir is writable by others (mode $mode): refusing to use it"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

as_root() {
  if [[ "$(id -u)" -eq 0 ]]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
  else die "need root (or sudo) to install packages"; fi
}

install_etcd() {
  [[ -x "$ETCD_BIN" ]] && return 0
  log "installing Debian's etcd-server"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >&2
  # the postinst may try to start the system etcd: deny service starts meanwhile
  local added=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod 0755 /usr/sbin/policy-rc.d
    added=1
  fi
  local rc=0
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server </dev/null >&2 || rc=$?
  [[ "$added" -eq 1 ]] && as_root rm -f /usr/sbin/policy-rc.d
  [[ "$rc" -eq 0 && -x "$ETCD_BIN" ]] || die "apt-get install etcd-server failed (rc=$rc)"
}

make_pki() {
  mkdir -m 700 "$PKI"
  (
    cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
      -subj "/CN=stepguard-test-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out server.crt -days 2 -extfile server.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 600 ./*.key
  ) || die "openssl failed"
}

write_credentials() {
  local token
  token="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  umask 077
  printf '%s' "$token" >"$STATE/admin.token"  # no newline: the Python client sends it as is
  printf '%s,stepguard-admin,stepguard-admin,"system:masters"\n' "$token" >"$STATE/tokens.csv"
  cat >"$STATE/admin.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: stepguard-test
  cluster:
    server: $URL
    certificate-authority: $PKI/ca.crt
users:
- name: stepguard-admin
  user:
    tokenFile: $STATE/admin.token
contexts:
- name: stepguard-test
  context: {cluster: stepguard-test, user: stepguard-admin}
current-context: stepguard-test
KC
  umask 022
}

ready() {
  [[ -f "$STATE/admin.token" ]] || return 1
  [[ "$(curl -s --max-time 3 --cacert "$PKI/ca.crt" \
      -H "Authorization: Bearer $(cat "$STATE/admin.token")" "$URL/readyz" 2>/dev/null)" == ok ]]
}

print_env() {
  echo "KUBE_APISERVER_URL=$URL"
  echo "KUBE_CA_FILE=$PKI/ca.crt"
  echo "KUBE_ADMIN_TOKEN_FILE=$STATE/admin.token"
  echo "KUBECONFIG=$STATE/admin.kubeconfig"
}

log_tail() {
  local f
  for f in "$LOGS/etcd.log" "$LOGS/apiserver.log"; do
    [[ -s "$f" ]] || continue
    log "---- tail of $f ----"
    tail -n 30 "$f" >&2 || true
  done
}

cmd_start() {
  local t0
  t0="$(now_ms)"
  if [[ -n "$(api_pid)" ]] && ready; then
    log "already running ($URL)"
    print_env
    return 0
  fi
  install_etcd
  cmd_build
  stop_all
  local port
  for port in "$KUBE_APISERVER_PORT" "$KUBE_ETCD_PORT" "$KUBE_ETCD_PEER_PORT"; do
    port_open "$port" && die "port $port on 127.0.0.1 is in use; set KUBE_APISERVER_PORT/KUBE_ETCD_PORT/KUBE_ETCD_PEER_PORT"
  done
  if [[ -e "$STATE" || -L "$STATE" ]]; then
    check_private_dir "$STATE"
    [[ -f "$MARKER" ]] || die "$STATE exists and is not ours (no $MARKER): refusing to use it"
    rm -rf -- "$STATE"
  fi
  mkdir -p "$(dirname "$STATE")"
  mkdir -m 700 "$STATE"
  touch "$MARKER"
  mkdir -p "$LOGS"
  make_pki
  write_credentials

  (exec setsid "$ETCD_BIN" --name stepguard --data-dir="$STATE/etcd" \
      --listen-client-urls="http://127.0.0.1:$KUBE_ETCD_PORT" \
      --advertise-client-urls="http://127.0.0.1:$KUBE_ETCD_PORT" \
      --listen-peer-urls="http://127.0.0.1:$KUBE_ETCD_PEER_PORT" \
      --initial-advertise-peer-urls="http://127.0.0.1:$KUBE_ETCD_PEER_PORT" \
      --initial-cluster="stepguard=http://127.0.0.1:$KUBE_ETCD_PEER_PORT" \
      --unsafe-no-fsync </dev/null >>"$LOGS/etcd.log" 2>&1) &
  echo $! >"$ETCD_PID"
  local -a extra=()
  [[ -n "$KUBE_ADMISSION_DISABLE" ]] && extra+=("--disable-admission-plugins=$KUBE_ADMISSION_DISABLE")
  [[ -n "$KUBE_FEATURE_GATES" ]] && extra+=("--feature-gates=$KUBE_FEATURE_GATES")
  [[ -n "$KUBE_RUNTIME_CONFIG" ]] && extra+=("--runtime-config=$KUBE_RUNTIME_CONFIG")
  (exec setsid "$KUBE_APISERVER_BIN" \
      --etcd-servers="http://127.0.0.1:$KUBE_ETCD_PORT" \
      --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
      --secure-port="$KUBE_APISERVER_PORT" \
      --tls-cert-file="$PKI/server.crt" --tls-private-key-file="$PKI/server.key" \
      --client-ca-file="$PKI/ca.crt" --token-auth-file="$STATE/tokens.csv" \
      --service-account-issuer=https://kubernetes.default.svc \
      --service-account-key-file="$PKI/sa.pub" \
      --service-account-signing-key-file="$PKI/sa.key" \
      --service-cluster-ip-range=10.0.0.0/24 \
      --authorization-mode=RBAC --endpoint-reconciler-type=none \
      "${extra[@]}" </dev/null >>"$LOGS/apiserver.log" 2>&1) &
  echo $! >"$API_PID"
  log "launched etcd (pid $(cat "$ETCD_PID")) and kube-apiserver (pid $(cat "$API_PID")) in $STATE"

  local deadline=$(( $(now_ms) + KUBE_START_TIMEOUT * 1000 ))
  until ready; do
    if [[ -z "$(api_pid)" || -z "$(etcd_pid)" ]]; then
      log "etcd or kube-apiserver exited during startup"
      log_tail
      stop_all
      exit 1
    fi
    if (( $(now_ms) > deadline )); then
      log "no /readyz from $URL after ${KUBE_START_TIMEOUT}s"
      log_tail
      stop_all
      exit 1
    fi
    sleep 0.2
  done
  log "ready at $URL in $(( $(now_ms) - t0 )) ms"
  print_env
}

# TERM both (apiserver first), wait up to 20 s each, then KILL
stop_all() {
  local pid name file
  for name in api etcd; do
    pid="$("${name}_pid")"
    [[ -n "$pid" ]] || continue
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$(( $(now_ms) + 20000 ))
    while kill -0 "$pid" 2>/dev/null && (( $(now_ms) < deadline )); do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name (pid $pid) still running after 20 s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for file in "$API_PID" "$ETCD_PID"; do rm -f "$file"; done
}

cmd_stop() {
  stop_all
  if [[ -d "$STATE" && ! -L "$STATE" && -f "$MARKER" ]]; then
    rm -rf -- "$STATE"
    log "stopped; removed $STATE"
  else
    log "stopped"
  fi
}

cmd_status() {
  if [[ -n "$(api_pid)" ]] && ready; then
    log "running ($URL, state $STATE)"
    print_env
    return 0
  fi
  log "not running"
  return 3
}

main() {
  check_settings
  case "${1:-}" in
    build) cmd_build ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) print_env ;;
    *) echo "usage: $0 build|start|stop|status|env" >&2; exit 2 ;;
  esac
}

main "$@"

#!/usr/bin/env bash
# Run Debian's Prometheus Alertmanager (prometheus-alertmanager 0.25) for CI, tests and
# `stepguard up --durable`, without Docker and without systemd: config and storage in a
# state folder, the API on 127.0.0.1 only, no cluster (gossip) port, stopped by pid.
#
# Usage: scripts/alertmanager.sh start|stop|status|restart [--keep-data]
#
# By default every start begins with empty storage (no silences, no notification log)
# and stop deletes the state folder's data; with --keep-data silences survive a restart.
#
# Environment (defaults):
#   ALERTMANAGER_PORT=19094                 web/API listener 127.0.0.1:$ALERTMANAGER_PORT
#   ALERTMANAGER_STATE_DIR=/tmp/stepguard-alertmanager   config, data, log, pid file
#   ALERTMANAGER_WEBHOOK_URL=               the receiver every alert is routed to (a
#                                           webhook_config); empty: a receiver that
#                                           sends nothing (alerts are still listed)
#   ALERTMANAGER_GROUP_WAIT=1s              route group_wait
#   ALERTMANAGER_GROUP_INTERVAL=1s          route group_interval
#   ALERTMANAGER_REPEAT_INTERVAL=4h         route repeat_interval
#   ALERTMANAGER_RESOLVE_TIMEOUT=5m         global resolve_timeout (alerts sent without
#                                           endsAt; stepguard always sends one)
#   ALERTMANAGER_BIN=prometheus-alertmanager (Debian's name; `alertmanager` elsewhere)
#   ALERTMANAGER_START_TIMEOUT=30           seconds to wait for /-/ready
#
# The route groups by `incident` and `alertname` (stepguard's labels), so one incident
# pages once however many ranks it names. `start` prints
# ALERTMANAGER_URL=http://127.0.0.1:<port> as its last line on stdout; progress goes
# to stderr. The state dir is used only if it is a real directory owned by this user
# and writable by nobody else; a missing one is created with mode 700.
set -euo pipefail

AM_PORT="${ALERTMANAGER_PORT:-19094}"
STATE="${ALERTMANAGER_STATE_DIR:-/tmp/stepguard-alertmanager}"
while [[ "$STATE" == */ && "$STATE" != / ]]; do STATE="${STATE%/}"; done
WEBHOOK_URL="${ALERTMANAGER_WEBHOOK_URL:-}"
GROUP_WAIT="${ALERTMANAGER_GROUP_WAIT:-1s}"
GROUP_INTERVAL="${ALERTMANAGER_GROUP_INTERVAL:-1s}"
REPEAT_INTERVAL="${ALERTMANAGER_REPEAT_INTERVAL:-4h}"
RESOLVE_TIMEOUT="${ALERTMANAGER_RESOLVE_TIMEOUT:-5m}"
AM_BIN="${ALERTMANAGER_BIN:-prometheus-alertmanager}"
START_TIMEOUT="${ALERTMANAGER_START_TIMEOUT:-30}"

CONFIG="$STATE/alertmanager.yml"
DATA="$STATE/data"
LOG="$STATE/alertmanager.log"
PIDFILE="$STATE/alertmanager.pid"
URL="http://127.0.0.1:$AM_PORT"
KEEP_DATA=0

log() { echo "alertmanager.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

check_settings() {
  [[ "$AM_PORT" =~ ^[0-9]+$ ]] && ((AM_PORT > 0 && AM_PORT < 65536)) ||
    die "ALERTMANAGER_PORT is not a port: '$AM_PORT'"
  [[ "$START_TIMEOUT" =~ ^[0-9]+$ ]] || die "ALERTMANAGER_START_TIMEOUT is not a number"
  case "$STATE" in
    /*) ;;
    *) die "ALERTMANAGER_STATE_DIR must be an absolute path: '$STATE'" ;;
  esac
  case "$STATE" in  # stop removes data below it: refuse what is obviously wrong
    "" | / | /tmp | /var | /var/tmp | /home | /root | /usr | /etc | /opt | /srv | /work)
      die "refusing to use '$STATE' as ALERTMANAGER_STATE_DIR" ;;
  esac
  local d
  for d in "$GROUP_WAIT" "$GROUP_INTERVAL" "$REPEAT_INTERVAL" "$RESOLVE_TIMEOUT"; do
    [[ "$d" =~ ^[0-9]+(ms|s|m|h)$ ]] || die "not a duration (e.g. 1s, 5m): '$d'"
  done
  if [[ -n "$WEBHOOK_URL" ]]; then
    [[ "$WEBHOOK_URL" =~ ^https?://[^[:space:]\"\'\\]+$ ]] ||
      die "ALERTMANAGER_WEBHOOK_URL must be an http(s) URL without spaces or quotes"
  fi
}

# A directory is trusted only when it is ours: a real directory (not a symbolic link),
# owned by this user, writable by nobody else.
ensure_state_dir() {
  if [[ -e "$STATE" || -L "$STATE" ]]; then
    [[ -L "$STATE" ]] && die "$STATE is a symbolic link: refusing to use it"
    [[ -d "$STATE" ]] || die "$STATE is not a directory"
    [[ "$(stat -c %u "$STATE")" == "$(id -u)" ]] || die "$STATE belongs to someone else"
    local mode
    mode="$(stat -c %a "$STATE")"
    (( (8#$mode & 8#022) == 0 )) || die "$STATE is writable by others (mode $mode)"
  else
    mkdir -p "$(dirname "$STATE")"
    mkdir -m 700 "$STATE"
  fi
}

# pid of our running Alertmanager, or nothing: a stale pid file that now names some
# other process is never trusted (its command line must name our config).
running_pid() {
  [[ -f "$PIDFILE" ]] || return 0
  local pid cmdline
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  [[ "$cmdline" == *"--config.file=$CONFIG"* ]] && echo "$pid"
  return 0
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# /-/ready answers 200 once the configuration is loaded (bash only: no curl needed).
ready() {
  local reply
  reply="$(
    {
      exec 3<>"/dev/tcp/127.0.0.1/$AM_PORT" || exit 1
      printf 'GET /-/ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
      timeout 2 head -n 1 <&3
    } 2>/dev/null
  )" || return 1
  [[ "$reply" == *" 200 "* ]]
}

write_config() {
  local receiver
  if [[ -n "$WEBHOOK_URL" ]]; then
    receiver="    webhook_configs:
      - url: '$WEBHOOK_URL'
        send_resolved: true"
  else
    receiver="    # no ALERTMANAGER_WEBHOOK_URL: alerts are kept and listed, nothing is sent"
  fi
  (
    umask 077
    cat >"$CONFIG" <<EOF
# generated by scripts/alertmanager.sh
global:
  resolve_timeout: $RESOLVE_TIMEOUT
route:
  receiver: stepguard
  group_by: ['incident', 'alertname']
  group_wait: $GROUP_WAIT
  group_interval: $GROUP_INTERVAL
  repeat_interval: $REPEAT_INTERVAL
receivers:
  - name: stepguard
$receiver
EOF
  )
}

cmd_start() {
  command -v "$AM_BIN" >/dev/null ||
    die "$AM_BIN not found (apt-get install prometheus-alertmanager, or set ALERTMANAGER_BIN)"
  ensure_state_dir
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    if ready; then
      log "already running (pid $pid)"
      echo "ALERTMANAGER_URL=$URL"
      return 0
    fi
    log "pid $pid exists but does not answer: restarting it"
    cmd_stop
  fi
  port_open "$AM_PORT" && die "port 127.0.0.1:$AM_PORT is in use (set ALERTMANAGER_PORT)"
  write_config
  [[ "$KEEP_DATA" == 1 ]] || rm -rf "$DATA"
  mkdir -p "$DATA"
  : >"$LOG"
  log "starting $AM_BIN on $URL (state in $STATE)"
  # --cluster.listen-address= (empty): no gossip port, a single instance
  setsid "$AM_BIN" --config.file="$CONFIG" --storage.path="$DATA" \
    --web.listen-address="127.0.0.1:$AM_PORT" --cluster.listen-address= \
    --log.level=info </dev/null >>"$LOG" 2>&1 &
  pid=$!
  echo "$pid" >"$PIDFILE"
  local t0=$SECONDS deadline=$((SECONDS + START_TIMEOUT))
  until ready; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$LOG" >&2 || true
      rm -f "$PIDFILE"
      die "Alertmanager exited during start-up"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 30 "$LOG" >&2 || true
      cmd_stop
      die "Alertmanager not ready after ${START_TIMEOUT}s"
    fi
    sleep 0.1
  done
  log "ready after $((SECONDS - t0))s (pid $pid, log $LOG)"
  echo "ALERTMANAGER_URL=$URL"
}

cmd_stop() {
  local pid i
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    log "stopping Alertmanager (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "still alive after 10s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  else
    log "not running"
  fi
  rm -f "$PIDFILE"
  if [[ "$KEEP_DATA" == 1 ]]; then
    log "storage kept in $DATA (--keep-data)"
  elif [[ -d "$STATE" && ! -L "$STATE" ]]; then
    rm -rf "$DATA"
  fi
}

cmd_status() {
  local pid
  pid="$(running_pid)"
  if [[ -z "$pid" ]]; then
    echo "alertmanager: stopped"
    return 3
  fi
  if ready; then
    echo "alertmanager: running (pid $pid), ALERTMANAGER_URL=$URL"
  else
    echo "alertmanager: process $pid alive but $URL/-/ready does not answer"
    return 1
  fi
}

usage() {
  echo "usage: $0 start|stop|status|restart [--keep-data]" >&2
  exit 2
}
for opt in "${@:2}"; do
  case "$opt" in
    --keep-data) KEEP_DATA=1 ;;
    *) usage ;;
  esac
done
check_settings
case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  restart) cmd_stop; cmd_start ;;
  *) usage ;;
esac

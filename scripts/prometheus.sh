#!/usr/bin/env bash
# Run Debian's Prometheus (2.42) with stepguard's rules for CI and local tests, without
# Docker and without systemd: loopback only, config and TSDB in a state dir, stopped
# by pid.
#
#   scripts/prometheus.sh install  apt-get install prometheus (promtool) when missing
#   scripts/prometheus.sh start    install if needed, start, wait until ready, print URL
#   scripts/prometheus.sh status   exit 0 and print the URL when it answers
#   scripts/prometheus.sh stop     stop the server and delete its state dir
#
# Environment (defaults):
#   PROMETHEUS_PORT=19090            web/API port on 127.0.0.1
#   PROMETHEUS_STATE_DIR=/tmp/stepguard-prometheus   config, targets and TSDB
#   PROMETHEUS_SCRAPE_INTERVAL=2s    scrape and rule evaluation interval (1s-2s in tests)
#   PROMETHEUS_TARGETS=              static targets, "job=host:port[,job=host:port]",
#                                    e.g. "stepguard-worker=127.0.0.1:9108"
#   PROMETHEUS_FILE_SD=              a file_sd JSON/YAML file of targets instead (or as
#                                    well); Prometheus re-reads it when it changes
#   PROMETHEUS_RULES=<repo>/pipeline/tools/prometheus/stepguard.rules.yml
#   PROMETHEUS_ALERTMANAGER=         host:port of an Alertmanager to send alerts to
#   PROMETHEUS_START_TIMEOUT=60      seconds to wait for /-/ready
#   PROMETHEUS_STOP_TIMEOUT=10       seconds between SIGTERM and SIGKILL
#
# Targets' file_sd groups may carry a `job` label: it names the scrape job (the shipped
# rules select on stepguard-worker, -actuator, -executor, -archiver). Progress goes to
# stderr; `start` and `status` print exactly one line on stdout,
# `PROMETHEUS_URL=http://127.0.0.1:PORT`. A `start` of a running server rewrites its
# targets and reloads it (SIGHUP); `stop` is idempotent.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PORT="${PROMETHEUS_PORT:-19090}"
STATE_DIR="${PROMETHEUS_STATE_DIR:-/tmp/stepguard-prometheus}"
while [[ "$STATE_DIR" == */ && "$STATE_DIR" != / ]]; do STATE_DIR="${STATE_DIR%/}"; done
INTERVAL="${PROMETHEUS_SCRAPE_INTERVAL:-2s}"
TARGETS="${PROMETHEUS_TARGETS:-}"
FILE_SD="${PROMETHEUS_FILE_SD:-}"
RULES="${PROMETHEUS_RULES:-$ROOT/pipeline/tools/prometheus/stepguard.rules.yml}"
ALERTMANAGER="${PROMETHEUS_ALERTMANAGER:-}"
START_TIMEOUT="${PROMETHEUS_START_TIMEOUT:-60}"
STOP_TIMEOUT="${PROMETHEUS_STOP_TIMEOUT:-10}"

BIN=/usr/bin/prometheus
CONFIG="$STATE_DIR/prometheus.yml"
STATIC_SD="$STATE_DIR/static-targets.json"
PID_FILE="$STATE_DIR/prometheus.pid"
LOG="$STATE_DIR/prometheus.log"
URL="http://127.0.0.1:${PORT}"

log() { printf '[prometheus.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now_ms() { date +%s%3N; }

check_settings() {
    local v
    for v in "$PORT" "$START_TIMEOUT" "$STOP_TIMEOUT"; do
        [[ "$v" =~ ^[0-9]+$ ]] || die "not a number: '$v'"
    done
    [[ "$INTERVAL" =~ ^[0-9]+(ms|s|m)$ ]] || die "PROMETHEUS_SCRAPE_INTERVAL: expected e.g. 2s, got '$INTERVAL'"
    [[ -z "$ALERTMANAGER" || "$ALERTMANAGER" =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]] ||
        die "PROMETHEUS_ALERTMANAGER: expected host:port, got '$ALERTMANAGER'"
    # stop does `rm -rf` on this path: refuse anything that is obviously wrong.
    case "$STATE_DIR" in
        /*) ;;
        *) die "PROMETHEUS_STATE_DIR must be an absolute path: '$STATE_DIR'" ;;
    esac
    case "$STATE_DIR" in
        "" | / | /tmp | /var | /var/tmp | /home | /root | /usr | /etc | /opt | /srv | /work)
            die "refusing to use '$STATE_DIR' as PROMETHEUS_STATE_DIR" ;;
    esac
}

# ---------------------------------------------------------------- processes

pid_alive() {
    local st
    [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null || return 1
    st="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    st="${st##*) }"
    [[ "${st%% *}" != Z ]]
}

# Only a prometheus started on this state dir's config: a stale pid file may name a
# recycled pid.
is_ours() {
    local cmd
    [[ "${1:-}" =~ ^[0-9]+$ ]] && pid_alive "$1" || return 1
    cmd="$(tr '\0' ' ' 2>/dev/null < "/proc/$1/cmdline")" || return 1
    [[ "$cmd" == *prometheus*"--config.file=$CONFIG"* ]]
}

current_pid() {
    local pid
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    if is_ours "$pid"; then echo "$pid"; fi
}

ready() { curl -fs --max-time 2 "$URL/-/ready" >/dev/null 2>&1; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ---------------------------------------------------------------- install

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        die "need root (or sudo) to install packages"
    fi
}

cmd_install() {
    if [[ -x "$BIN" ]] && command -v promtool >/dev/null 2>&1; then
        return 0
    fi
    log "installing prometheus (with promtool) from the Debian archive"
    local t0
    t0="$(now_ms)"
    {
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
            -o Dpkg::Use-Pty=0 prometheus
    } </dev/null >&2 || die "apt-get install prometheus failed"
    [[ -x "$BIN" ]] || die "$BIN missing after install"
    log "installed in $(( $(now_ms) - t0 )) ms"
}

# ---------------------------------------------------------------- config

# "job=host:port,..." as a file_sd list (one group per target)
write_static_targets() {
    local item job addr first=1
    printf '[' > "$STATIC_SD.tmp"
    IFS=',' read -r -a items <<< "$TARGETS"
    for item in "${items[@]}"; do
        item="${item// /}"
        [[ -n "$item" ]] || continue
        job="${item%%=*}"
        addr="${item#*=}"
        [[ "$item" == *=* && "$job" =~ ^[A-Za-z0-9_.-]+$ && "$addr" =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]] ||
            die "PROMETHEUS_TARGETS: expected job=host:port, got '$item'"
        (( first )) || printf ',' >> "$STATIC_SD.tmp"
        first=0
        printf '{"targets":["%s"],"labels":{"job":"%s"}}' "$addr" "$job" >> "$STATIC_SD.tmp"
    done
    printf ']\n' >> "$STATIC_SD.tmp"
    mv "$STATIC_SD.tmp" "$STATIC_SD"
}

write_config() {
    [[ -f "$RULES" ]] || die "no rules file at $RULES (PROMETHEUS_RULES)"
    [[ -z "$FILE_SD" || -f "$FILE_SD" ]] || die "PROMETHEUS_FILE_SD: no such file: $FILE_SD"
    write_static_targets
    local timeout files
    # a scrape may take at most the interval
    timeout="$INTERVAL"
    files="\"$STATIC_SD\""
    [[ -z "$FILE_SD" ]] || files="$files, \"$FILE_SD\""
    {
        printf 'global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\n' \
            "$INTERVAL" "$timeout" "$INTERVAL"
        printf 'rule_files:\n  - "%s"\n' "$RULES"
        if [[ -n "$ALERTMANAGER" ]]; then
            printf 'alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ["%s"]\n' \
                "$ALERTMANAGER"
        fi
        printf 'scrape_configs:\n  - job_name: stepguard\n    file_sd_configs:\n'
        printf '      - files: [%s]\n        refresh_interval: 5s\n' "$files"
    } > "$CONFIG.tmp"
    mv "$CONFIG.tmp" "$CONFIG"
    if command -v promtool >/dev/null 2>&1; then
        promtool check config "$CONFIG" >&2 || die "promtool rejects $CONFIG"
    fi
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local t0 pid
    t0="$(now_ms)"
    cmd_install
    mkdir -p "$STATE_DIR/data"
    chmod 0700 "$STATE_DIR"
    pid="$(current_pid)"
    if [[ -n "$pid" ]] && ready; then
        write_config
        kill -HUP "$pid"
        log "already running (pid $pid, $URL): targets rewritten, reloaded"
        echo "PROMETHEUS_URL=$URL"
        return 0
    fi
    [[ -z "$pid" ]] || stop_server
    port_busy "$PORT" && die "port $PORT on 127.0.0.1 is already in use; set PROMETHEUS_PORT"
    write_config
    (
        exec nohup "$BIN" --config.file="$CONFIG" --storage.tsdb.path="$STATE_DIR/data" \
            --web.listen-address="127.0.0.1:$PORT" --storage.tsdb.retention.time=1d \
            --log.level=warn </dev/null >>"$LOG" 2>&1
    ) &
    pid=$!
    echo "$pid" > "$PID_FILE"
    log "launched pid $pid ($URL, state $STATE_DIR, every $INTERVAL)"
    local deadline=$(( $(now_ms) + START_TIMEOUT * 1000 ))
    until ready; do
        if ! pid_alive "$pid"; then
            log "prometheus exited during startup; tail of $LOG:"
            tail -n 30 "$LOG" >&2 || true
            rm -f "$PID_FILE"
            exit 1
        fi
        if (( $(now_ms) > deadline )); then
            log "not ready after ${START_TIMEOUT}s; tail of $LOG:"
            tail -n 30 "$LOG" >&2 || true
            stop_server
            exit 1
        fi
        sleep 0.1
    done
    log "ready in $(( $(now_ms) - t0 )) ms"
    echo "PROMETHEUS_URL=$URL"
}

stop_server() {
    local pid deadline
    pid="$(current_pid)"
    rm -f "$PID_FILE"
    [[ -n "$pid" ]] || return 0
    log "sending SIGTERM to $pid"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$(( $(now_ms) + STOP_TIMEOUT * 1000 ))
    while pid_alive "$pid" && (( $(now_ms) < deadline )); do sleep 0.1; done
    if pid_alive "$pid"; then
        log "still running after ${STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        while pid_alive "$pid"; do sleep 0.05; done
    fi
}

cmd_stop() {
    stop_server
    rm -rf -- "$STATE_DIR"
    log "stopped; removed $STATE_DIR"
}

cmd_status() {
    local pid
    pid="$(current_pid)"
    if [[ -n "$pid" ]] && ready; then
        log "running (pid $pid, $URL, state $STATE_DIR)"
        echo "PROMETHEUS_URL=$URL"
        return 0
    fi
    [[ -z "$pid" ]] || { log "pid $pid is alive but $URL/-/ready does not answer"; return 1; }
    log "not running"
    return 3
}

main() {
    check_settings
    case "${1:-}" in
        install) cmd_install ;;
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        *) echo "usage: $0 {install|start|stop|status}" >&2; exit 2 ;;
    esac
}

main "$@"

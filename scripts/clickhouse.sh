#!/usr/bin/env bash
# Run Debian's ClickHouse server (18.16.x) for CI and local tests, without
# Docker and without systemd.
#
#   scripts/clickhouse.sh start    install if needed, start, wait, print DSN
#   scripts/clickhouse.sh status   exit 0 and print the DSN when it answers
#   scripts/clickhouse.sh stop     stop the server and delete its state dir
#
# Environment (defaults):
#   CLICKHOUSE_TCP_PORT=19000      native protocol (clickhouse-driver)
#   CLICKHOUSE_HTTP_PORT=18123     HTTP interface (/ping)
#   CLICKHOUSE_STATE_DIR=/tmp/stepguard-clickhouse
#   CLICKHOUSE_START_TIMEOUT=60    seconds to wait for /ping
#   CLICKHOUSE_STOP_TIMEOUT=20     seconds between SIGTERM and SIGKILL
#   CLICKHOUSE_MAX_MEMORY_USAGE=2000000000   per-query limit (bytes)
#   CLICKHOUSE_RUN_AS=             user to run the server as; default
#                                  "clickhouse" when run as root, else the
#                                  current user
#
# Progress goes to stderr; `start` and `status` print exactly one line on
# stdout, `CLICKHOUSE_DSN=clickhouse://default@127.0.0.1:PORT/default`, so
# `scripts/clickhouse.sh start >> "$GITHUB_ENV"` works.
#
# Notes on 18.16: no max_server_memory_usage (per-query max_memory_usage
# only), LowCardinality needs allow_experimental_low_cardinality_type=1 (set in
# the default profile below). The `start` of an already running server is a
# no-op; `stop` is idempotent.
set -euo pipefail

TCP_PORT="${CLICKHOUSE_TCP_PORT:-19000}"
HTTP_PORT="${CLICKHOUSE_HTTP_PORT:-18123}"
STATE_DIR="${CLICKHOUSE_STATE_DIR:-/tmp/stepguard-clickhouse}"
while [[ "$STATE_DIR" == */ && "$STATE_DIR" != / ]]; do STATE_DIR="${STATE_DIR%/}"; done
START_TIMEOUT="${CLICKHOUSE_START_TIMEOUT:-60}"
STOP_TIMEOUT="${CLICKHOUSE_STOP_TIMEOUT:-20}"
MAX_MEMORY_USAGE="${CLICKHOUSE_MAX_MEMORY_USAGE:-2000000000}"

SERVER_BIN=/usr/sbin/clickhouse-server
CLIENT_BIN=/usr/bin/clickhouse-client
CONFIG="$STATE_DIR/config.xml"
PID_FILE="$STATE_DIR/clickhouse-server.pid"
LOG_DIR="$STATE_DIR/log"
DSN="clickhouse://default@127.0.0.1:${TCP_PORT}/default"

log() { printf '[clickhouse.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

now_ms() { date +%s%3N; }

check_settings() {
    local v
    for v in "$TCP_PORT" "$HTTP_PORT" "$START_TIMEOUT" "$STOP_TIMEOUT" "$MAX_MEMORY_USAGE"; do
        [[ "$v" =~ ^[0-9]+$ ]] || die "not a number: '$v'"
    done
    [[ "$TCP_PORT" != "$HTTP_PORT" ]] || die "TCP and HTTP ports must differ"
    # stop does `rm -rf` on this path: refuse anything that is obviously wrong.
    case "$STATE_DIR" in
        /*) ;;
        *) die "CLICKHOUSE_STATE_DIR must be an absolute path: '$STATE_DIR'" ;;
    esac
    case "${STATE_DIR%/}" in
        "" | /tmp | /var | /var/tmp | /home | /root | /usr | /etc | /opt | /srv | /work)
            die "refusing to use '$STATE_DIR' as CLICKHOUSE_STATE_DIR" ;;
    esac
}

# ---------------------------------------------------------------- processes

# Pids of servers started with this state dir's config (whatever the pid file
# says), so a lost pid file never leaves an orphan behind.
server_pids() {
    local p cmd
    for p in /proc/[0-9]*; do
        cmd="$(tr '\0' ' ' 2>/dev/null < "$p/cmdline")" || continue
        case "$cmd" in
            *clickhouse-server*"--config-file=$CONFIG"*) echo "${p#/proc/}" ;;
        esac
    done
}

# Alive and not a zombie (a server we started in this shell and killed stays
# a zombie until reaped, and kill -0 still succeeds on it).
pid_alive() {
    local st
    [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null || return 1
    st="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    st="${st##*) }"
    [[ "${st%% *}" != Z ]]
}

is_server_pid() {
    local cmd
    [[ "${1:-}" =~ ^[0-9]+$ ]] && pid_alive "$1" || return 1
    cmd="$(tr '\0' ' ' 2>/dev/null < "/proc/$1/cmdline")" || return 1
    [[ "$cmd" == *clickhouse-server* ]]
}

# The running server of this state dir: the pid file's, or (pid file lost)
# the one found by its command line. Empty when none.
current_pid() {
    local pid
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    if is_server_pid "$pid"; then
        echo "$pid"
    else
        pid="$(server_pids)"
        echo "${pid%%$'\n'*}"
    fi
}

ping_ok() {
    [[ "$(curl -s --max-time 2 "http://127.0.0.1:${HTTP_PORT}/ping" 2>/dev/null)" == "Ok." ]]
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

log_tail() {
    local f
    for f in "$LOG_DIR/stdout.log" "$LOG_DIR/clickhouse-server.err.log" "$LOG_DIR/clickhouse-server.log"; do
        if [[ -s "$f" ]]; then
            log "---- tail of $f ----"
            tail -n 40 "$f" >&2 || true
        fi
    done
}

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

install_packages() {
    if [[ -x "$SERVER_BIN" && -x "$CLIENT_BIN" ]]; then
        return 0
    fi
    log "installing clickhouse-server and clickhouse-client from the Debian archive"
    local t0 added_policy=0
    t0="$(now_ms)"
    # Upstream (packages.clickhouse.com) builds ask for the default user's
    # password through debconf or on a tty; Debian's does not. Preseed an empty
    # answer and give apt no stdin so neither can block.
    if command -v debconf-set-selections >/dev/null 2>&1; then
        printf '%s\n' \
            'clickhouse-server clickhouse-server/default-password password ' \
            'clickhouse-server clickhouse-server/default-password seen true' |
            as_root debconf-set-selections >/dev/null 2>&1 || true
    fi
    # The postinst runs `invoke-rc.d clickhouse-server start`, which would start
    # the system-wide server on 9000/8123 (and fail the install if that start
    # fails). Deny service starts while installing unless a policy already exists.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
        as_root chmod 0755 /usr/sbin/policy-rc.d
        added_policy=1
        trap 'as_root rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    local rc=0
    {
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
            -o Dpkg::Use-Pty=0 \
            clickhouse-server clickhouse-client
    } </dev/null >&2 || rc=$?
    if [[ "$added_policy" -eq 1 ]]; then
        as_root rm -f /usr/sbin/policy-rc.d
        trap - EXIT
    fi
    [[ "$rc" -eq 0 ]] || die "apt-get failed (rc=$rc)"
    [[ -x "$SERVER_BIN" ]] || die "$SERVER_BIN missing after install"
    log "installed in $(( $(now_ms) - t0 )) ms"
}

# ---------------------------------------------------------------- config

run_as_user() {
    if [[ -n "${CLICKHOUSE_RUN_AS:-}" ]]; then
        echo "$CLICKHOUSE_RUN_AS"
    elif [[ "$(id -u)" -eq 0 ]] && id clickhouse >/dev/null 2>&1; then
        echo clickhouse
    else
        id -un
    fi
}

# The state dir is trusted only when it is ours: a real directory (not a symlink),
# owned by this user or the server's user, writable by nobody else. Anyone could have
# made /tmp/<name> first, and the server would then run on their config and data.
ensure_state_dir() {
    if [[ -e "$STATE_DIR" || -L "$STATE_DIR" ]]; then
        local owner mode
        [[ ! -L "$STATE_DIR" ]] || die "$STATE_DIR is a symbolic link: refusing to use it"
        [[ -d "$STATE_DIR" ]] || die "$STATE_DIR is not a directory"
        owner="$(stat -c %u "$STATE_DIR")"
        [[ "$owner" == "$(id -u)" || "$owner" == "$(id -u "$(run_as_user)")" ]] \
            || die "$STATE_DIR belongs to uid $owner, not to us: refusing to use it"
        mode="$(stat -c %a "$STATE_DIR")"
        (( (8#$mode & 8#022) == 0 )) \
            || die "$STATE_DIR is writable by others (mode $mode): refusing to use it"
    else
        mkdir -p "$(dirname "$STATE_DIR")"
        mkdir -m 700 "$STATE_DIR"
    fi
}

write_config() {
    ensure_state_dir
    mkdir -p "$STATE_DIR"/{data,tmp,user_files,format_schemas} "$LOG_DIR"
    cat > "$CONFIG" <<EOF
<?xml version="1.0"?>
<!-- Written by scripts/clickhouse.sh; rewritten on every start. -->
<yandex>
    <logger>
        <level>information</level>
        <log>$LOG_DIR/clickhouse-server.log</log>
        <errorlog>$LOG_DIR/clickhouse-server.err.log</errorlog>
        <size>100M</size>
        <count>2</count>
    </logger>

    <listen_host>127.0.0.1</listen_host>
    <tcp_port>$TCP_PORT</tcp_port>
    <http_port>$HTTP_PORT</http_port>
    <!-- No interserver_http_port: no replication, no third port to collide. -->

    <max_connections>256</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <max_concurrent_queries>100</max_concurrent_queries>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
    <mark_cache_size>67108864</mark_cache_size>
    <!-- Ignored by 18.16 (no such setting yet); honoured by newer servers. -->
    <max_server_memory_usage>4000000000</max_server_memory_usage>

    <path>$STATE_DIR/data/</path>
    <tmp_path>$STATE_DIR/tmp/</tmp_path>
    <user_files_path>$STATE_DIR/user_files/</user_files_path>
    <format_schema_path>$STATE_DIR/format_schemas/</format_schema_path>
    <users_config>$STATE_DIR/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
    <umask>022</umask>

    <!-- Tests drop tables and partitions freely. -->
    <max_table_size_to_drop>0</max_table_size_to_drop>
    <max_partition_size_to_drop>0</max_partition_size_to_drop>
</yandex>
EOF
    cat > "$STATE_DIR/users.xml" <<EOF
<?xml version="1.0"?>
<!-- Written by scripts/clickhouse.sh; rewritten on every start. -->
<yandex>
    <profiles>
        <default>
            <max_memory_usage>$MAX_MEMORY_USAGE</max_memory_usage>
            <use_uncompressed_cache>0</use_uncompressed_cache>
            <load_balancing>random</load_balancing>
            <allow_experimental_low_cardinality_type>1</allow_experimental_low_cardinality_type>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
EOF
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local t0 pid user
    t0="$(now_ms)"
    install_packages

    pid="$(current_pid)"
    if [[ -n "$pid" ]] && ping_ok; then
        echo "$pid" > "$PID_FILE"
        log "already running (pid $pid, http $HTTP_PORT, tcp $TCP_PORT)"
        echo "CLICKHOUSE_DSN=$DSN"
        return 0
    fi
    # A half-started or hung leftover of ours: clear it before starting again.
    if [[ -n "$(server_pids)" ]]; then
        log "found a leftover server for $STATE_DIR that does not answer; stopping it"
        stop_server
    fi
    rm -f "$PID_FILE"
    local port
    for port in "$TCP_PORT" "$HTTP_PORT"; do
        if port_busy "$port"; then
            die "port $port on 127.0.0.1 is already in use; set CLICKHOUSE_TCP_PORT/CLICKHOUSE_HTTP_PORT"
        fi
    done

    write_config
    user="$(run_as_user)"
    if [[ "$user" != "$(id -un)" ]]; then
        chown -R "$user:" "$STATE_DIR"
    fi

    local t_launch
    t_launch="$(now_ms)"
    local -a launcher=()
    if [[ "$user" != "$(id -un)" ]]; then
        # setpriv execs in place, so $! is the server's own pid.
        launcher=(setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups --)
    fi
    # Not --daemon: a plain background job, so $! is the server's pid and what
    # it prints before its logger is up lands in stdout.log.
    (
        cd "$STATE_DIR"
        exec nohup "${launcher[@]}" "$SERVER_BIN" --config-file="$CONFIG" \
            </dev/null >>"$LOG_DIR/stdout.log" 2>&1
    ) &
    pid=$!
    echo "$pid" > "$PID_FILE"
    log "launched pid $pid as $user (tcp $TCP_PORT, http $HTTP_PORT, state $STATE_DIR)"

    local deadline=$(( $(now_ms) + START_TIMEOUT * 1000 ))
    until ping_ok; do
        if ! pid_alive "$pid"; then
            log "server exited during startup"
            log_tail
            if [[ "$user" != "$(id -un)" ]]; then
                log "(it ran as '$user': every parent of $STATE_DIR must be searchable by that user, or set CLICKHOUSE_RUN_AS)"
            fi
            rm -f "$PID_FILE"
            exit 1
        fi
        if (( $(now_ms) > deadline )); then
            log "no 'Ok.' from http://127.0.0.1:$HTTP_PORT/ping after ${START_TIMEOUT}s"
            log_tail
            stop_server
            exit 1
        fi
        sleep 0.05
    done
    log "ping Ok. after $(( $(now_ms) - t_launch )) ms"

    local version
    if ! version="$("$CLIENT_BIN" --host 127.0.0.1 --port "$TCP_PORT" --user default \
            -q 'SELECT version()' </dev/null 2>&1)"; then
        log "native protocol check failed: $version"
        log_tail
        stop_server
        exit 1
    fi
    log "ClickHouse $version ready on the native port in $(( $(now_ms) - t0 )) ms total"
    echo "CLICKHOUSE_DSN=$DSN"
}

# SIGTERM every server of this state dir, wait, then SIGKILL.
stop_server() {
    kill_servers
    rm -f "$PID_FILE"
}

kill_servers() {
    local pids p deadline
    # Only processes whose command line is a clickhouse-server: a stale pid
    # file may name a recycled pid.
    pids="$( { cat "$PID_FILE" 2>/dev/null || true; server_pids; } | sort -u)"
    local -a live=()
    for p in $pids; do
        if is_server_pid "$p"; then
            live+=("$p")
        fi
    done
    if [[ ${#live[@]} -eq 0 ]]; then
        return 0
    fi
    log "sending SIGTERM to ${live[*]}"
    kill -TERM "${live[@]}" 2>/dev/null || true
    deadline=$(( $(now_ms) + STOP_TIMEOUT * 1000 ))
    while (( $(now_ms) < deadline )); do
        local any=0
        for p in "${live[@]}"; do
            pid_alive "$p" && any=1
        done
        [[ "$any" -eq 0 ]] && return 0
        sleep 0.1
    done
    log "still running after ${STOP_TIMEOUT}s; sending SIGKILL"
    kill -KILL "${live[@]}" 2>/dev/null || true
    for p in "${live[@]}"; do
        while pid_alive "$p"; do sleep 0.05; done
    done
}

cmd_stop() {
    local t0
    t0="$(now_ms)"
    stop_server
    rm -rf -- "$STATE_DIR"
    log "stopped; removed $STATE_DIR ($(( $(now_ms) - t0 )) ms)"
}

cmd_status() {
    local pid
    pid="$(current_pid)"
    if [[ -n "$pid" ]] && ping_ok; then
        log "running (pid $pid, http $HTTP_PORT, tcp $TCP_PORT, state $STATE_DIR)"
        echo "CLICKHOUSE_DSN=$DSN"
        return 0
    fi
    if [[ -n "$pid" ]]; then
        log "pid $pid is alive but http://127.0.0.1:$HTTP_PORT/ping does not answer"
        return 1
    fi
    log "not running"
    return 3
}

main() {
    check_settings
    case "${1:-}" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        *) echo "usage: $0 {start|stop|status}" >&2; exit 2 ;;
    esac
}

main "$@"

#!/usr/bin/env bash
# A highly available PostgreSQL on this machine, from Debian's packages: a
# pg_auto_failover monitor and two data nodes (a primary and a synchronous
# standby, streaming replication, synchronous_commit = on), each its own
# data directory and port on 127.0.0.1. The monitor promotes the standby
# when the primary dies and drops synchronous replication when the standby
# dies; a node that comes back rejoins as the standby.
#
#   scripts/pg-ha.sh start DIR [ports=M,P1,P2] [timeouts=fast|default] [SETTING=VALUE ...]
#                                      monitor, node 1 (the first primary), node 2; prints the connection string
#   scripts/pg-ha.sh stop DIR          stops everything
#   scripts/pg-ha.sh kill DIR N        SIGKILL node N's keeper and every PostgreSQL process of it (its machine died)
#   scripts/pg-ha.sh revive DIR N      starts node N's keeper again (it rejoins, as the standby after a failover)
#   scripts/pg-ha.sh freeze DIR N      SIGSTOP node N's PostgreSQL processes (its keeper runs on); thaw: SIGCONT
#   scripts/pg-ha.sh state DIR         each node's reported and assigned state and health, as the monitor sees them
#   scripts/pg-ha.sh wait DIR S1 S2 [SECONDS]
#                                      waits until node 1 reports state S1 and node 2 S2 (e.g. primary secondary; -: any)
#   scripts/pg-ha.sh conninfo DIR      the connection string: both nodes, target_session_attrs=read-write
#
# timeouts=fast (the default here) makes the monitor notice a dead node in
# about 3 s and wait 4 s for a lost primary to demote itself, instead of
# pg_auto_failover's 20 s and 30 s (docs/mwmq.md, "High availability").
# Settings such as fsync=off go to both nodes (ALTER SYSTEM on the first,
# copied by the standby's base backup). Authentication is `trust` from
# 127.0.0.1 only: every server listens on 127.0.0.1 and nowhere else.
# Run as root, the servers run as the `postgres` user, which owns DIR.
set -euo pipefail

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[ $# -ge 2 ] || usage
cmd=$1
dir=$2
shift 2

bindir=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
  if [ -x "$d/initdb" ]; then bindir=$d; break; fi
done
if [ -z "$bindir" ] || ! command -v pg_autoctl >/dev/null 2>&1; then
  echo "pg-ha.sh: needs PostgreSQL and pg_auto_failover (Debian: postgresql, pg-auto-failover-cli," >&2
  echo "  postgresql-NN-auto-failover; make test and make run-mq-ha install them)" >&2
  exit 1
fi
ver=$(basename "$(dirname "$bindir")")
if [ ! -f "/usr/share/postgresql/$ver/extension/pgautofailover.control" ]; then
  echo "pg-ha.sh: the pg_auto_failover extension for PostgreSQL $ver is missing (Debian: postgresql-$ver-auto-failover)" >&2
  exit 1
fi

[ -d "$dir" ] || mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- env XDG_CONFIG_HOME="$dir/xdg/config" XDG_DATA_HOME="$dir/xdg/data" \
      XDG_RUNTIME_DIR="$dir/xdg/run" PATH="$bindir:$PATH" "$@"
  else
    env XDG_CONFIG_HOME="$dir/xdg/config" XDG_DATA_HOME="$dir/xdg/data" XDG_RUNTIME_DIR="$dir/xdg/run" \
      PATH="$bindir:$PATH" "$@"
  fi
}

ports() { cat "$dir/ports"; }
port_of() { # monitor | 1 | 2
  local p
  IFS=, read -r -a p <"$dir/ports"
  case $1 in monitor) echo "${p[0]}" ;; 1) echo "${p[1]}" ;; 2) echo "${p[2]}" ;; esac
}
pgdata() { case $1 in monitor) echo "$dir/monitor" ;; *) echo "$dir/node$1" ;; esac; }
monitor_url() { echo "postgres://autoctl_node@127.0.0.1:$(port_of monitor)/pg_auto_failover?sslmode=disable"; }
conninfo() {
  echo "host=127.0.0.1,127.0.0.1 port=$(port_of 1),$(port_of 2) user=postgres dbname=mwmq target_session_attrs=read-write sslmode=disable"
}
on_monitor() { "$bindir/psql" -X -q -h 127.0.0.1 -p "$(port_of monitor)" -U postgres -d pg_auto_failover -tA "$@"; }
on_node() { local n=$1; shift; "$bindir/psql" -X -q -h 127.0.0.1 -p "$(port_of "$n")" -U postgres -d mwmq -tA "$@"; }

# Starts the keeper (or the monitor's service) of $1 in a session of its own.
run_keeper() {
  local what=$1 log
  log="$dir/$what.log"
  [ "$what" = monitor ] || log="$dir/node$what.log"
  as_owner setsid pg_autoctl run --pgdata "$(pgdata "$what")" >>"$log" 2>&1 </dev/null &
}

# The session (process group) of $1's keeper: the keeper and its PostgreSQL.
session_of() {
  local d
  d=$(pgdata "$1")
  pgrep -f -x "pg_autoctl run --pgdata $d" | head -1
}

# Waits (up to $3 s) until node $1's reported state is $2.
wait_node() {
  local n=$1 want=$2 limit=${3:-60} i got
  for ((i = 0; i < limit * 10; i++)); do
    got=$(on_monitor -c "SELECT reportedstate FROM pgautofailover.node WHERE nodename = 'node_$n'" 2>/dev/null || true)
    [ "$got" = "$want" ] && return 0
    sleep 0.1
  done
  echo "pg-ha.sh: node $n did not reach $want within $limit s (it reports '${got:-nothing}'):" >&2
  state >&2 || true
  return 1
}

# A line per node: its name, address, the state its keeper last reported
# (a dead node's stays what it was), the state the monitor assigned it, and
# the monitor's health check of its PostgreSQL (good, bad, unknown).
state() {
  local rows
  rows=$(on_monitor -F ' ' -c "SELECT nodename, nodehost || ':' || nodeport, reportedstate, goalstate,
    CASE health WHEN 1 THEN 'good' WHEN 0 THEN 'bad' ELSE 'unknown' END FROM pgautofailover.node ORDER BY nodeid")
  { echo "node address reported assigned health"; echo "$rows"; } | awk '{ printf "%-7s %-16s %-17s %-17s %s\n", $1, $2, $3, $4, $5 }'
}

start() {
  local timeouts=fast list="" settings=()
  for s in "$@"; do
    case $s in
      ports=*) list=${s#ports=} ;;
      timeouts=*) timeouts=${s#timeouts=} ;;
      *=*) settings+=("$s") ;;
      *) usage ;;
    esac
  done
  case $timeouts in fast | default) ;; *) echo "pg-ha.sh: timeouts=fast or timeouts=default" >&2; exit 2 ;; esac
  if [ -z "$list" ]; then
    list=$(python3 -c 'import socket
ss=[socket.socket() for _ in range(3)]
for s in ss: s.bind(("127.0.0.1",0))
print(",".join(str(s.getsockname()[1]) for s in ss))')
  fi
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || { echo "pg-ha.sh: no postgres user (install the postgresql package)" >&2; exit 1; }
    chown postgres "$dir"
    chmod 700 "$dir"
    if ! runuser -u postgres -- test -x "$dir"; then
      echo "pg-ha.sh: the postgres user cannot reach $dir (a parent directory is private: chmod 755 it, or use a directory whose parents others may enter, such as /tmp/pg-ha)" >&2
      exit 1
    fi
  fi
  if [ -f "$dir/ports" ]; then
    echo "pg-ha.sh: $dir holds a cluster already (stop it and remove the directory first)" >&2
    exit 1
  fi
  echo "$list" >"$dir/ports"
  as_owner mkdir -p "$dir/xdg/config" "$dir/xdg/data" "$dir/xdg/run"
  local common=(--pgctl "$bindir/pg_ctl" --hostname 127.0.0.1 --auth trust --no-ssl)

  as_owner pg_autoctl create monitor --pgdata "$(pgdata monitor)" --pgport "$(port_of monitor)" \
    --listen 127.0.0.1 "${common[@]}" >"$dir/create-monitor.log" 2>&1 || {
    echo "pg-ha.sh: the monitor was not created:" >&2; tail -20 "$dir/create-monitor.log" >&2; exit 1; }
  run_keeper monitor
  for _ in $(seq 200); do on_monitor -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.1; done
  if [ "$timeouts" = fast ]; then
    # Seen dead after ~3 s without a report and 1 failed check; a lost
    # primary has 4 s to demote itself (its keeper gives up after 2 s
    # without the monitor and the standby) before the standby is promoted.
    on_monitor -c "ALTER SYSTEM SET pgautofailover.health_check_period = 1000" \
      -c "ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000" \
      -c "ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1" \
      -c "ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500" \
      -c "ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 3000" \
      -c "ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 4000" \
      -c "SELECT pg_reload_conf()" >/dev/null
  fi

  local n
  for n in 1 2; do
    as_owner pg_autoctl create postgres --pgdata "$(pgdata "$n")" --pgport "$(port_of "$n")" --listen 127.0.0.1 \
      --name "node_$n" --dbname mwmq --monitor "$(monitor_url)" "${common[@]}" >"$dir/create-node$n.log" 2>&1 || {
      echo "pg-ha.sh: node $n was not created:" >&2; tail -20 "$dir/create-node$n.log" >&2; exit 1; }
    if [ "$timeouts" = fast ]; then
      as_owner pg_autoctl config set --pgdata "$(pgdata "$n")" timeout.network_partition_timeout 2 >/dev/null
    fi
    run_keeper "$n"
    if [ "$n" = 1 ]; then
      wait_node 1 single 60
      for _ in $(seq 300); do on_node 1 -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.1; done
      if [ ${#settings[@]} -gt 0 ]; then
        local s
        for s in "${settings[@]}"; do on_node 1 -c "ALTER SYSTEM SET ${s%%=*} = '${s#*=}'" >/dev/null; done
        on_node 1 -c "SELECT pg_reload_conf()" >/dev/null
      fi
    fi
  done
  wait_node 1 primary 90
  wait_node 2 secondary 90
  conninfo
}

# Every process working in DIR (PostgreSQL's work in their data directory,
# and its children call setsid: they are not in their keeper's session).
processes_in() {
  local p cwd
  for p in /proc/[0-9]*; do
    cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
    case "$cwd" in "$1" | "$1"/* | "$1 (deleted)" | "$1"/*" (deleted)") echo "${p#/proc/}" ;; esac
  done
}

# SIGKILLs node (or monitor) $1: its keeper's session and every process in its data directory.
kill_node() {
  local sid pids
  sid=$(session_of "$1")
  pids=$(processes_in "$(pgdata "$1")")
  [ -n "$sid" ] && pkill -KILL -s "$sid" 2>/dev/null || true
  if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
  [ -n "$sid$pids" ]
}

stop() {
  [ -f "$dir/ports" ] || return 0
  local n d pids
  # Frozen processes neither stop nor die of their postmaster's death.
  pids=$(processes_in "$dir")
  if [ -n "$pids" ]; then kill -CONT $pids 2>/dev/null || true; fi
  for n in 2 1 monitor; do
    d=$(pgdata "$n")
    [ -d "$d" ] || continue
    as_owner timeout 30 pg_autoctl stop --pgdata "$d" >/dev/null 2>&1 || true
  done
  for n in 2 1 monitor; do
    for _ in $(seq 100); do [ -n "$(session_of "$n")" ] || break; sleep 0.1; done
    kill_node "$n" || true
  done
  pids=$(processes_in "$dir")
  if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
}

signal_postgres() { # SIGNAL N: every PostgreSQL process of node N
  local pid
  pid=$(head -1 "$(pgdata "$2")/postmaster.pid" 2>/dev/null || true)
  [ -n "$pid" ] || { echo "pg-ha.sh: node $2 runs no PostgreSQL" >&2; exit 1; }
  kill "-$1" "$pid" $(pgrep -P "$pid") 2>/dev/null || true
}

case "$cmd" in
  start) start "$@" ;;
  stop) stop ;;
  kill)
    [ $# = 1 ] || usage
    kill_node "$1" || { echo "pg-ha.sh: node $1 is not running" >&2; exit 1; }
    ;;
  revive)
    [ $# = 1 ] || usage
    [ -z "$(session_of "$1")" ] || { echo "pg-ha.sh: node $1 is running" >&2; exit 1; }
    run_keeper "$1"
    ;;
  freeze) [ $# = 1 ] || usage; signal_postgres STOP "$1" ;;
  thaw) [ $# = 1 ] || usage; signal_postgres CONT "$1" ;;
  state) state ;;
  wait)
    [ $# -ge 2 ] || usage
    [ "$1" = - ] || wait_node 1 "$1" "${3:-60}"
    [ "$2" = - ] || wait_node 2 "$2" "${3:-60}"
    ;;
  conninfo) conninfo ;;
  ports) ports ;;
  *) usage ;;
esac

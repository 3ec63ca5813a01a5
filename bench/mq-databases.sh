#!/usr/bin/env bash
# Queues over several databases, in one run: mwmq (async engine) in front of
# one PostgreSQL, then of two ([[databases]]), each server with fsync and
# synchronous_commit on; 16 queues, SENDs spread over them by
# redis-benchmark (`-r 16`, queue names q:000000000000 ...), then POPs.
# Printed: requests per second, p50 and p99 in ms, and two / one.
#
# DB_CPUS=0.5 gives each PostgreSQL server a CPU quota of its own (a cgroup:
# as if each ran on a machine of half a core), so that the databases, not
# this machine's two cores shared by everything, are what limits; unset,
# every process shares the cores.
#
# Usage: bench/mq-databases.sh [requests]    (env: CLIENTS, default 32; DB_CPUS)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-40000}
CLIENTS=${CLIENTS:-32}
BIN=target/release
PY=.venv/bin/python
throwaway_postgres mwmq-dbs
pg2="$work/pg2"
trap 'scripts/postgres.sh stop "$pg" >/dev/null 2>&1 || true; scripts/postgres.sh stop "$pg2" >/dev/null 2>&1 || true; cleanup' EXIT INT TERM
db2=$(scripts/postgres.sh start "$pg2")
groups=()
if [ -n "${DB_CPUS:-}" ]; then
  # A cgroup with a CPU quota per server; backends forked later inherit it.
  quota=$("$PY" -c "print(int($DB_CPUS * 100000))")
  for d in "$pg" "$pg2"; do
    pm=$(head -1 "$d/data/postmaster.pid")
    if [ -d /sys/fs/cgroup/cpu ]; then
      g=/sys/fs/cgroup/cpu/mwlab-db-$pm
      mkdir -p "$g"
      echo "$quota" >"$g/cpu.cfs_quota_us"
    else
      g=/sys/fs/cgroup/mwlab-db-$pm
      mkdir -p "$g"
      echo "$quota 100000" >"$g/cpu.max"
    fi
    for p in "$pm" $(pgrep -P "$pm"); do echo "$p" >"$g/cgroup.procs"; done
    groups+=("$g")
  done
fi
release_groups() {
  for g in "${groups[@]}"; do
    for p in $(cat "$g/cgroup.procs" 2>/dev/null); do echo "$p" >"$(dirname "$g")/cgroup.procs" 2>/dev/null || true; done
    rmdir "$g" 2>/dev/null || true
  done
}
trap 'scripts/postgres.sh stop "$pg" >/dev/null 2>&1 || true; scripts/postgres.sh stop "$pg2" >/dev/null 2>&1 || true; release_groups; cleanup' EXIT INT TERM
cat >"$work/two.toml" <<TOML
[[databases]]
name = "a"
url = "$db"
[[databases]]
name = "b"
url = "$db2"
TOML

# The default threads: half the cores (one loop here), loop_db connections per database.
ONE=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$ONE" --db "$db" --log warn & pids+=($!)
TWO=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$TWO" --config "$work/two.toml" --log warn & pids+=($!)
wait_port "$ONE"
wait_port "$TWO"
for p in "$ONE" "$TWO"; do
  for i in $(seq 0 15); do redis-cli -p "$p" QCREATE "$(printf 'q:%012d' "$i")" >/dev/null; done
done
spread=$(redis-cli -p "$TWO" INFO | tr -d '\r' | grep '^databases:')
rb() { # PORT ARGS... -> "rate p50 p99"
  local port=$1
  shift
  redis-benchmark -p "$port" -c "$CLIENTS" -n "$N" -r 16 --csv "$@" 2>/dev/null | tail -1 |
    "$PY" -c "import csv,sys; r=next(csv.reader(sys.stdin)); print(f'{float(r[1]):.0f} {float(r[4]):.2f} {float(r[6]):.2f}')"
}
echo "16 queues, $CLIENTS connections, $N requests each; one database vs two ($spread)${DB_CPUS:+; each server limited to $DB_CPUS CPU}"
printf '%-8s %10s %8s %8s %10s %8s %8s %8s\n' "" "one/s" "p50 ms" "p99 ms" "two/s" "p50 ms" "p99 ms" "ratio"
for cmd in SEND POP; do
  args=("$cmd" "q:__rand_int__")
  [ "$cmd" = SEND ] && args+=("$(printf 'x%.0s' $(seq 128))")
  read -r a a50 a99 <<<"$(rb "$ONE" "${args[@]}")"
  read -r b b50 b99 <<<"$(rb "$TWO" "${args[@]}")"
  printf '%-8s %10s %8s %8s %10s %8s %8s %8s\n' "$cmd" "$a" "$a50" "$a99" "$b" "$b50" "$b99" \
    "$("$PY" -c "print(f'{$b/$a:.2f}')")"
done

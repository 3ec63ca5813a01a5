#!/usr/bin/env bash
# The cost of a synchronous standby, in one run: mwmq (async engine) and
# pgbench running mwmq's INSERT, each against a lone PostgreSQL and against a
# primary whose commits wait for a synchronous standby (scripts/pg-ha.sh:
# pg_auto_failover, both nodes on this machine). Both servers have fsync and
# synchronous_commit on; mwmq and pgbench reach each over its unix socket.
#
#   SEND   redis-benchmark, CLIENTS connections, 128 B bodies   vs  pgbench -c CLIENTS, mwmq's INSERT
#
# Printed: requests per second, p50 and p99 in ms, for each database, and
# with-standby / alone.
#
# Usage: bench/mq-standby.sh [requests]    (env: CLIENTS, default "8 32")
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-20000}
BIN=target/release
PY=.venv/bin/python
throwaway_postgres mwmq-standby
ha="$work/ha"
trap 'scripts/postgres.sh stop "$pg" >/dev/null 2>&1 || true; scripts/pg-ha.sh stop "$ha" >/dev/null 2>&1 || true; cleanup' EXIT INT TERM
scripts/pg-ha.sh start "$ha" timeouts=default >/dev/null
P1=$(cut -d, -f2 "$ha/ports")
dbha="host=/var/run/postgresql port=$P1 user=postgres dbname=mwmq"
psql -X -qtA -c "SHOW synchronous_standby_names" "$dbha" | grep -q . || { echo "no synchronous standby" >&2; exit 1; }

MQ=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQ" --db "$db" --log warn & pids+=($!)
MQHA=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQHA" --db "$dbha" --log warn & pids+=($!)
wait_port "$MQ"
wait_port "$MQHA"
for p in "$MQ" "$MQHA"; do
  redis-cli -p "$p" QCREATE mq >/dev/null
  redis-cli -p "$p" QCREATE pg >/dev/null
done
. bench/mqlib.sh
mq_statements

ratio() { "$PY" -c "print(f'{$1/$2:.2f}')"; }
echo "SEND: alone vs with a synchronous standby (the same machine), $N requests each"
printf '%-22s %10s %8s %8s %10s %8s %8s %8s\n' "" "alone/s" "p50 ms" "p99 ms" "standby/s" "p50 ms" "p99 ms" "ratio"
for CLIENTS in ${CLIENTS:-8 32}; do
  read -r a a50 a99 <<<"$(PORT=$MQ rb_run SEND mq "$BODY")"
  read -r s s50 s99 <<<"$(PORT=$MQHA rb_run SEND mq "$BODY")"
  printf '%-22s %10s %8s %8s %10s %8s %8s %8s\n' "mwmq, $CLIENTS conns" "$a" "$a50" "$a99" "$s" "$s50" "$s99" "$(ratio "$s" "$a")"
  read -r a a50 a99 <<<"$(pgbench_run "$work/send.sql")"
  read -r s s50 s99 <<<"$(pg=/var/run/postgresql PGPORT=$P1 pgbench_run "$work/send.sql")"
  printf '%-22s %10s %8s %8s %10s %8s %8s %8s\n' "pgbench, $CLIENTS conns" "$a" "$a50" "$a99" "$s" "$s50" "$s99" "$(ratio "$s" "$a")"
done

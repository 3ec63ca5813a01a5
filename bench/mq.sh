#!/usr/bin/env bash
# mwmq against the database's own limit, on one PostgreSQL in one run
# (fsync and synchronous_commit on: every acknowledged SEND is durable):
#
#   SEND       redis-benchmark, 8 connections, 128 B bodies   vs  pgbench -c 8 running mwmq's INSERT
#   POP        redis-benchmark, 8 connections                 vs  pgbench -c 8 running mwmq's DELETE ... SKIP LOCKED
#   RECV+ACK   mwload -P mq, 8 connections, RECV then its ACK  vs  pgbench -c 8 running the UPDATE, then the DELETE
#   SEND pool, POP pool: the same through a second mwmq with --engine pool (the seed's
#   net thread, queue, workers and pool; WORKERS workers) beside the default async engine
#
# Printed: requests (or message pairs) per second, p50 and p99 in ms, and
# mwmq / PostgreSQL. For scale: the seed report's best was 937 requests/s.
#
# Usage: bench/mq.sh [requests]    (env: WORKERS (pool engine), CLIENTS)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-40000}
WORKERS=${WORKERS:-8}
CLIENTS=${CLIENTS:-8}
BIN=target/release
PY=.venv/bin/python
throwaway_postgres mwmq-bench

MQ=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQ" --db "$db" --engine async --log warn & pids+=($!)
MQPID=$!
wait_port "$MQ"
# The seed's engine beside it (both batch up to 32 waiting requests).
MQB=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQB" --db "$db" --engine pool --workers "$WORKERS" --db-pool "$WORKERS" --log warn & pids+=($!)
MQBPID=$!
wait_port "$MQB"
redis-cli -p "$MQ" QCREATE mq >/dev/null
redis-cli -p "$MQ" QCREATE pg >/dev/null
. bench/mqlib.sh
mq_statements

row() {  # name "mq-rate p50 p99" "pg-rate p50 p99" [mwmq CPU us per request]
  read -r mr m50 m99 <<<"$2"
  read -r pr p50 p99 <<<"$3"
  printf '%-14s %10s %8s %8s %12s %8s %8s %8s %10s\n' "$1" "$mr" "$m50" "$m99" "$pr" "$p50" "$p99" \
    "$("$PY" -c "print(f'{$mr/$pr:.2f}')")" "${4:--}"
}

# cpu_per_request PID REQUESTS TICKS_BEFORE -> the process's CPU (user + system) per request, in us
cpu_per_request() {
  "$PY" -c "import os; print(f'{($(cpu_ticks "$1") - $3) / os.sysconf(\"SC_CLK_TCK\") * 1e6 / $2:.1f}')"
}

echo "mwmq (async engine; pool engine: $WORKERS workers, pool $WORKERS) vs PostgreSQL's own rate for the same statements (pgbench -c $CLIENTS), $N requests each"
printf '%-14s %10s %8s %8s %12s %8s %8s %8s %10s\n' "" "mwmq/s" "p50 ms" "p99 ms" "postgres/s" "p50 ms" "p99 ms" "ratio" \
  "mwmq CPU"
t=$(cpu_ticks "$MQPID"); send_mq=$(rb_run SEND mq "$BODY"); send_cpu=$(cpu_per_request "$MQPID" "$N" "$t")
send_pg=$(pgbench_run "$work/send.sql")
row SEND "$send_mq" "$send_pg" "$send_cpu"
t=$(cpu_ticks "$MQBPID"); sb=$(PORT=$MQB rb_run SEND mq "$BODY")
row "SEND pool" "$sb" "$send_pg" "$(cpu_per_request "$MQBPID" "$N" "$t")"
t=$(cpu_ticks "$MQPID"); pop_mq=$(rb_run POP mq); pop_cpu=$(cpu_per_request "$MQPID" "$N" "$t")
pop_pg=$(pgbench_run "$work/pop.sql")
row POP "$pop_mq" "$pop_pg" "$pop_cpu"
rb_run SEND mq "$BODY" >/dev/null
t=$(cpu_ticks "$MQBPID"); pb=$(PORT=$MQB rb_run POP mq)
row "POP pool" "$pb" "$pop_pg" "$(cpu_per_request "$MQBPID" "$N" "$t")"
# Refill both queues for RECV+ACK (mwload receives from q0).
redis-cli -p "$MQ" QCREATE q0 >/dev/null
rb_run SEND q0 "$BODY" >/dev/null
pgbench_run "$work/send.sql" >/dev/null
# Dead rows of the runs before are vacuumed first, so that no VACUUM (the
# autovacuum's or an mwmq's) lands in one engine's run and not the other's.
vacuum_now() { as_pg "$PGBIN/psql" -h "$pg" -U postgres -d mwmq -qAtX -c "VACUUM mwmq.mwmq_messages" >/dev/null; }
vacuum_now
t=$(cpu_ticks "$MQPID"); ra_mq=$(recvack_run); ra_cpu=$(cpu_per_request "$MQPID" $((2 * N)) "$t")
ra_pg=$(pgbench_run "$work/recvack.sql")
row RECV+ACK "$ra_mq" "$ra_pg" "$ra_cpu"
rb_run SEND q0 "$BODY" >/dev/null
vacuum_now
t=$(cpu_ticks "$MQBPID"); ra_pool=$(PORT=$MQB recvack_run)
row "RECV+ACK pool" "$ra_pool" "$ra_pg" "$(cpu_per_request "$MQBPID" $((2 * N)) "$t")"
echo "(mwmq CPU: the mwmq process's user + system time per request, us; a RECV and its ACK are two requests)"
echo "(pool: mwmq --engine pool, the seed's architecture. RECV+ACK: message pairs per second; latency per request for mwmq, per pair for"
echo " PostgreSQL; the seed report's best: 937 requests/s)"

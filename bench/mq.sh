#!/usr/bin/env bash
# mwmq against the database's own limit, on one PostgreSQL in one run
# (fsync and synchronous_commit on: every acknowledged SEND is durable):
#
#   SEND       redis-benchmark, 8 connections, 128 B bodies   vs  pgbench -c 8 running mwmq's INSERT
#   POP        redis-benchmark, 8 connections                 vs  pgbench -c 8 running mwmq's DELETE ... SKIP LOCKED
#   RECV+ACK   mwload -P mq, 8 connections, RECV then its ACK  vs  pgbench -c 8 running the UPDATE, then the DELETE
#   SEND b1, POP b1: the same through a second mwmq with --batch 1 (no batching; the default is 32)
#
# Printed: requests (or message pairs) per second, p50 and p99 in ms, and
# mwmq / PostgreSQL. For scale: the seed report's best was 937 requests/s.
#
# Usage: bench/mq.sh [requests]    (env: WORKERS, CLIENTS)
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
"$BIN/mwmq" --listen "127.0.0.1:$MQ" --db "$db" --workers "$WORKERS" --db-pool "$WORKERS" --log warn & pids+=($!)
MQPID=$!
wait_port "$MQ"
# The same without batching (--batch 1, the seed's one statement per request); the
# default carries out up to 32 waiting SENDs (or POPs, ACKs) in one statement.
MQB=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQB" --db "$db" --workers "$WORKERS" --db-pool "$WORKERS" --batch 1 --log warn & pids+=($!)
MQBPID=$!
wait_port "$MQB"
redis-cli -p "$MQ" QCREATE mq >/dev/null
redis-cli -p "$MQ" QCREATE pg >/dev/null
. bench/mqlib.sh
mq_statements

row() {  # name "mq-rate p50 p99" "pg-rate p50 p99" [mwmq CPU us per request]
  read -r mr m50 m99 <<<"$2"
  read -r pr p50 p99 <<<"$3"
  printf '%-10s %10s %8s %8s %12s %8s %8s %8s %10s\n' "$1" "$mr" "$m50" "$m99" "$pr" "$p50" "$p99" \
    "$("$PY" -c "print(f'{$mr/$pr:.2f}')")" "${4:--}"
}

# cpu_per_request PID REQUESTS TICKS_BEFORE -> the process's CPU (user + system) per request, in us
cpu_per_request() {
  "$PY" -c "import os; print(f'{($(cpu_ticks "$1") - $3) / os.sysconf(\"SC_CLK_TCK\") * 1e6 / $2:.1f}')"
}

echo "mwmq ($WORKERS workers, pool $WORKERS) vs PostgreSQL's own rate for the same statements (pgbench -c $CLIENTS), $N requests each"
printf '%-10s %10s %8s %8s %12s %8s %8s %8s %10s\n' "" "mwmq/s" "p50 ms" "p99 ms" "postgres/s" "p50 ms" "p99 ms" "ratio" \
  "mwmq CPU"
t=$(cpu_ticks "$MQPID"); send_mq=$(rb_run SEND mq "$BODY"); send_cpu=$(cpu_per_request "$MQPID" "$N" "$t")
send_pg=$(pgbench_run "$work/send.sql")
row SEND "$send_mq" "$send_pg" "$send_cpu"
t=$(cpu_ticks "$MQBPID"); sb=$(PORT=$MQB rb_run SEND mq "$BODY")
row "SEND b1" "$sb" "$send_pg" "$(cpu_per_request "$MQBPID" "$N" "$t")"
t=$(cpu_ticks "$MQPID"); pop_mq=$(rb_run POP mq); pop_cpu=$(cpu_per_request "$MQPID" "$N" "$t")
pop_pg=$(pgbench_run "$work/pop.sql")
row POP "$pop_mq" "$pop_pg" "$pop_cpu"
rb_run SEND mq "$BODY" >/dev/null
t=$(cpu_ticks "$MQBPID"); pb=$(PORT=$MQB rb_run POP mq)
row "POP b1" "$pb" "$pop_pg" "$(cpu_per_request "$MQBPID" "$N" "$t")"
# Refill both queues for RECV+ACK (mwload receives from q0).
redis-cli -p "$MQ" QCREATE q0 >/dev/null
rb_run SEND q0 "$BODY" >/dev/null
pgbench_run "$work/send.sql" >/dev/null
t=$(cpu_ticks "$MQPID"); ra_mq=$(recvack_run); ra_cpu=$(cpu_per_request "$MQPID" $((2 * N)) "$t")
ra_pg=$(pgbench_run "$work/recvack.sql")
row RECV+ACK "$ra_mq" "$ra_pg" "$ra_cpu"
echo "(mwmq CPU: the mwmq process's user + system time per request, us; a RECV and its ACK are two requests)"
echo "(b1: mwmq --batch 1, no batching; the default batches up to 32. RECV+ACK: message pairs per second; latency per request for mwmq, per pair for"
echo " PostgreSQL; the seed report's best: 937 requests/s)"

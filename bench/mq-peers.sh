#!/usr/bin/env bash
# mwmq against its peers on one PostgreSQL (fsync and synchronous_commit on),
# the same number of connections, alternated in one run:
#
#   mwmq      SEND and POP by redis-benchmark (a client the project did not
#             write); RECV+ACK by mwload -P mq (redis-benchmark cannot ACK what
#             a RECV returned)
#   PGMQ      pgmq.send, pgmq.pop, pgmq.read + pgmq.delete by pgbench, PGMQ
#             installed from its own SQL (../shared/tools/pgmq; skipped, and
#             said, where it is not there)
#   raw       pgbench running mwmq's own statements (the database's own rate)
#
# each ROUNDS times, printed as medians: messages per second, p50 and p99 in
# ms, and CPU per message of mwmq, of PostgreSQL (all its processes) and of
# the client. Then mwmq / PGMQ and mwmq / raw.
#
# Usage: bench/mq-peers.sh [messages per run]   (env: CLIENTS=8, ROUNDS=3, PGMQ_DIR, MQ_ENGINE=async|pool,
#        BIN=directory of mwmq and mwload, default target/release: an older build for a before/after)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-20000}
CLIENTS=${CLIENTS:-8}
ROUNDS=${ROUNDS:-3}
BIN=${BIN:-target/release}
PY=.venv/bin/python
PGMQ_DIR=${PGMQ_DIR:-../shared/tools/pgmq}
throwaway_postgres mwmq-peers
. bench/mqlib.sh
MQ=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQ" --db "$db" --engine "${MQ_ENGINE:-async}" --log warn & pids+=($!)
MQPID=$!
wait_port "$MQ"
for q in mq pg q0; do redis-cli -p "$MQ" QCREATE "$q" >/dev/null; done
mq_statements
psql_() { as_pg env PGOPTIONS=-cclient_min_messages=warning "$PGBIN/psql" -h "$pg" -U postgres -d mwmq -qAtX "$@"; }
PGMQ=no
if [ -f "$PGMQ_DIR/pgmq.sql" ]; then
  cp "$PGMQ_DIR/pgmq.sql" "$work/pgmq.sql"
  for f in send pop; do cp "$PGMQ_DIR/$f.sql" "$work/pgmq-$f.sql"; done
  # (readdelete.sql there tests the read with psql's `\if :{?mid}`, which
  # pgbench does not know; the queue is filled first, so every read finds one.)
  printf '%s\n' "SELECT msg_id AS mid FROM pgmq.read('bench', 30, 1)" '\gset' \
    "SELECT pgmq.delete('bench', :mid::bigint);" >"$work/pgmq-readdelete.sql"
  chmod 644 "$work"/*.sql
  psql_ -c 'CREATE SCHEMA IF NOT EXISTS pgmq' -f "$work/pgmq.sql" >/dev/null
  psql_ -c "SELECT pgmq.create('bench')" >/dev/null
  PGMQ=yes
else
  echo "(PGMQ's SQL is not in $PGMQ_DIR: its rows are left out)"
fi
results="$work/results"
: >"$results"

# measure OP SYSTEM ROUND COMMAND... : runs the client, records rate, latency and CPU per message.
measure() {
  local op=$1 system=$2 round=$3
  shift 3
  local mq0 pg0 out
  mq0=$(cpu_ticks "$MQPID"); pg0=$(pg_ticks); mark_children "$work/cpu0"
  "$@" >"$work/out"
  mark_children "$work/cpu1"
  out=$(cat "$work/out")
  local mq1 pg1 cl0 cl1
  mq1=$(cpu_ticks "$MQPID"); pg1=$(pg_ticks)
  cl0=$(children_ticks "$work/cpu0"); cl1=$(children_ticks "$work/cpu1")
  local mqcpu=-
  [ "$system" = mwmq ] && mqcpu=$(us_per $((mq1 - mq0)) "$N")
  echo "$op $system $round $out $mqcpu $(us_per $((pg1 - pg0)) "$N") $(us_per $((cl1 - cl0)) "$N")" >>"$results"
}

fill() {  # N messages into each system's queue (not measured)
  rb_run SEND "$1" "$BODY" >/dev/null
  pgbench_run "$work/send.sql" >/dev/null
  if [ $PGMQ = yes ]; then pgbench_run "$work/pgmq-send.sql" >/dev/null; fi
}

echo "mwmq, PGMQ and PostgreSQL running mwmq's statements: $CLIENTS connections, $N messages a run, $ROUNDS rounds"
for round in $(seq "$ROUNDS"); do
  measure SEND mwmq "$round" rb_run SEND mq "$BODY"
  [ $PGMQ = yes ] && measure SEND PGMQ "$round" pgbench_run "$work/pgmq-send.sql"
  measure SEND raw "$round" pgbench_run "$work/send.sql"
done
for round in $(seq "$ROUNDS"); do
  measure POP mwmq "$round" rb_run POP mq
  [ $PGMQ = yes ] && measure POP PGMQ "$round" pgbench_run "$work/pgmq-pop.sql"
  measure POP raw "$round" pgbench_run "$work/pop.sql"
done
for round in $(seq "$ROUNDS"); do fill q0; done
for round in $(seq "$ROUNDS"); do
  measure RECV+ACK mwmq "$round" recvack_run
  [ $PGMQ = yes ] && measure RECV+ACK PGMQ "$round" pgbench_run "$work/pgmq-readdelete.sql"
  measure RECV+ACK raw "$round" pgbench_run "$work/recvack.sql"
done

"$PY" - "$results" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
ops = ["SEND", "POP", "RECV+ACK"]
systems = ["mwmq", "PGMQ", "raw"]
def med(vals):
    vals = [float(v) for v in vals if v != "-"]
    return st.median(vals) if vals else None
fmt = lambda v, p=0: "-" if v is None else f"{v:,.{p}f}"
print(f"{'':9} {'system':6} {'msg/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'CPU us/msg: mwmq':>17} {'PostgreSQL':>10} {'client':>7}")
for op in ops:
    best = {}
    for sysname in systems:
        r = [x for x in rows if x[0] == op and x[1] == sysname]
        if not r:
            continue
        rate, p50, p99 = med([x[3] for x in r]), med([x[4] for x in r]), med([x[5] for x in r])
        best[sysname] = rate
        print(f"{op:9} {sysname:6} {fmt(rate):>9} {fmt(p50, 2):>7} {fmt(p99, 2):>7} "
              f"{fmt(med([x[6] for x in r]), 1):>17} {fmt(med([x[7] for x in r]), 1):>10} {fmt(med([x[8] for x in r]), 1):>7}")
    ratios = [f"mwmq / {s} {best['mwmq'] / best[s]:.2f}x" for s in ("PGMQ", "raw") if s in best and "mwmq" in best]
    print(f"{'':9} {', '.join(ratios)}")
print("(RECV+ACK: message pairs per second; mwmq's latency is per request, PGMQ's and raw's per pair;")
print(" CPU per message: user + system time over the run divided by the messages, PostgreSQL's over all its processes)")
PY

#!/usr/bin/env bash
# What a queue's settings cost: the same queue (q0) measured plain, with
# RETAIN (acknowledged messages moved to the archive by the ACK or POP that
# removes them), with limits that never bind (CONCURRENCY 1000000 RATE
# 1000000/s: every RECV goes through mwmq_recv_ranked and takes the queue's
# advisory lock, and the rate's bucket is updated), with its messages
# in 64 ordered groups (SEND ... GROUP g<random 0..63>: a message waits for
# its group's older ones), with its messages of 8 priorities (SEND ...
# PRIORITY <random 0..7>: each RECV walks the priorities present from the
# highest), and with a retry backoff that never binds (QALTER q0 BACKOFF
# 1000 60000 JITTER 10: RECV's plain statements give each lease its
# backoff, in lease_until and visible_at), on one PostgreSQL (fsync on),
# the variants alternated round by round. With BEFORE=path/to/another/mwmq,
# that binary (an older build) serves a database of its own on the same
# PostgreSQL (mwmq_before) and its plain q0 is one more variant, "before":
# a plain queue's figures before and after a change, in the same run.
#
#   SEND       redis-benchmark, CLIENTS connections, 128 B bodies
#   POP        redis-benchmark, CLIENTS connections
#   RECV+ACK   mwload -P mq, CLIENTS connections, each RECV then its ACK
#
# Printed: the medians of the rounds (requests or pairs per second) and
# the median of each round's variant / plain. Also the live table's size at the end of the
# retaining rounds against the plain ones (the archive is a table of its own).
#
# Usage: bench/mq-features.sh [requests] [rounds]    (env: CLIENTS, BEFORE, VARIANTS="plain priority ...":
#        a subset, plain always among them; MWMQ: the mwmq binary measured, target/release/mwmq by default)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-20000}
ROUNDS=${2:-3}
CLIENTS=${CLIENTS:-8}
BIN=target/release
PY=.venv/bin/python
MWMQ=${MWMQ:-$BIN/mwmq}
[ -x "$MWMQ" ] && [ -x "$BIN/mwload" ] || { echo "build first: make build" >&2; exit 2; }
throwaway_postgres mwmq-features

MQ=$(free_port)
"$MWMQ" --listen "127.0.0.1:$MQ" --db "$db" --log warn & pids+=($!)
wait_port "$MQ"
. bench/mqlib.sh
redis-cli -p "$MQ" QCREATE q0 >/dev/null
DBNAME=mwmq
psql_q() { as_pg env PGOPTIONS=-csearch_path=mwmq "$PGBIN/psql" -h "$pg" -U postgres -d "$DBNAME" -qAtX -c "$1"; }
# shellcheck disable=SC2206
names=(${VARIANTS:-plain retain limits groups priority backoff})
[ "${names[0]}" = plain ] || names=(plain "${names[@]}")
if [ -n "${BEFORE:-}" ]; then
  DBNAME=postgres psql_q "CREATE DATABASE mwmq_before" >/dev/null
  MQB=$(free_port)
  "$BEFORE" --listen "127.0.0.1:$MQB" --db "${db/dbname=mwmq/dbname=mwmq_before}" --log warn & pids+=($!)
  wait_port "$MQB"
  redis-cli -p "$MQB" QCREATE q0 >/dev/null
  names+=(before)
fi

variant() {  # NAME: q0's settings for it
  local plain="RETAIN 0 CONCURRENCY 0 RATE 0 NOBACKOFF"
  # A new q0 each time: a queue that held messages of other priorities than
  # 0 stays marked (its statements walk the ten priorities from then on).
  if [ "$1" != before ]; then redis-cli -p "$MQ" QDROP q0 >/dev/null; redis-cli -p "$MQ" QCREATE q0 >/dev/null; fi
  case $1 in
    plain | groups | priority) redis-cli -p "$MQ" QALTER q0 $plain >/dev/null ;;
    retain) redis-cli -p "$MQ" QALTER q0 $plain RETAIN 600000 >/dev/null ;;
    limits) redis-cli -p "$MQ" QALTER q0 $plain CONCURRENCY 1000000 RATE 1000000/s >/dev/null ;;
    backoff) redis-cli -p "$MQ" QALTER q0 $plain BACKOFF 1000 60000 JITTER 10 >/dev/null ;;
  esac
}

sendargs() {  # VARIANT -> redis-benchmark's arguments for its SENDs
  case $1 in
    groups) echo "-r 64 SEND q0 $BODY GROUP g__rand_int__" ;;
    priority) echo "-r 8 SEND q0 $BODY PRIORITY __rand_int__" ;;
    *) echo "SEND q0 $BODY" ;;
  esac
}
echo "q0 ${names[*]}; $N requests each, $CLIENTS connections, $ROUNDS rounds" >&2
for r in $(seq "$ROUNDS"); do
  for v in "${names[@]}"; do
    variant "$v"
    if [ "$v" = before ]; then export PORT=$MQB DBNAME=mwmq_before; else unset PORT; DBNAME=mwmq; fi
    # Each variant starts from an empty queue: what a variant left (a grouped
    # queue's POPs take group heads only) would slow the next one's POPs.
    left=$(psql_q "WITH d AS (DELETE FROM mwmq_messages WHERE queue_id IN
                     (SELECT id FROM mwmq_queues WHERE name = 'q0') RETURNING 1)
                   SELECT count(*) FROM d")
    [ "$left" = 0 ] || echo "  ($left messages left by the variant before, deleted)" >&2
    psql_q "VACUUM mwmq_messages" >/dev/null
    # shellcheck disable=SC2046
    send=$(rb_run $(sendargs "$v"))
    pop=$(rb_run POP q0)
    # shellcheck disable=SC2046
    rb_run $(sendargs "$v") >/dev/null
    psql_q "VACUUM mwmq_messages" >/dev/null
    ra=$(recvack_run)
    echo "$v ${send%% *} ${pop%% *} ${ra%% *}" >> "$work/rows"
    echo "  round $r $v: SEND ${send%% *}/s POP ${pop%% *}/s RECV+ACK ${ra%% *} pairs/s" >&2
  done
done
unset PORT
DBNAME=mwmq
live=$(psql_q "SELECT pg_total_relation_size('mwmq_messages')")
archive=$(psql_q "SELECT pg_total_relation_size('mwmq_archive')")
kept=$(psql_q "SELECT count(*) FROM mwmq_archive")

"$PY" - "$work/rows" "$live" "$archive" "$kept" "${names[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
names = tuple(sys.argv[5:])
med, ratio = {}, {}
for v in names:
    got = [list(map(float, r[1:])) for r in rows if r[0] == v]
    med[v] = [statistics.median(x[k] for x in got) for k in range(3)]
# Each variant against the plain queue of its own round (the machine may
# drift between rounds: its disk, shared, slows under a long load).
rounds = [rows[i:i + len(names)] for i in range(0, len(rows), len(names))]
for v in names:
    per = []
    for rd in rounds:
        d = {r[0]: list(map(float, r[1:])) for r in rd}
        if v in d and "plain" in d:
            per.append([d[v][k] / d["plain"][k] for k in range(3)])
    ratio[v] = [statistics.median(x[k] for x in per) for k in range(3)]
print(f"{'':<8}{'SEND/s':>10}{'/plain':>8}{'POP/s':>10}{'/plain':>8}{'RECV+ACK':>10}{'/plain':>8}")
for v, m in med.items():
    q = ratio[v]
    print(f"{v:<8}{m[0]:>10.0f}{q[0]:>8.2f}{m[1]:>10.0f}{q[1]:>8.2f}{m[2]:>10.0f}{q[2]:>8.2f}")
print(f"(medians of the rounds; /plain: median of each round's ratio to that round's plain queue; RECV+ACK in pairs per second. At the end: mwmq_messages {int(sys.argv[2]) / 1e6:.1f} MB, "
      f"mwmq_archive {int(sys.argv[3]) / 1e6:.1f} MB holding {sys.argv[4]} acknowledged messages)")
PY

#!/usr/bin/env bash
# What schema 14's counting triggers cost RESP (sqlquota.rs: what SQL callers
# change is counted in stripes of their own, chosen by a setting the triggers
# read): SENDs into a queue with a quota, and POPs of its counted messages,
# with schema 11's trigger functions and schema 14's swapped in turn on one
# database, alternated rounds. pgbench runs mwmq's own statements (8 clients,
# fsync on), and redis-benchmark sends through mwmq. Printed: requests per
# second, and the median over the rounds of after/before.
#
# Usage: bench/mq-sqlquota.sh [ROUNDS]    (BIN=target/debug for a debug mwmq)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ROUNDS=${1:-5}
BIN=${BIN:-target/release}
throwaway_postgres mwmq-sqlquota
MQ=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQ" --db "$db" --log warn & pids+=($!)
wait_port "$MQ"
redis-cli -p "$MQ" QCREATE pg MAXMESSAGES 1000000000 >/dev/null
redis-cli -p "$MQ" QCREATE mq MAXMESSAGES 1000000000 >/dev/null
N=20000 CLIENTS=8 PY=${PY:-.venv/bin/python}
. bench/mqlib.sh
mq_statements

# The counting functions as schema 11 left them: every change in stripe pid % 16.
cat >"$work/before.sql" <<'SQL'
CREATE OR REPLACE FUNCTION mwmq.mwmq_count_in() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mwmq.mwmq_queue_counts AS c (queue_id, stripe, messages, bytes)
    VALUES (NEW.queue_id, pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.%) 16, 1, pg_catalog.octet_length(NEW.body))
    ON CONFLICT (queue_id, stripe) DO UPDATE
    SET messages = c.messages OPERATOR(pg_catalog.+) 1, bytes = c.bytes OPERATOR(pg_catalog.+) EXCLUDED.bytes;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION mwmq.mwmq_count_out() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mwmq.mwmq_queue_counts AS c (queue_id, stripe, messages, bytes)
    VALUES (OLD.queue_id, pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.%) 16, -1,
            0 OPERATOR(pg_catalog.-) pg_catalog.octet_length(OLD.body))
    ON CONFLICT (queue_id, stripe) DO UPDATE
    SET messages = c.messages OPERATOR(pg_catalog.-) 1, bytes = c.bytes OPERATOR(pg_catalog.+) EXCLUDED.bytes;
    RETURN NULL;
END $$;
SQL
# ... and as schema 14 made them (read back from the database mwmq migrated).
as_pg "$PGBIN/psql" -X -q -A -t -h "$pg" -U postgres -d mwmq -c \
  "SELECT pg_get_functiondef('mwmq.mwmq_count_in'::regproc) || ';' || chr(10) ||
          pg_get_functiondef('mwmq.mwmq_count_out'::regproc) || ';'" >"$work/after.sql"
grep -q "mwmq.sql_caller" "$work/after.sql" || { echo "the database is not at schema 14" >&2; exit 1; }
use() { as_pg "$PGBIN/psql" -X -q -h "$pg" -U postgres -d mwmq -f "$work/$1.sql" >/dev/null; }
rate() { set -- $1; echo "$1"; }

printf '%-6s %-7s %12s %12s %18s\n' round triggers "pgbench SEND" "pgbench POP" "redis-benchmark SEND"
: >"$work/rates"
for round in $(seq "$ROUNDS"); do
  for v in before after; do
    use "$v"
    s=$(rate "$(pgbench_run "$work/send.sql")")
    p=$(rate "$(pgbench_run "$work/pop.sql")")
    r=$(rate "$(rb_run SEND mq "$BODY")")
    printf '%-6s %-7s %12s %12s %18s\n' "$round" "$v" "$s" "$p" "$r"
    echo "$round $v $s $p $r" >>"$work/rates"
  done
done
"$PY" - "$work/rates" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {(r[0], r[1]): [float(x) for x in r[2:]] for r in rows}
rounds = sorted({r[0] for r in rows})
for i, what in enumerate(["pgbench SEND", "pgbench POP", "redis-benchmark SEND"]):
    ratios = [by[(k, "after")][i] / by[(k, "before")][i] for k in rounds]
    print(f"{what}: after/before median {statistics.median(ratios):.3f} "
          f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})")
PY

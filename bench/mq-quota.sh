#!/usr/bin/env bash
# What mwmq's quotas cost PostgreSQL: pgbench running mwmq's own SEND (INSERT)
# and POP (DELETE) on one PostgreSQL (fsync and synchronous_commit on, 8
# clients), with and without a quota on another queue, and a SEND into the
# queue with the quota (its messages are counted by row triggers), three
# alternated rounds. Printed: transactions per second.
#
# Usage: bench/mq-quota.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
throwaway_postgres mwmq-quota
MQ=$(free_port)
target/release/mwmq --listen "127.0.0.1:$MQ" --db "$db" --log warn & pids+=($!)
wait_port "$MQ"
redis-cli -p "$MQ" QCREATE pg >/dev/null
redis-cli -p "$MQ" QCREATE other >/dev/null
N=20000 CLIENTS=8 PY=.venv/bin/python
. bench/mqlib.sh
mq_statements
sed 's/name = '"'"'pg'"'"'/name = '"'"'other'"'"'/' "$work/send.sql" >"$work/sendq.sql"
chmod 644 "$work/sendq.sql"
run() {
  as_pg env PGOPTIONS="-c search_path=mwmq -c enable_bitmapscan=off -c enable_seqscan=off -c enable_sort=off" \
    "$PGBIN/pgbench" -n -h "$pg" -U postgres -M prepared -c 8 -j 2 -t 2500 -f "$1" mwmq 2>&1 |
    sed -n 's/.*tps = \([0-9.]*\) (without.*/\1/p' | xargs printf '%.0f'
}
printf '%-6s %-22s %10s %10s %18s\n' round "quota on another queue" SEND/s POP/s "SEND to it/s"
for round in 1 2 3; do
  for quota in 0 1000000000; do
    redis-cli -p "$MQ" QALTER other MAXMESSAGES "$quota" >/dev/null
    printf '%-6s %-22s %10s %10s %18s\n' "$round" "$([ "$quota" = 0 ] && echo no || echo yes)" \
      "$(run "$work/send.sql")" "$(run "$work/pop.sql")" "$(run "$work/sendq.sql")"
  done
done

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
HEX=$(printf '78%.0s' $(seq 128))
cat >"$work/send.sql" <<SQL
INSERT INTO mwmq_messages (queue_id, sender, receiver, body, visible_at, counted)
SELECT id, '', NULL, '\\x$HEX'::bytea, now(), (max_messages IS NOT NULL OR max_bytes IS NOT NULL)
FROM mwmq_queues WHERE name = 'pg' AND dropped_at IS NULL AND mwmq_room(id, max_messages, max_bytes, 128) RETURNING id;
SQL
sed 's/name = '"'"'pg'"'"'/name = '"'"'other'"'"'/' "$work/send.sql" >"$work/sendq.sql"
cat >"$work/pop.sql" <<'SQL'
DELETE FROM mwmq_messages m USING (SELECT queue_id, id FROM mwmq_messages
  WHERE queue_id = (SELECT id FROM mwmq_queues WHERE name = 'pg' AND dropped_at IS NULL)
  AND visible_at <= now() AND receiver IS NULL ORDER BY visible_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) c
WHERE m.queue_id = c.queue_id AND m.id = c.id RETURNING m.id, m.sender, m.body;
SQL
chmod 644 "$work"/*.sql
run() {
  as_pg env PGOPTIONS="-c enable_bitmapscan=off -c enable_seqscan=off -c enable_sort=off" \
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

#!/usr/bin/env bash
# Starts a throwaway PostgreSQL (unix socket only, in a scratch directory) and
# mwmq in front of it with its admin endpoint (/metrics, /stats, /healthz,
# /readyz, /ui), checks that a message goes through, prints every port it
# started and how to connect with redis-cli, and keeps running until Ctrl-C
# (or RUN_SECONDS, if set). Everything stops, and the scratch directory is
# removed, on exit.
#
# Ports (make run-mq MQ_PORT=6390 ...): MQ_PORT (clients, 6380), ADMIN_PORT
# (the admin endpoint, 9380); PostgreSQL listens on no TCP port. A port set
# is used or refused; a default that is taken is replaced by a free port,
# and the script says so. MWMQ_BIN names another mwmq than
# target/release/mwmq.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
BIN=$(repo_binary MWMQ_BIN mwmq run-mq)
choose_port MQ_PORT 6380
choose_port ADMIN_PORT 9380

work=$(mktemp -d /tmp/mwmq-run.XXXXXX)
chmod 755 "$work" # PostgreSQL runs as its own user and must reach its directory
pg="$work/pg"
stop_pg() { scripts/postgres.sh stop "$pg" >/dev/null 2>&1 || true; }
trap 'stop_pg; cleanup' EXIT INT TERM
db=$(scripts/postgres.sh start "$pg")
mwmq_admin_config "$ADMIN_PORT"
"$BIN" --config "$work/mwmq.toml" --listen "127.0.0.1:$MQ_PORT" --db "$db" --log warn & pids+=($!)
wait_port "$MQ_PORT" "${pids[-1]}"
wait_port "$ADMIN_PORT" "${pids[-1]}"

cli() { timeout 10 redis-cli -p "$MQ_PORT" "$@"; }
cli QCREATE hello >/dev/null
id=$(cli SEND hello "first message")
got=$(cli POP hello | tr '\n' ' ')
cat <<MSG

mwmq is listening on 127.0.0.1:$MQ_PORT (MQ_PORT)
$(mwmq_admin_banner "$ADMIN_PORT")
PostgreSQL: a unix socket in $pg (no TCP port)
self-check (QCREATE, SEND -> id $id, POP): $got

connect with redis-cli or any Redis client (in another terminal), for example:
  redis-cli -p $MQ_PORT QCREATE jobs
  redis-cli -p $MQ_PORT SEND jobs "hello"              # -> the message id
  redis-cli -p $MQ_PORT RECV jobs COUNT 10 WAIT 5000   # -> id, lease, sender, body of each message
  redis-cli -p $MQ_PORT ACK jobs <id> <lease>
  redis-benchmark -p $MQ_PORT -c 8 -n 10000 SEND jobs hello
  $(fetch_cmd "http://127.0.0.1:$ADMIN_PORT/metrics") | grep mwmq_requests_total
the database: psql "$db"
options: $BIN --help    (press Ctrl-C to stop everything)
MSG
if [ -n "${RUN_SECONDS:-}" ]; then sleep "$RUN_SECONDS"; else wait "${pids[-1]}"; fi

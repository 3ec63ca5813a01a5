#!/usr/bin/env bash
# Starts a throwaway PostgreSQL (unix socket only, in a scratch directory) and
# mwmq in front of it, checks that a message goes through, prints how to
# connect with redis-cli, and keeps running until Ctrl-C (or RUN_SECONDS, if
# set). Everything stops, and the scratch directory is removed, on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
MQ_PORT=${MQ_PORT:-6380}
ADMIN_PORT=${ADMIN_PORT:-9380}
BIN=target/release/mwmq

if in_use "$MQ_PORT"; then echo "port $MQ_PORT is already in use; set MQ_PORT" >&2; exit 1; fi
if in_use "$ADMIN_PORT"; then echo "port $ADMIN_PORT is already in use; set ADMIN_PORT" >&2; exit 1; fi
work=$(mktemp -d /tmp/mwmq-run.XXXXXX)
chmod 755 "$work" # PostgreSQL runs as its own user and must reach its directory
pg="$work/pg"
stop_pg() { scripts/postgres.sh stop "$pg" >/dev/null 2>&1 || true; }
trap 'stop_pg; cleanup' EXIT INT TERM
db=$(scripts/postgres.sh start "$pg")
# The admin endpoint and its /ui page, logged into with a token made for this run.
(umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$work/admin-token")
cat > "$work/mwmq.toml" <<TOML
[stats]
admin = "127.0.0.1:$ADMIN_PORT"
admin_token_file = "$work/admin-token"
TOML
"$BIN" --config "$work/mwmq.toml" --listen "127.0.0.1:$MQ_PORT" --db "$db" --log warn & pids+=($!)
wait_port "$MQ_PORT"

cli() { redis-cli -p "$MQ_PORT" "$@"; }
cli QCREATE hello >/dev/null
id=$(cli SEND hello "first message")
got=$(cli POP hello | tr '\n' ' ')
cat <<MSG

mwmq is listening on 127.0.0.1:$MQ_PORT, PostgreSQL on a unix socket in $pg
self-check (QCREATE, SEND -> id $id, POP): $got

connect with redis-cli or any Redis client, for example:
  redis-cli -p $MQ_PORT QCREATE jobs
  redis-cli -p $MQ_PORT SEND jobs "hello"              # -> the message id
  redis-cli -p $MQ_PORT RECV jobs COUNT 10 WAIT 5000   # -> [id, lease, sender, body] ...
  redis-cli -p $MQ_PORT ACK jobs <id> <lease>
  redis-benchmark -p $MQ_PORT -c 8 -n 10000 SEND jobs hello
the queues in a browser: http://127.0.0.1:$ADMIN_PORT/ui
  (log in with the admin token in $work/admin-token to pause, resume, redrive)
the database: psql "$db"
options: $BIN --help    (press Ctrl-C to stop everything)
MSG
if [ -n "${RUN_SECONDS:-}" ]; then sleep "$RUN_SECONDS"; else wait "${pids[-1]}"; fi

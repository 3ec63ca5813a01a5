#!/usr/bin/env bash
# A highly available PostgreSQL (scripts/pg-ha.sh: a pg_auto_failover
# monitor, a primary and a synchronous standby, in a scratch directory) and
# mwmq in front of it on both nodes' connection string; checks that a
# message goes through, prints how to drill a failover, and keeps running
# until Ctrl-C (or RUN_SECONDS, if set). Everything stops, and the scratch
# directory is removed, on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
MQ_PORT=${MQ_PORT:-6380}
BIN=target/release/mwmq

if in_use "$MQ_PORT"; then echo "port $MQ_PORT is already in use; set MQ_PORT" >&2; exit 1; fi
work=$(mktemp -d /tmp/mwmq-ha.XXXXXX)
chmod 755 "$work" # PostgreSQL runs as its own user and must reach its directory
ha="$work/ha"
stop_ha() { scripts/pg-ha.sh stop "$ha" >/dev/null 2>&1 || true; }
trap 'stop_ha; cleanup' EXIT INT TERM
echo "starting a pg_auto_failover monitor, a primary and a synchronous standby ..."
db=$(scripts/pg-ha.sh start "$ha")
"$BIN" --listen "127.0.0.1:$MQ_PORT" --db "$db" --admin 127.0.0.1:0 --log warn & pids+=($!)
wait_port "$MQ_PORT"

cli() { redis-cli -p "$MQ_PORT" "$@"; }
cli QCREATE hello >/dev/null
id=$(cli SEND hello "first message")
got=$(cli POP hello | tr '\n' ' ')
cat <<MSG

mwmq is listening on 127.0.0.1:$MQ_PORT, in front of:
$(scripts/pg-ha.sh state "$ha" | sed 's/^/  /')
self-check (QCREATE, SEND -> id $id, POP): $got
mwmq's --db: $db

drill a failover (in another terminal):
  redis-benchmark -p $MQ_PORT -c 8 -n 1000000 SEND hello x &    # load
  scripts/pg-ha.sh kill $ha 1      # the primary's machine dies (keeper and PostgreSQL SIGKILLed)
  scripts/pg-ha.sh state $ha       # node 2 is promoted within ~8 s
  redis-cli -p $MQ_PORT INFO | grep db_   # db_failovers, db_seconds_without_primary, db_server
  scripts/pg-ha.sh revive $ha 1    # node 1 comes back, as the standby
options: $BIN --help    (press Ctrl-C to stop everything)
MSG
if [ -n "${RUN_SECONDS:-}" ]; then sleep "$RUN_SECONDS"; else wait "${pids[-1]}"; fi

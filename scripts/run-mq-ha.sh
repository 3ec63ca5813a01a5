#!/usr/bin/env bash
# A highly available PostgreSQL (scripts/pg-ha.sh: a pg_auto_failover
# monitor, a primary and a synchronous standby, in a scratch directory) and
# mwmq in front of it on both nodes' connection string, with its admin
# endpoint (/metrics, /stats, /healthz, /readyz, /ui); checks that a message
# goes through, prints every port it started and how to drill a failover,
# and keeps running until Ctrl-C (or RUN_SECONDS, if set). Everything stops,
# and the scratch directory is removed, on exit.
#
# Ports (make run-mq-ha MQ_PORT=6390 ...): MQ_PORT (clients, 6380),
# ADMIN_PORT (the admin endpoint, 9380), PG_PORTS (the monitor's, node 1's
# and node 2's, "M P1 P2"; free ports unless set). A port set is used or
# refused; a default that is taken is replaced by a free port, and the
# script says so. MWMQ_BIN names another mwmq than target/release/mwmq.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
BIN=$(repo_binary MWMQ_BIN mwmq run-mq-ha)
choose_port MQ_PORT 6380
choose_port ADMIN_PORT 9380
choose_ports PG_PORTS
if [ ${#PG_PORTS[@]} -ne 0 ] && [ ${#PG_PORTS[@]} -ne 3 ]; then
  echo "PG_PORTS: three ports (the monitor's, node 1's, node 2's), not ${#PG_PORTS[@]}" >&2
  exit 2
fi

work=$(mktemp -d /tmp/mwmq-ha.XXXXXX)
chmod 755 "$work" # PostgreSQL runs as its own user and must reach its directory
ha="$work/ha"
stop_ha() { scripts/pg-ha.sh stop "$ha" >/dev/null 2>&1 || true; }
trap 'stop_ha; cleanup' EXIT INT TERM
echo "starting a pg_auto_failover monitor, a primary and a synchronous standby ..."
ports=()
if [ ${#PG_PORTS[@]} -eq 3 ]; then ports=("ports=$(IFS=,; echo "${PG_PORTS[*]}")"); fi
db=$(scripts/pg-ha.sh start "$ha" "${ports[@]}")
IFS=, read -r -a PG_PORTS < <(scripts/pg-ha.sh ports "$ha")
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
PostgreSQL (PG_PORTS): pg_auto_failover's monitor on 127.0.0.1:${PG_PORTS[0]}, and the nodes:
$(scripts/pg-ha.sh state "$ha" | sed 's/^/  /')
mwmq's --db: $db
self-check (QCREATE, SEND -> id $id, POP): $got

drill a failover (in another terminal):
  redis-benchmark -p $MQ_PORT -c 8 -n 1000000 SEND hello x &    # load
  scripts/pg-ha.sh kill $ha 1      # the primary's machine dies (keeper and PostgreSQL SIGKILLed)
  scripts/pg-ha.sh state $ha       # node_2 becomes wait_primary within ~8 s (node_1 is assigned demoted)
  redis-cli -p $MQ_PORT SEND hello y    # meanwhile: TRYAGAIN no primary ... a promotion is awaited
  $(fetch_cmd "http://127.0.0.1:$ADMIN_PORT/readyz")   # 503 while no primary takes writes
  redis-cli -p $MQ_PORT INFO | grep db_   # db_failovers, db_seconds_without_primary, db_server
  scripts/pg-ha.sh revive $ha 1    # node 1 comes back, as the standby
options: $BIN --help    (press Ctrl-C to stop everything)
MSG
if [ -n "${RUN_SECONDS:-}" ]; then sleep "$RUN_SECONDS"; else wait "${pids[-1]}"; fi

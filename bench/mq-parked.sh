#!/usr/bin/env bash
# What parked clients cost the database on an idle queue: CLIENTS raw
# connections each send `RECV q WAIT 300000` to an mwmq over a throwaway
# PostgreSQL and stay; nothing is sent. Printed: PostgreSQL's committed
# transactions per second on mwmq's database (pg_stat_database.xact_commit,
# sampled SECONDS apart once every client waits) and mwmq's own counts
# (db_statements, wait_polls). Then every client vanishes (closes without a
# word) and what mwmq still counts is printed: connected clients, waiting
# ones, and the transactions of the next SECONDS.
#
# Before the shared poll each waiting client ran its own statement every
# poll_ms (250 ms: 4,000 statements a second for 1,000 clients) and a client
# that vanished kept doing so until its wait ended; now one statement per
# poll_ms serves them all. Compare two builds with MWMQ=path/to/mwmq.
#
# Usage: bench/mq-parked.sh [CLIENTS] [SECONDS]   (default 1000 10; env
# MWMQ (default target/release/mwmq, else target/debug/mwmq), ENGINE (async|pool))
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
CLIENTS=${1:-1000}
SECONDS_=${2:-10}
ENGINE=${ENGINE:-async}
MWMQ=${MWMQ:-target/release/mwmq}
[ -x "$MWMQ" ] || MWMQ=target/debug/mwmq
[ -x "$MWMQ" ] || { echo "no mwmq binary: run make build (or set MWMQ)" >&2; exit 2; }
ulimit -n "$(( CLIENTS * 2 + 1024 ))" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
throwaway_postgres mwmq-parked
psql_q() { as_pg "$PGBIN/psql" -h "$pg" -U postgres -d mwmq -qAtX -c "$1"; }
commits() { psql_q "SELECT pg_stat_clear_snapshot(); SELECT xact_commit FROM pg_stat_database WHERE datname = 'mwmq'" | tail -1; }
info() { redis-cli -p "$MQ" INFO | tr -d '\r' | sed -n "s/^$1://p"; }

MQ=$(free_port)
"$MWMQ" --listen "127.0.0.1:$MQ" --db "$db" --engine "$ENGINE" --max-connections "$(( CLIENTS + 10 ))" \
  --log warn & pids+=($!)
wait_port "$MQ"
redis-cli -p "$MQ" QCREATE q > /dev/null

# The clients: one Python process holding the sockets; it closes them all on
# a line on its standard input, and exits on the next.
mkfifo "$work/ctl"
cat > "$work/clients.py" <<'PY'
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
req = b"*4\r\n$4\r\nRECV\r\n$1\r\nq\r\n$4\r\nWAIT\r\n$6\r\n300000\r\n"
socks = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(req)
    socks.append(s)
sys.stdin.readline()
for s in socks:
    s.close()
sys.stdin.readline()
PY
python3 "$work/clients.py" "$MQ" "$CLIENTS" < "$work/ctl" &
pids+=($!)
exec 3> "$work/ctl"

for _ in $(seq 600); do
  [ "$(info connected_clients)" -ge "$CLIENTS" ] && break
  sleep 0.1
done
# Every client has looked once and waits; PostgreSQL reports an idle
# backend's transactions up to 10 s late, so those looks are counted by then.
sleep 12
measure() {  # label
  local c0 c1 s0 s1 p0 p1
  c0=$(commits); s0=$(info db_statements); p0=$(info wait_polls || true)
  sleep "$SECONDS_"
  c1=$(commits); s1=$(info db_statements); p1=$(info wait_polls || true)
  printf "%-28s %9s %9s %12s %10s %12s %10s\n" "$1" "$(info connected_clients)" "$(info blocked_clients)" \
    "$(( c1 - c0 ))" "$(( (c1 - c0) / SECONDS_ ))" "$(( s1 - s0 ))" "$(( ${p1:-0} - ${p0:-0} ))"
}
echo "mwmq $("$MWMQ" --version | awk '{print $2}') ($MWMQ), engine $ENGINE, $CLIENTS clients, ${SECONDS_} s windows"
printf "%-28s %9s %9s %12s %10s %12s %10s\n" "" connected blocked xact_commit "xacts/s" db_statements wait_polls
measure "$CLIENTS waiting, idle queue"
echo >&3
sleep 12
measure "after they vanished"
echo >&3
exec 3>&-

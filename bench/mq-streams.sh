#!/usr/bin/env bash
# Redis Streams through mwmq, in one run, against mwmq's own commands and
# against Redis 7.0 itself with every write fsynced (appendonly yes,
# appendfsync always: the durability an XADD has in mwmq, a committed row).
#
#   add      XADD s * body <128 B>        vs  SEND q <128 B>                  redis-benchmark, CLIENTS connections
#   consume  XREADGROUP COUNT 1 + XACK    vs  RECV + ACK                      mwload -P mq, CLIENTS/2 connections
#
# Printed: requests (or pairs) per second, p50 and p99 in ms; the ratio of
# streams to mwmq's own commands (the goal: >= 0.9), and of mwmq's streams
# to Redis's (an anchor, not a goal: Redis keeps the stream in memory).
#
# Usage: bench/mq-streams.sh [requests]    (env: CLIENTS, default "8 32")
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-20000}
BIN=target/release
PY=.venv/bin/python
throwaway_postgres mwmq-streams
MQ=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQ" --db "$db" --log warn & pids+=($!)
RD=$(free_port)
mkdir -p "$work/redis"
redis-server --port "$RD" --bind 127.0.0.1 --dir "$work/redis" --save '' --appendonly yes --appendfsync always \
  >/dev/null 2>&1 & pids+=($!)
wait_port "$MQ"
wait_port "$RD"
redis-cli -p "$MQ" QCREATE mq >/dev/null
. bench/mqlib.sh

ratio() { "$PY" -c "print(f'{$1/$2:.2f}')"; }
row() { printf '%-34s %10s %8s %8s %8s\n' "$@"; }
echo "Streams and queues through mwmq, and Redis 7.0 (appendfsync always), $N requests each"
row "" "per s" "p50 ms" "p99 ms" "ratio"
for CLIENTS in ${CLIENTS:-8 32}; do
  read -r s s50 s99 <<<"$(rb_run SEND mq "$BODY")"
  row "SEND, $CLIENTS conns" "$s" "$s50" "$s99" ""
  read -r x x50 x99 <<<"$(rb_run XADD st '*' body "$BODY")"
  row "XADD via mwmq, $CLIENTS conns" "$x" "$x50" "$x99" "$(ratio "$x" "$s") of SEND"
  read -r r r50 r99 <<<"$(PORT=$RD rb_run XADD st '*' body "$BODY")"
  row "XADD on Redis, $CLIENTS conns" "$r" "$r50" "$r99" "mwmq $(ratio "$x" "$r")"

  # Consumption: the queue (then the stream) q0 filled first, then drained in pairs.
  redis-cli -p "$MQ" QCREATE q0 >/dev/null
  rb_run SEND q0 "$BODY" >/dev/null
  read -r a a50 a99 <<<"$(recvack_run)"
  redis-cli -p "$MQ" QDROP q0 >/dev/null
  row "RECV+ACK, $((CLIENTS / 2)) conns" "$a" "$a50" "$a99" ""
  redis-cli -p "$MQ" XGROUP CREATE q0 mwload '$' MKSTREAM >/dev/null
  rb_run XADD q0 '*' body "$BODY" >/dev/null
  read -r g g50 g99 <<<"$(RECEIVE=stream recvack_run)"
  redis-cli -p "$MQ" DEL q0 >/dev/null
  row "XREADGROUP+XACK via mwmq, $((CLIENTS / 2)) conns" "$g" "$g50" "$g99" "$(ratio "$g" "$a") of RECV+ACK"
  redis-cli -p "$RD" XGROUP CREATE q0 mwload '$' MKSTREAM >/dev/null
  PORT=$RD rb_run XADD q0 '*' body "$BODY" >/dev/null
  read -r h h50 h99 <<<"$(PORT=$RD RECEIVE=stream recvack_run)"
  redis-cli -p "$RD" DEL q0 >/dev/null
  row "XREADGROUP+XACK on Redis, $((CLIENTS / 2)) c" "$h" "$h50" "$h99" "mwmq $(ratio "$g" "$h")"
done

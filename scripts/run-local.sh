#!/usr/bin/env bash
# Starts three memcached servers and mwproxy in front of them on loopback,
# checks that a set and a get go through, prints how to connect, and keeps
# running until Ctrl-C (or RUN_SECONDS, if set). Everything stops on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
PROXY_PORT=${PROXY_PORT:-11311}
MC_PORTS=(${MC_PORTS:-21211 21212 21213})
BIN=target/release/mwproxy


for p in "$PROXY_PORT" "${MC_PORTS[@]}"; do
  if in_use "$p"; then echo "port $p is already in use; set PROXY_PORT or MC_PORTS" >&2; exit 1; fi
done
servers=()
for p in "${MC_PORTS[@]}"; do
  start_memcached "$p" -m 64
  servers+=("127.0.0.1:$p")
done
for p in "${MC_PORTS[@]}"; do wait_port "$p"; done
"$BIN" -p "$PROXY_PORT" -m "${servers[@]}" --log warn & pids+=($!)
wait_port "$PROXY_PORT"

reply=$(python3 - "$PROXY_PORT" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"set hello 0 0 5\r\nworld\r\nget hello\r\n")
data = b""
while not data.endswith(b"END\r\n"):
    data += s.recv(4096)
print(data.decode().replace("\r\n", " | "))
PY
)
cat <<MSG

mwproxy is listening on 127.0.0.1:$PROXY_PORT in front of ${servers[*]}
self-check (set + get through the proxy): $reply

connect with any memcached client, for example:
  printf 'set k 0 0 2\r\nhi\r\nget k\r\nstats\r\n' | nc -q1 127.0.0.1 $PROXY_PORT
  memcslap --servers=127.0.0.1:$PROXY_PORT --concurrency=8 --execute-number=10000
options: $BIN --help    (press Ctrl-C to stop everything)
MSG
if [ -n "${RUN_SECONDS:-}" ]; then sleep "$RUN_SECONDS"; else wait "${pids[-1]}"; fi

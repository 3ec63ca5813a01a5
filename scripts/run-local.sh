#!/usr/bin/env bash
# Starts three memcached servers and mwproxy in front of them on loopback,
# with its admin endpoint (/metrics, /stats, /healthz, /readyz), checks that
# a set and a get go through, prints every port it started and how to try
# them, and keeps running until Ctrl-C (or RUN_SECONDS, if set). Everything
# stops on exit.
#
# Ports (make run-proxy PROXY_PORT=11400 ...): PROXY_PORT (clients, 11311),
# MC_PORTS (the memcached servers, "21211 21212 21213"), ADMIN_PORT (the
# admin endpoint, 9100). A port set is used or refused; a default that is
# taken is replaced by a free port, and the script says so. MWPROXY_BIN
# names another mwproxy than target/release/mwproxy.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
BIN=$(repo_binary MWPROXY_BIN mwproxy run-proxy)
choose_port PROXY_PORT 11311
choose_port ADMIN_PORT 9100
choose_ports MC_PORTS 21211 21212 21213

servers=()
for p in "${MC_PORTS[@]}"; do
  start_memcached "$p" -m 64
  servers+=("127.0.0.1:$p")
done
for p in "${MC_PORTS[@]}"; do wait_port "$p"; done
"$BIN" -p "$PROXY_PORT" -m "${servers[@]}" --admin "127.0.0.1:$ADMIN_PORT" --log warn & pids+=($!)
wait_port "$PROXY_PORT" "${pids[-1]}"
wait_port "$ADMIN_PORT" "${pids[-1]}"

reply=$(python3 - "$PROXY_PORT" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"set hello 0 0 5\r\nworld\r\nget hello\r\n")
data = b""
while not data.endswith(b"END\r\n"):
    data += s.recv(4096)
print(data.decode().replace("\r\n", " | "))
PY
)
admin="http://127.0.0.1:$ADMIN_PORT"
cat <<MSG

mwproxy is listening on 127.0.0.1:$PROXY_PORT (PROXY_PORT)
memcached servers: ${servers[*]} (MC_PORTS)
admin endpoint: $admin/metrics $admin/stats $admin/healthz $admin/readyz (ADMIN_PORT)
self-check (set + get through the proxy): $reply

try it with any memcached client (in another terminal), for example:
  python3 -c 'import socket; s = socket.create_connection(("127.0.0.1", $PROXY_PORT)); s.sendall(b"set k 0 0 2\r\nhi\r\nget k\r\n"); s.shutdown(socket.SHUT_WR); print(s.makefile().read(), end="")'
  memccat --servers=127.0.0.1:$PROXY_PORT k       # the value of k
  memcstat --servers=127.0.0.1:$PROXY_PORT        # the proxy's counters
  memcslap --servers=127.0.0.1:$PROXY_PORT --concurrency=8 --execute-number=10000
  $(fetch_cmd "$admin/metrics") | grep mwproxy_requests_total
options: $BIN --help    (press Ctrl-C to stop everything)
MSG
if [ -n "${RUN_SECONDS:-}" ]; then sleep "$RUN_SECONDS"; else wait "${pids[-1]}"; fi

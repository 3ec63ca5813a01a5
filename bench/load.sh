#!/usr/bin/env bash
# mwload next to memcslap (libmemcached-tools, memaslap's successor) against the
# same memcached, same number of connections, same get-only load, alternated
# round by round: throughput and CPU time per 1,000 requests of each load
# generator (user + system time of the whole process, prefill included for both).
#
# Usage: bench/load.sh [rounds]     (env: CONNECTIONS=16, REQUESTS=20000 per connection)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ROUNDS=${1:-3}
CONNECTIONS=${CONNECTIONS:-16}
REQUESTS=${REQUESTS:-20000}
LOAD=target/release/mwload
work=$(mktemp -d)
port=$(free_port)
start_memcached "$port" -m 256
wait_port "$port"

total=$((CONNECTIONS * REQUESTS))
echo "get-only closed loop, $CONNECTIONS connections x $REQUESTS requests, $ROUNDS rounds" >&2
for r in $(seq "$ROUNDS"); do
  /usr/bin/time -f "%U %S" -o "$work/t" memcslap -s "127.0.0.1:$port" -t get -c "$CONNECTIONS" -e "$REQUESTS" > "$work/out" 2>&1
  secs=$(awk '/Time to get/ {print $(NF-1)}' "$work/out")
  read -r u s < "$work/t"
  echo "memcslap $secs $u $s $total $REQUESTS" >> "$work/results"
  echo "  round $r memcslap: $total gets in ${secs}s, cpu ${u}u ${s}s" >&2

  /usr/bin/time -f "%U %S" -o "$work/t" "$LOAD" -p "$port" -t 2 -c $((CONNECTIONS / 2)) -n "$REQUESTS" --ratio 0:1 \
      --key-maximum $((REQUESTS - 1)) --prefill --progress never --out "$work/mwload" > "$work/out" 2>&1
  secs=$(python3 -c "import json; print(json.load(open('$work/mwload/summary.json'))['duration_ms']/1000)")
  read -r u s < "$work/t"
  echo "mwload $secs $u $s $total $REQUESTS" >> "$work/results"
  echo "  round $r mwload: $total gets in ${secs}s, cpu ${u}u ${s}s" >&2
done

python3 - "$work/results" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    name, secs, u, s, total, prefill = line.split()
    total, prefill = int(total), int(prefill)
    ops = total / float(secs)
    cpu = float(u) + float(s)
    rows.setdefault(name, []).append((ops, cpu * 1e6 / (total + prefill), (total + prefill) / cpu))
print(f"{'generator':<10}{'ops/s':>12}{'CPU ms / 1000 req':>20}{'req per CPU s':>16}")
med = {}
for name, vals in rows.items():
    m = [statistics.median(v[i] for v in vals) for i in range(3)]
    med[name] = m
    print(f"{name:<10}{m[0]:>12.0f}{m[1]:>20.1f}{m[2]:>16.0f}")
print()
print(f"mwload / memcslap ops/s:           {med['mwload'][0] / med['memcslap'][0]:.2f}")
print(f"mwload / memcslap req per CPU s:   {med['mwload'][2] / med['memcslap'][2]:.2f}")
PY

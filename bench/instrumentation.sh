#!/usr/bin/env bash
# The cost of mwproxy's results output, counted in instructions rather than
# seconds (valgrind's callgrind: repeatable whatever else the machine does).
# The same 20,000 requests go through mwproxy without results output and with
# windows + summary + a trace of every 100th request; the table gives the
# instructions of the request path (net thread + workers) and of the stats
# thread, which closes a window each second in both configurations.
#
# Usage: bench/instrumentation.sh [requests per connection]   (4 connections, 2 workers)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-5000}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
work=$(mktemp -d)
mc=$(free_port)
start_memcached "$mc" -t 1
wait_port "$mc"
for mode in off on; do
  port=$(free_port)
  extra=()
  [ "$mode" = on ] && extra=(--out "$work/out" --trace-every 100)
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$work/cg-$mode" \
    target/release/mwproxy -p "$port" -m "127.0.0.1:$mc" -t 2 --log warn "${extra[@]}" > "$work/log-$mode" 2>&1 &
  proxy=$!
  wait_port "$port"
  target/release/mwload -p "$port" -t 1 -c 4 -n "$N" --ratio 1:10 --progress never > /dev/null
  kill -TERM "$proxy"; wait "$proxy" || true
done
python3 - "$work" "$((4 * N))" <<'PY'
import glob, os, sys
work, requests = sys.argv[1], int(sys.argv[2])
def threads(mode):
    out = {}
    for f in sorted(glob.glob(os.path.join(work, f"cg-{mode}-*"))):
        text = open(f).read()
        t = int(text.split("\nthread: ", 1)[1].split()[0]) if "\nthread: " in text else 0
        out[t] = int(text.split("\nsummary: ", 1)[1].split()[0])
    return out
off, on = threads("off"), threads("on")
# Thread 2 is the stats thread, 3-4 the workers, 5 the net thread (spawn order).
path = lambda t: sum(v for k, v in t.items() if k in (3, 4, 5))
print(f"{'':<28}{'no output':>14}{'output on':>14}{'on/off':>10}")
print(f"{'request path (instructions)':<28}{path(off):>14,}{path(on):>14,}{path(on) / path(off):>10.4f}")
print(f"{'  per request':<28}{path(off) / requests:>14,.0f}{path(on) / requests:>14,.0f}")
print(f"{'stats thread (instructions)':<28}{off.get(2, 0):>14,}{on.get(2, 0):>14,}")
PY

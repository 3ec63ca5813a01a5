#!/usr/bin/env bash
# mwproxy and twemproxy on unix sockets, both sides: the clients connect to
# the proxy's socket and the proxy to 3 memcached listening on sockets only,
# driven by memtier_benchmark (-S) in the three client shapes of
# bench/peers.sh. One twemproxy file serves both proxies: nutcracker reads it,
# and so does mwproxy (`-c FILE.yml`), so the two run the same placement
# (fnv1a_64 ketama). Targets, alternated round by round: memcached directly
# on its socket, twemproxy-3, mwproxy-3, and mwproxy-3-tcp (the same
# mwproxy configuration with its clients on TCP, so the table also shows
# what the client-side socket changes). CPU per request is the target's
# own user + system time.
#
# Usage: bench/unix.sh [rounds] [seconds]     (default 3 x 5 s)
#   env: SHAPES ("1x32 2x16 1x8p16"), RATIO (1:10), VALUE_SIZE (128), KEYS (10000)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ROUNDS=${1:-3}
SECS=${2:-5}
SHAPES=${SHAPES:-1x32 2x16 1x8p16}
RATIO=${RATIO:-1:10}
VALUE_SIZE=${VALUE_SIZE:-128}
KEYS=${KEYS:-10000}
BIN=target/release
[ -x "$BIN/mwproxy" ] || { echo "$BIN/mwproxy is not built: run make build" >&2; exit 2; }
command -v nutcracker > /dev/null || { echo "twemproxy (nutcracker) is missing: make deps" >&2; exit 2; }
command -v memtier_benchmark > /dev/null || { echo "memtier_benchmark is missing: make deps" >&2; exit 2; }
work=$(mktemp -d)

for i in 0 1 2 3; do
  memcached -s "$work/mc$i.sock" -a 0700 -t 1 -m 256 "${user_flag[@]}" & pids+=($!)
done
mc_pid=${pids[0]}
conf() {  # LISTEN -> a twemproxy file in front of mc1..mc3
  printf 'pool:\n  listen: %s\n  hash: fnv1a_64\n  distribution: ketama\n  timeout: 1000\n  servers:\n' "$1"
  for i in 1 2 3; do printf '   - %s:1\n' "$work/mc$i.sock"; done
}
conf "$work/tw.sock 0600" > "$work/tw.yml"
conf "$work/mw.sock 0600" > "$work/mw.yml"
tcp_port=$(free_port)
conf "127.0.0.1:$tcp_port" > "$work/mwtcp.yml"
nutcracker -c "$work/tw.yml" -s "$(free_port)" -a 127.0.0.1 > /dev/null 2>&1 & pids+=($!)
tw_pid=$!
"$BIN/mwproxy" -c "$work/mw.yml" -s "$(free_port)" --log warn & pids+=($!)
mw_pid=$!
"$BIN/mwproxy" -c "$work/mwtcp.yml" -s "$(free_port)" --log warn & pids+=($!)
mwtcp_pid=$!
wait_port "$tcp_port"
for s in mc0 tw mw; do
  for _ in $(seq 100); do [ -S "$work/$s.sock" ] && break; sleep 0.05; done
done

names=(memcached twemproxy-3 mwproxy-3 mwproxy-3-tcp)
where=("-S $work/mc0.sock" "-S $work/tw.sock" "-S $work/mw.sock" "-s 127.0.0.1 -p $tcp_port")
procs=("$mc_pid" "$tw_pid" "$mw_pid" "$mwtcp_pid")

echo "memtier_benchmark over unix sockets; set:get $RATIO, ${VALUE_SIZE} B values, $KEYS keys;" \
  "$ROUNDS rounds x $SECS s per target and shape" >&2
for shape in $SHAPES; do
  threads=${shape%%x*} rest=${shape#*x}
  conns=${rest%%p*} pipeline=1
  [ "$rest" != "$conns" ] && pipeline=${rest#*p}
  per_thread=$((conns / threads))
  for r in $(seq "$ROUNDS"); do
    for i in "${!names[@]}"; do
      out="$work/$shape-${names[$i]}-$r.json"
      before=$(cpu_ticks "${procs[$i]}")
      # shellcheck disable=SC2086
      memtier_benchmark ${where[$i]} -P memcache_text -t "$threads" -c "$per_thread" --pipeline="$pipeline" \
        --ratio="$RATIO" --test-time="$SECS" --key-maximum="$KEYS" -d "$VALUE_SIZE" \
        --hide-histogram --json-out-file "$out" > /dev/null 2>&1
      after=$(cpu_ticks "${procs[$i]}")
      echo "$((after - before))" > "$out.cpu"
      echo "  $shape round $r ${names[$i]} done" >&2
    done
  done
done

python3 - "$work" "$SHAPES" "$(getconf CLK_TCK)" "${names[@]}" <<'PY'
import statistics, sys
from pathlib import Path
sys.path.insert(0, "bench")
from figures import figures
work, shapes, tck, names = Path(sys.argv[1]), sys.argv[2].split(), int(sys.argv[3]), sys.argv[4:]

def measured(path):
    f = figures(path, "memtier_benchmark")
    cpu_s = int(Path(str(path) + ".cpu").read_text()) / tck
    return f.ops, f.p99_ms, cpu_s * 1e6 / max(f.requests, 1)

label = {"1x32": "1 thread x 32 conns", "2x16": "2 threads x 16 conns", "1x8p16": "1 x 8 conns, pipeline 16"}
print("memtier_benchmark over unix sockets; medians of the rounds; /tw-3: against twemproxy (both sides on "
      "unix sockets); CPU: the target's own user + system time per request")
for shape in shapes:
    med = {}
    for n in names:
        runs = [measured(p) for p in sorted(work.glob(f"{shape}-{n}-*.json"))]
        med[n] = tuple(statistics.median(r[k] for r in runs) for k in range(3))
    tw = med["twemproxy-3"]
    print(f"\n== {label.get(shape, shape)}")
    print(f"{'target':<16}{'ops/s':>10}{'/tw-3':>7}{'p99 ms':>8}{'/tw-3':>7}{'CPU us/req':>11}{'/tw-3':>7}")
    for n in names:
        o, p, c = med[n]
        print(f"{n:<16}{o:>10.0f}{o / tw[0]:>7.2f}{p:>8.3f}{p / tw[1]:>7.2f}{c:>11.2f}{c / tw[2]:>7.2f}")
PY

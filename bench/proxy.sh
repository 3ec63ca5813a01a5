#!/usr/bin/env bash
# Closed-loop throughput and latency of mwproxy next to its baselines, measured
# in one run: (a) one memcached directly, (b) twemproxy (nutcracker,
# ketama/md5) in front of 1 and of 3 memcached servers, (c) mwproxy's pool
# engine and (d) its async engine in front of the same 1 and 3 servers.
# Targets are alternated round by round so that drift on this shared machine
# hits all of them alike; the table shows medians and ratios. A second pass
# repeats it with pipelining clients (PIPELINE requests in flight per
# connection over PIPE_CONNECTIONS connections).
#
# Usage: bench/proxy.sh [rounds] [seconds]
#   env: CONNECTIONS (32), WORKERS (pool, 8), THREADS (async, 0 = one per core),
#        RATIO (1:10), VALUE_SIZE (128), PIPELINE (16, 0 = skip), PIPE_CONNECTIONS (8)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
CONNECTIONS=${CONNECTIONS:-32}
WORKERS=${WORKERS:-8}
THREADS=${THREADS:-0}
RATIO=${RATIO:-1:10}
VALUE_SIZE=${VALUE_SIZE:-128}
KEYS=${KEYS:-10000}
PIPELINE=${PIPELINE:-16}
PIPE_CONNECTIONS=${PIPE_CONNECTIONS:-8}

BIN=target/release
LOAD="$BIN/mwload"
work=$(mktemp -d)

declare -a MC
for i in 0 1 2 3; do
  p=$(free_port); start_memcached "$p" -t 1 -m 256; MC[$i]=$p
done
for p in "${MC[@]}"; do wait_port "$p"; done
# MC[0] serves the direct run and every 1-server proxy; MC[1..3] the 3-server ones.
THREE=("127.0.0.1:${MC[1]}" "127.0.0.1:${MC[2]}" "127.0.0.1:${MC[3]}")
P1=$(free_port); P3=$(free_port); PO=$(free_port); A1=$(free_port); A3=$(free_port); AO=$(free_port)
T1=$(free_port); T3=$(free_port)
pool=(--engine pool -t "$WORKERS" --log warn)
async=(--engine async --threads "$THREADS" --log warn)
"$BIN/mwproxy" -p "$P1" "${pool[@]}" -m "127.0.0.1:${MC[0]}" & pids+=($!)
"$BIN/mwproxy" -p "$P3" "${pool[@]}" -m "${THREE[@]}" & pids+=($!)
"$BIN/mwproxy" -p "$PO" "${pool[@]}" -m "${THREE[@]}" --out "$work/pool-out" --trace-every 100 & pids+=($!)
"$BIN/mwproxy" -p "$A1" "${async[@]}" -m "127.0.0.1:${MC[0]}" & pids+=($!)
"$BIN/mwproxy" -p "$A3" "${async[@]}" -m "${THREE[@]}" & pids+=($!)
"$BIN/mwproxy" -p "$AO" "${async[@]}" -m "${THREE[@]}" --out "$work/async-out" --trace-every 100 & pids+=($!)
start_twemproxy "$T1" "${MC[0]}"
start_twemproxy "$T3" "${MC[1]}" "${MC[2]}" "${MC[3]}"
for p in "$P1" "$P3" "$PO" "$A1" "$A3" "$AO" "$T1" "$T3"; do wait_port "$p"; done

for p in "${MC[0]}" "$P3"; do
  "$LOAD" -p "$p" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --prefill -n 1 -t 1 -c 1 --progress never > /dev/null 2>&1
done

names=(memcached twemproxy-1 twemproxy-3 pool-1 pool-3 pool-3+out async-1 async-3 async-3+out)
ports=("${MC[0]}" "$T1" "$T3" "$P1" "$P3" "$PO" "$A1" "$A3" "$AO")

# run NAME PORT CONNECTIONS DEPTH RESULTS
run() {
  "$LOAD" -p "$2" -t 2 -c $(($3 / 2)) --virtual-clients "$4" --ratio "$RATIO" --key-maximum $((KEYS - 1)) \
      -d "$VALUE_SIZE" --test-time "$SECONDS_PER_RUN" --warmup 1 --progress never --out "$work/run" > /dev/null
  out=$(python3 - "$work/run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
a = s["ops"]["all"]
print(json.dumps({"ops_per_sec": round(a["count"] * 1000 / s["duration_ms"], 1), "mean_us": a["response_us"]["mean"],
                  "p50_us": a["response_us"]["p50"], "p99_us": a["response_us"]["p99"],
                  "max_us": a["response_us"]["max"], "errors": a["errors"], "misses": a["misses"]}))
PY
)
  echo "$1 $out" >> "$5"
  echo "  round $r $1: $out" >&2
}

passes=("$CONNECTIONS 1 $work/results")
[ "$PIPELINE" -gt 0 ] && passes+=("$PIPE_CONNECTIONS $PIPELINE $work/results-pipelined")
for pass in "${passes[@]}"; do
  read -r conns depth file <<< "$pass"
  echo "closed loop: $conns connections x $depth in flight, set:get $RATIO, ${VALUE_SIZE} B values, $KEYS keys, pool workers $WORKERS, async threads $THREADS (0 = cores), $ROUNDS rounds x ${SECONDS_PER_RUN} s" >&2
  for r in $(seq "$ROUNDS"); do
    for i in "${!names[@]}"; do
      run "${names[$i]}" "${ports[$i]}" "$conns" "$depth" "$file"
    done
  done
done

for pass in "${passes[@]}"; do
read -r conns depth file <<< "$pass"
echo
echo "== $conns connections x $depth requests in flight"
python3 - "$file" <<'PY'
import json, sys, statistics
rows = {}
for line in open(sys.argv[1]):
    name, js = line.split(" ", 1)
    rows.setdefault(name, []).append(json.loads(js))
def med(name, field):
    return statistics.median(r[field] for r in rows[name])
base, tw = med("memcached", "ops_per_sec"), med("twemproxy-3", "ops_per_sec")
print(f"{'target':<14}{'ops/s':>12}{'mean us':>10}{'p99 us':>10}{'errors':>8}{'/direct':>9}{'/twem-3':>9}")
for name in rows:
    o = med(name, "ops_per_sec")
    print(f"{name:<14}{o:>12.0f}{med(name,'mean_us'):>10.1f}{med(name,'p99_us'):>10.0f}"
          f"{sum(r['errors'] for r in rows[name]):>8}{o/base:>9.2f}{o/tw:>9.2f}")
print()
for e in ("async", "pool"):
    print(f"{e}-3 / twemproxy-3  ops/s {med(e+'-3','ops_per_sec')/tw:.2f}  p99 {med(e+'-3','p99_us')/med('twemproxy-3','p99_us'):.2f}")
    print(f"{e}-1 / memcached    ops/s {med(e+'-1','ops_per_sec')/base:.2f}")
    print(f"{e}-3 results output on / off  ops/s {med(e+'-3+out','ops_per_sec')/med(e+'-3','ops_per_sec'):.3f}"
          f"  p99 {med(e+'-3+out','p99_us')/med(e+'-3','p99_us'):.3f}")
PY
done

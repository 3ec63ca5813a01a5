#!/usr/bin/env bash
# Closed-loop throughput and latency of mwproxy next to its baselines, measured
# in one run: (a) one memcached directly, (b) mwproxy in front of 1 and of 3
# memcached servers, (c) twemproxy (nutcracker, ketama/md5) in front of the same
# 3 servers. Targets are alternated round by round so that drift on this shared
# machine hits all of them alike; the table shows medians and ratios.
#
# Usage: bench/proxy.sh [rounds] [seconds]    (env: CONNECTIONS, WORKERS, RATIO, VALUE_SIZE)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
CONNECTIONS=${CONNECTIONS:-32}
WORKERS=${WORKERS:-8}
RATIO=${RATIO:-1:10}
VALUE_SIZE=${VALUE_SIZE:-128}
KEYS=${KEYS:-10000}

BIN=target/release
LOAD="$BIN/mwload"
work=$(mktemp -d)


declare -a MC
for i in 0 1 2 3; do
  p=$(free_port); start_memcached "$p" -t 1 -m 256; MC[$i]=$p
done
for p in "${MC[@]}"; do wait_port "$p"; done
# MC[0] serves the direct run and mwproxy-1; MC[1..3] serve the 3-server proxies.
MW1=$(free_port); MW3=$(free_port); MWO=$(free_port); TW=$(free_port)
"$BIN/mwproxy" -p "$MW1" -t "$WORKERS" -m "127.0.0.1:${MC[0]}" --log warn & pids+=($!)
"$BIN/mwproxy" -p "$MW3" -t "$WORKERS" -m "127.0.0.1:${MC[1]}" "127.0.0.1:${MC[2]}" "127.0.0.1:${MC[3]}" --log warn & pids+=($!)
"$BIN/mwproxy" -p "$MWO" -t "$WORKERS" -m "127.0.0.1:${MC[1]}" "127.0.0.1:${MC[2]}" "127.0.0.1:${MC[3]}" --log warn \
  --out "$work/mwproxy-out" --trace-every 100 & pids+=($!)
start_twemproxy "$TW" "${MC[1]}" "${MC[2]}" "${MC[3]}"
for p in "$MW1" "$MW3" "$MWO" "$TW"; do wait_port "$p"; done

for p in "${MC[0]}" "$MW3"; do
  "$LOAD" -p "$p" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --prefill -n 1 -t 1 -c 1 --progress never > /dev/null 2>&1
done

names=(memcached mwproxy-1 mwproxy-3 mwproxy-3+out twemproxy-3)
ports=("${MC[0]}" "$MW1" "$MW3" "$MWO" "$TW")
echo "closed loop: $CONNECTIONS connections, set:get $RATIO, ${VALUE_SIZE} B values, $KEYS keys, mwproxy workers $WORKERS, $ROUNDS rounds x ${SECONDS_PER_RUN} s" >&2
for r in $(seq "$ROUNDS"); do
  for i in "${!names[@]}"; do
    "$LOAD" -p "${ports[$i]}" -t 2 -c $((CONNECTIONS / 2)) --ratio "$RATIO" --key-maximum $((KEYS - 1)) \
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
    echo "${names[$i]} $out" >> "$work/results"
    echo "  round $r ${names[$i]}: $out" >&2
  done
done

python3 - "$work/results" <<'PY'
import json, sys, statistics
rows = {}
for line in open(sys.argv[1]):
    name, js = line.split(" ", 1)
    rows.setdefault(name, []).append(json.loads(js))
def med(name, field):
    return statistics.median(r[field] for r in rows[name])
print(f"{'target':<14}{'ops/s':>12}{'mean us':>10}{'p99 us':>10}{'errors':>8}")
for name in rows:
    print(f"{name:<14}{med(name,'ops_per_sec'):>12.0f}{med(name,'mean_us'):>10.1f}{med(name,'p99_us'):>10.0f}{sum(r['errors'] for r in rows[name]):>8}")
print()
print(f"mwproxy-1 / memcached   ops/s ratio: {med('mwproxy-1','ops_per_sec')/med('memcached','ops_per_sec'):.2f}")
print(f"mwproxy-3 / twemproxy-3 ops/s ratio: {med('mwproxy-3','ops_per_sec')/med('twemproxy-3','ops_per_sec'):.2f}")
print(f"mwproxy-3 / twemproxy-3 p99 ratio:   {med('mwproxy-3','p99_us')/med('twemproxy-3','p99_us'):.2f}")
print(f"results output on / off ops/s ratio:  {med('mwproxy-3+out','ops_per_sec')/med('mwproxy-3','ops_per_sec'):.3f}")
print(f"results output on / off p99 ratio:    {med('mwproxy-3+out','p99_us')/med('mwproxy-3','p99_us'):.3f}")
PY

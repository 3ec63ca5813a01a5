#!/usr/bin/env bash
# Pipelining clients next to an ordinary one, and pipelined batches, for
# memcached directly, twemproxy and mwproxy, measured in one run:
#  (a) an ordinary client (one request at a time) alone, then next to N
#      pipelining connections (mwload, --pipeline 16): its ops/s and the ratio;
#  (b) python-memcached set_multi and pymemcache set_many (noreply) of 2,000
#      keys: seconds, and the ratio to memcached directly.
#
# Usage: bench/fairness.sh [seconds]    (env: NEIGHBOURS, PIPELINE, WORKERS)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SECS=${1:-3}
NEIGHBOURS=${NEIGHBOURS:-16}
WORKERS=${WORKERS:-8}
PIPELINE=${PIPELINE:-16}
BIN=target/release
PY=.venv/bin/python
work=$(mktemp -d)

MC=$(free_port); start_memcached "$MC" -t 1 -m 256; wait_port "$MC"
MW=$(free_port); TW=$(free_port)
"$BIN/mwproxy" -p "$MW" -t "$WORKERS" -m "127.0.0.1:$MC" --log warn & pids+=($!)
start_twemproxy "$TW" "$MC"
wait_port "$MW"; wait_port "$TW"
"$BIN/mwload" -p "$MC" --key-maximum 999 --prefill -n 1 -t 1 -c 1 --progress never >/dev/null 2>&1

ordinary() {  # port -> ops/s of one connection with one request at a time
  "$BIN/mwload" -p "$1" -t 1 -c 1 --ratio 0:1 --key-maximum 999 --test-time "$SECS" --progress never \
      --out "$work/ord" >/dev/null
  python3 -c "import json,sys; s=json.load(open('$work/ord/summary.json')); \
print(round(s['ops']['all']['count']*1000/s['duration_ms']))"
}

echo "(a) an ordinary client alone and next to $NEIGHBOURS pipelining connections ($PIPELINE in flight each), ${SECS} s each"
printf '%-12s %12s %12s %8s %14s\n' target alone crowded ratio neighbours/s
for t in memcached:$MC twemproxy:$TW mwproxy:$MW; do
  name=${t%%:*}; port=${t##*:}
  alone=$(ordinary "$port")
  "$BIN/mwload" -p "$port" -t 2 -c $((NEIGHBOURS / 2)) --pipeline "$PIPELINE" --ratio 0:1 --key-maximum 999 \
      --test-time $((SECS + 2)) --progress never --out "$work/nb" >/dev/null &
  nb=$!
  sleep 1
  crowded=$(ordinary "$port")
  wait "$nb"
  nbrate=$(python3 -c "import json; s=json.load(open('$work/nb/summary.json')); \
print(round(s['ops']['all']['count']*1000/s['duration_ms']))")
  printf '%-12s %12s %12s %8s %14s\n' "$name" "$alone" "$crowded" \
      "$(python3 -c "print(f'{$crowded/$alone:.2f}')")" "$nbrate"
done

echo
echo "(b) batches of 2,000 keys (128 B values), median of 5"
"$PY" - "$MC" "$TW" "$MW" <<'PY'
import statistics, sys, time
import memcache
from pymemcache.client.base import Client

ports = dict(zip(["memcached", "twemproxy", "mwproxy"], map(int, sys.argv[1:])))
items = {f"batch:{i}": "v" * 128 for i in range(2000)}

def timed(f):
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        f()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)

rows = {}
for name, port in ports.items():
    mc = memcache.Client([f"127.0.0.1:{port}"])
    pm = Client(("127.0.0.1", port), default_noreply=True)
    rows[name] = (timed(lambda: mc.set_multi(items)), timed(lambda: pm.set_many(items, noreply=True)),
                  timed(lambda: mc.get_multi(list(items))))
    assert len(mc.get_multi(list(items))) == len(items), name
print(f"{'target':<12} {'set_multi s':>12} {'set_many s':>12} {'get_multi s':>12}  ratios to memcached")
for name, r in rows.items():
    base = rows["memcached"]
    print(f"{name:<12} {r[0]:12.4f} {r[1]:12.4f} {r[2]:12.4f}  " + " ".join(f"{x / b:.2f}" for x, b in zip(r, base)))
PY

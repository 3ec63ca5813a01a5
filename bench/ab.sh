#!/usr/bin/env bash
# A/B of two mwproxy binaries in one run: both engines of each binary in front
# of the same three memcached servers, driven by a client nobody here wrote
# (memtier_benchmark, when it is on PATH; mwload otherwise), alternated round
# by round so that drift on this shared machine hits both alike. Prints the
# median ops/s and p99 of each, and B/A.
#
# Usage: bench/ab.sh A_BINARY B_BINARY [rounds] [seconds]
#   e.g. bench/ab.sh /tmp/old/mwproxy target/release/mwproxy 5 5
#        A_ARGS="--threads 1" B_ARGS="--threads 2" ENGINES=async bench/ab.sh target/release/mwproxy{,}
#   env: CONNECTIONS (32), THREADS (client threads, 1), PIPELINE (1), RATIO (1:10), VALUE_SIZE (128),
#        KEYS (10000), ENGINES ("pool async"), A_ARGS / B_ARGS (more mwproxy flags for each side)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
[ $# -ge 2 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
A=$1 B=$2
ROUNDS=${3:-5}
SECS=${4:-5}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-1}
PIPELINE=${PIPELINE:-1}
RATIO=${RATIO:-1:10}
VALUE_SIZE=${VALUE_SIZE:-128}
KEYS=${KEYS:-10000}
ENGINES=${ENGINES:-pool async}
for bin in "$A" "$B"; do [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }; done
work=$(mktemp -d)

mc=()
for _ in 1 2 3; do p=$(free_port); start_memcached "$p" -t 1 -m 256; mc+=("127.0.0.1:$p"); done
for s in "${mc[@]}"; do wait_port "${s##*:}"; done
names=() ports=()
for engine in $ENGINES; do
  for side in A B; do
    bin=$A extra=${A_ARGS:-}; [ "$side" = B ] && bin=$B extra=${B_ARGS:-}
    p=$(free_port)
    # shellcheck disable=SC2086
    "$bin" -p "$p" --engine "$engine" --log warn $extra -m "${mc[@]}" & pids+=($!)
    names+=("$side-$engine") ports+=("$p")
  done
done
for p in "${ports[@]}"; do wait_port "$p"; done
target/release/mwload -p "${ports[0]}" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --prefill -n 1 -t 1 -c 1 \
  --progress never > /dev/null

per_thread=$((CONNECTIONS / THREADS))
if command -v memtier_benchmark > /dev/null; then client=memtier_benchmark; else client=mwload; fi
echo "client $client: $THREADS thread(s) x $per_thread connections, pipeline $PIPELINE, set:get $RATIO," \
  "${VALUE_SIZE} B, $KEYS keys, $ROUNDS rounds x $SECS s" >&2
for r in $(seq "$ROUNDS"); do
  for i in "${!names[@]}"; do
    out="$work/${names[$i]}-$r.json"
    if [ "$client" = memtier_benchmark ]; then
      memtier_benchmark -s 127.0.0.1 -p "${ports[$i]}" -P memcache_text -t "$THREADS" -c "$per_thread" \
        --pipeline="$PIPELINE" --ratio="$RATIO" --test-time="$SECS" --key-maximum="$KEYS" -d "$VALUE_SIZE" \
        --hide-histogram --json-out-file "$out" > /dev/null 2>&1
    else
      target/release/mwload -p "${ports[$i]}" -t "$THREADS" -c "$per_thread" --virtual-clients "$PIPELINE" \
        --ratio "$RATIO" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --test-time "$SECS" --warmup 1 \
        --progress never --out "$work/run" > /dev/null
      cp "$work/run/summary.json" "$out"
    fi
    echo "  round $r ${names[$i]} done" >&2
  done
done

python3 - "$work" "$client" "${names[@]}" <<'PY'
import statistics, sys
from pathlib import Path
sys.path.insert(0, "bench")
from figures import figures
work, client, names = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]

med = {}
for n in names:
    runs = [figures(p, client) for p in sorted(work.glob(f"{n}-*.json"))]
    med[n] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs), len(runs))
print(f"{'target':<12}{'ops/s':>12}{'p99 ms':>9}{'runs':>6}")
for n, (o, p, k) in med.items():
    print(f"{n:<12}{o:>12.0f}{p:>9.3f}{k:>6}")
print()
for engine in sorted({n.split('-', 1)[1] for n in names}):
    a, b = med[f"A-{engine}"], med[f"B-{engine}"]
    print(f"{engine}: B/A ops/s {b[0] / a[0]:.3f}, p99 {b[1] / a[1]:.3f}")
PY

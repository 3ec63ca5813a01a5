#!/usr/bin/env bash
# What a route tree costs (docs/mwproxy.md, Routes): one mwproxy binary in
# front of the same memcached servers, as a plain pool and behind routes,
# driven by memtier_benchmark when it is on PATH (mwload otherwise), the
# targets alternated round by round so that drift on this shared machine hits
# all alike. Prints the median ops/s, p99 and the proxy's CPU per request of
# each, and each against its baseline:
#
#   plain      the pool of servers 1-3 (--servers)
#   failover   the same pool behind a prefix selector and a failover to a backup pool   (vs plain: CPU/request)
#   shadow     the same pool, 10% of requests copied to a shadow pool                   (vs plain: ops/s)
#   single     server 1 alone
#   fastest    all-fastest over three one-server pools                                  (vs single: p99)
#
# Usage: bench/routes.sh [BINARY] [rounds] [seconds]
#   env: CONNECTIONS (32), THREADS (client threads, 1), PIPELINE (1), RATIO (1:10), VALUE_SIZE (128),
#        KEYS (10000), ENGINE (async), RATE (requests/s: an open loop at this rate, with mwload;
#        the default is a closed loop, where p99 follows the CPU each request costs)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
BIN=${1:-target/release/mwproxy}
ROUNDS=${2:-5}
SECS=${3:-5}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-1}
PIPELINE=${PIPELINE:-1}
RATIO=${RATIO:-1:10}
VALUE_SIZE=${VALUE_SIZE:-128}
KEYS=${KEYS:-10000}
ENGINE=${ENGINE:-async}
RATE=${RATE:-}
[ -x "$BIN" ] || { echo "not an executable: $BIN (cargo build --release -p mwproxy)" >&2; exit 2; }
work=$(mktemp -d)

mc=()
for _ in 1 2 3 4; do p=$(free_port); start_memcached "$p" -t 1 -m 256; mc+=("127.0.0.1:$p"); done
for s in "${mc[@]}"; do wait_port "${s##*:}"; done
q() { printf '"%s"' "$1"; }
pools="[pools.main]
servers = [$(q "${mc[0]}"), $(q "${mc[1]}"), $(q "${mc[2]}")]
[pools.backup]
servers = [$(q "${mc[3]}")]
[pools.one]
servers = [$(q "${mc[0]}")]
[pools.two]
servers = [$(q "${mc[1]}")]
[pools.three]
servers = [$(q "${mc[2]}")]"
cat > "$work/failover.toml" <<EOF
route = { type = "prefix", default = "main", routes = { "memtier-" = { type = "failover", children = ["main", "backup"] }, "key:" = { type = "failover", children = ["main", "backup"] } } }
$pools
EOF
cat > "$work/shadow.toml" <<EOF
route = { type = "shadow", main = "main", shadows = [{ route = "backup", request_fraction = 0.1 }] }
$pools
EOF
cat > "$work/fastest.toml" <<EOF
route = { type = "all-fastest", children = ["one", "two", "three"] }
$pools
EOF

names=(plain failover shadow single fastest) ports=() procs=()
for n in "${names[@]}"; do
  p=$(free_port)
  case $n in
    plain) args=(-m "${mc[0]}" "${mc[1]}" "${mc[2]}") ;;
    single) args=(-m "${mc[0]}") ;;
    *) args=(--config "$work/$n.toml") ;;
  esac
  "$BIN" -p "$p" --engine "$ENGINE" --threads 1 --log warn "${args[@]}" & pids+=($!)
  procs+=($!) ports+=("$p")
done
for i in "${!ports[@]}"; do wait_port "${ports[$i]}" "${procs[$i]}"; done
for p in "${ports[0]}" "${ports[3]}"; do
  target/release/mwload -p "$p" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --prefill -n 1 -t 1 -c 1 \
    --progress never > /dev/null
done

per_thread=$((CONNECTIONS / THREADS))
if command -v memtier_benchmark > /dev/null && [ -z "$RATE" ]; then client=memtier_benchmark; else client=mwload; fi
open=(); [ -n "$RATE" ] && open=(--rate "$RATE")
echo "client $client: $THREADS thread(s) x $per_thread connections, pipeline $PIPELINE, set:get $RATIO," \
  "${VALUE_SIZE} B, $KEYS keys, $ROUNDS rounds x $SECS s, engine $ENGINE (1 loop)${RATE:+, open loop at $RATE/s}" >&2
for r in $(seq "$ROUNDS"); do
  for i in "${!names[@]}"; do
    out="$work/${names[$i]}-$r.json"
    before=$(cpu_ticks "${procs[$i]}")
    if [ "$client" = memtier_benchmark ]; then
      memtier_benchmark -s 127.0.0.1 -p "${ports[$i]}" -P memcache_text -t "$THREADS" -c "$per_thread" \
        --pipeline="$PIPELINE" --ratio="$RATIO" --test-time="$SECS" --key-maximum="$KEYS" -d "$VALUE_SIZE" \
        --hide-histogram --json-out-file "$out" > /dev/null 2>&1
    else
      target/release/mwload -p "${ports[$i]}" -t "$THREADS" -c "$per_thread" --virtual-clients "$PIPELINE" \
        --ratio "$RATIO" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --test-time "$SECS" "${open[@]}" \
        --progress never --out "$work/run" > /dev/null
      cp "$work/run/summary.json" "$out"
    fi
    echo $(($(cpu_ticks "${procs[$i]}") - before)) > "$work/${names[$i]}-$r.cpu"
    echo "  round $r ${names[$i]} done" >&2
  done
done

python3 - "$work" "$client" "$SECS" "$(getconf CLK_TCK)" "${names[@]}" <<'PY'
import statistics, sys
from pathlib import Path
sys.path.insert(0, "bench")
from figures import figures
work, client, secs, tck, names = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]

med = {}
for n in names:
    runs = [(figures(p, client), int(p.with_suffix(".cpu").read_text())) for p in sorted(work.glob(f"{n}-*.json"))]
    ops = statistics.median(f.ops for f, _ in runs)
    p99 = statistics.median(f.p99_ms for f, _ in runs)
    # CPU of the whole round over the requests of the round (the client's run time is the round's).
    us = statistics.median(c / tck * 1e6 / max(f.ops * secs, 1) for f, c in runs)
    errors = sum(f.errors for f, _ in runs)
    med[n] = (ops, p99, us, errors)
print(f"{'target':<10}{'ops/s':>10}{'p99 ms':>9}{'CPU us/req':>12}{'errors':>8}")
for n, (o, p, u, e) in med.items():
    print(f"{n:<10}{o:>10.0f}{p:>9.3f}{u:>12.2f}{e:>8}")
print()
print(f"failover vs plain: CPU/request {med['failover'][2] / med['plain'][2]:.3f} (goal <= 1.03)")
print(f"shadow vs plain:   ops/s {med['shadow'][0] / med['plain'][0]:.3f} (goal >= 0.95)")
print(f"fastest vs single: p99 {med['fastest'][1] / med['single'][1]:.3f} (goal <= 1)")
PY

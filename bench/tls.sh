#!/usr/bin/env bash
# What TLS costs mwproxy, in one run: four proxies (the default async engine)
# in front of three memcached servers each —
#   plain    clients -> mwproxy -> memcached            (the baseline)
#   client   clients =TLS=> mwproxy -> memcached
#   server   clients -> mwproxy =TLS=> memcached -Z
#   both     clients =TLS=> mwproxy =TLS=> memcached -Z
# driven by memtier_benchmark (a client nobody here wrote; --tls --cacert)
# and by mwload (--tls --tls-ca), rounds alternated so that drift on this
# shared machine hits every setup alike. Prints the median ops/s and p99 of
# each and their ratio to the plain setup. Certificates are made with openssl.
#
# Usage: bench/tls.sh [rounds] [seconds]
#   env: CONNECTIONS (32), PIPELINE (1), RATIO (1:10), VALUE_SIZE (128), KEYS (10000)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ROUNDS=${1:-3}
SECS=${2:-5}
CONNECTIONS=${CONNECTIONS:-32}
PIPELINE=${PIPELINE:-1}
RATIO=${RATIO:-1:10}
VALUE_SIZE=${VALUE_SIZE:-128}
KEYS=${KEYS:-10000}
PROXY=target/release/mwproxy
LOAD=target/release/mwload
for bin in "$PROXY" "$LOAD"; do [ -x "$bin" ] || { echo "$bin is not built: run make build" >&2; exit 2; }; done
work=$(mktemp -d)

# A CA and a certificate for 127.0.0.1 it signed.
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/ca.key" -out "$work/ca.pem" -subj /CN=bench-ca \
  -days 2 2> /dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$work/key.pem" -out "$work/req.csr" -subj /CN=127.0.0.1 2> /dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$work/ext"
openssl x509 -req -in "$work/req.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
  -out "$work/cert.pem" -days 2 -extfile "$work/ext" 2> /dev/null
ca=$work/ca.pem

plain=() tls=()
for _ in 1 2 3; do p=$(free_port); start_memcached "$p" -t 1 -m 256; plain+=("127.0.0.1:$p"); done
for _ in 1 2 3; do
  p=$(free_port)
  start_memcached "$p" -t 1 -m 256 -Z -o "ssl_chain_cert=$work/cert.pem,ssl_key=$work/key.pem"
  tls+=("127.0.0.1:$p")
done
for s in "${plain[@]}" "${tls[@]}"; do wait_port "${s##*:}"; done
# The same keys on both sets, written directly (mwload places them with ketama, as mwproxy does).
list() { local IFS=,; echo "$*"; }
"$LOAD" --servers "$(list "${plain[@]}")" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --prefill -n 1 -t 1 -c 1 \
  --progress never > /dev/null
"$LOAD" --servers "$(list "${tls[@]}")" --tls --tls-ca "$ca" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" \
  --prefill -n 1 -t 1 -c 1 --progress never > /dev/null

names=(plain client server both) ports=()
client_tls=(no yes no yes)
for name in "${names[@]}"; do
  p=$(free_port) args=(-m "${plain[@]}")
  case $name in client | both) args+=(--tls-cert "$work/cert.pem" --tls-key "$work/key.pem") ;; esac
  case $name in server | both) args=(-m "${tls[@]}" --server-tls --server-tls-ca "$ca" "${args[@]:4}") ;; esac
  "$PROXY" -p "$p" --log warn "${args[@]}" & pids+=($!)
  ports+=("$p")
done
for p in "${ports[@]}"; do wait_port "$p"; done

echo "memtier_benchmark and mwload: $CONNECTIONS connections, pipeline $PIPELINE, set:get $RATIO," \
  "${VALUE_SIZE} B, $KEYS keys, $ROUNDS rounds x $SECS s" >&2
for r in $(seq "$ROUNDS"); do
  for i in "${!names[@]}"; do
    memtier_tls=() load_tls=()
    if [ "${client_tls[$i]}" = yes ]; then
      memtier_tls=(--tls --cacert "$ca") load_tls=(--tls --tls-ca "$ca")
    fi
    memtier_benchmark -s 127.0.0.1 -p "${ports[$i]}" -P memcache_text -t 1 -c "$CONNECTIONS" \
      --pipeline="$PIPELINE" --ratio="$RATIO" --test-time="$SECS" --key-maximum="$KEYS" -d "$VALUE_SIZE" \
      "${memtier_tls[@]}" --hide-histogram --json-out-file "$work/memtier-${names[$i]}-$r.json" > /dev/null 2>&1
    "$LOAD" -p "${ports[$i]}" -t 1 -c "$CONNECTIONS" --virtual-clients "$PIPELINE" --ratio "$RATIO" \
      --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --test-time "$SECS" --warmup 1 "${load_tls[@]}" \
      --progress never --out "$work/run" > /dev/null
    cp "$work/run/summary.json" "$work/mwload-${names[$i]}-$r.json"
    echo "  round $r ${names[$i]} done" >&2
  done
done

python3 - "$work" "${names[@]}" <<'PY'
import statistics, sys
from pathlib import Path
sys.path.insert(0, "bench")
from figures import figures
work, names = Path(sys.argv[1]), sys.argv[2:]

print(f"{'client':<10}{'setup':<9}{'ops/s':>10}{'p99 ms':>9}{'x plain':>9}{'errors':>8}{'runs':>6}")
for client in ("memtier", "mwload"):
    med = {}
    for n in names:
        runs = [figures(p, client) for p in sorted(work.glob(f"{client}-{n}-*.json"))]
        med[n] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
                  sum(r.errors for r in runs), len(runs))
    for n, (o, p, e, k) in med.items():
        print(f"{client:<10}{n:<9}{o:>10.0f}{p:>9.3f}{o / med['plain'][0]:>9.3f}{e:>8}{k:>6}")
PY

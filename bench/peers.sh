#!/usr/bin/env bash
# mwproxy against its peers, driven by a client nobody here wrote
# (memtier_benchmark; mwload when memtier is not on PATH, or with
# CLIENT=mwload), in the three client shapes of the published figures:
#
#   1 thread x 32 connections       one request in flight each
#   2 threads x 16 connections      one request in flight each
#   1 thread x 8 connections        16 pipelined requests each
#
# Targets, all in one run and alternated round by round (this machine is
# shared and noisy): memcached directly, twemproxy (nutcracker, ketama/md5)
# in front of 3 servers, mwproxy as installed (the default engine and
# settings) in front of the same 3 and of 1 server, the async engine with 2
# loops, and the pool engine with 8 workers. memcached runs 1 thread per
# server. Around every run the target's CPU time (user + system, from
# /proc/PID/stat) is read, so the table shows CPU per request beside
# throughput and p99. With memtier_benchmark, three targets are also driven
# in memcached's binary protocol (-P memcache_binary): memcached directly,
# and mwproxy in front of 3 and of 1 server (the "-bin" rows; goal: binary
# through mwproxy >= 0.95 x text through the same mwproxy). mwproxy in front
# of the same 3 servers also runs with twemproxy's other key hashes
# (HASHES, "mwproxy-3-<hash>" rows; goal: each at md5's rate or better) and
# with a hash tag ("mwproxy-3-tag": --hash-tag "{}", which every key is
# scanned for; memtier's keys have none, so this is the tag's whole cost).
#
# Usage: bench/peers.sh [rounds] [seconds]     (default 3 x 5 s)
#   env: SHAPES ("1x32 2x16 1x8p16"), RATIO (1:10), VALUE_SIZE (128), KEYS (10000),
#        HASHES ("fnv1a_64 murmur"),
#        CLIENT (memtier_benchmark if on PATH, else mwload), MWPROXY_ARGS (more flags for
#        the default mwproxy, e.g. to try a setting), JSON (write the medians there too)
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
if [ -z "${CLIENT:-}" ]; then
  if command -v memtier_benchmark > /dev/null; then CLIENT=memtier_benchmark; else CLIENT=mwload; fi
fi
for b in "$BIN/mwproxy" "$BIN/mwload"; do [ -x "$b" ] || { echo "$b is not built: run make build" >&2; exit 2; }; done
command -v nutcracker > /dev/null || { echo "twemproxy (nutcracker) is missing: make deps" >&2; exit 2; }
work=$(mktemp -d)

mc=()
for _ in 0 1 2 3; do p=$(free_port); start_memcached "$p" -t 1 -m 256; mc+=("$p"); done
for p in "${mc[@]}"; do wait_port "$p"; done
# mc[0] serves the direct runs and the 1-server proxy; mc[1..3] the 3-server targets.
three=("127.0.0.1:${mc[1]}" "127.0.0.1:${mc[2]}" "127.0.0.1:${mc[3]}")

names=() ports=() procs=() protos=()
target() {  # NAME PORT PID [PROTOCOL]
  names+=("$1") ports+=("$2") procs+=("$3") protos+=("${4:-memcache_text}")
}
target memcached "${mc[0]}" "${pids[0]}"
p=$(free_port); start_twemproxy "$p" "${mc[1]}" "${mc[2]}" "${mc[3]}"; target twemproxy-3 "$p" "${pids[-1]}"
# shellcheck disable=SC2086
p=$(free_port); "$BIN/mwproxy" -p "$p" --log warn ${MWPROXY_ARGS:-} -m "${three[@]}" & pids+=($!)
target mwproxy-3 "$p" "$!"
# shellcheck disable=SC2086
p=$(free_port); "$BIN/mwproxy" -p "$p" --log warn ${MWPROXY_ARGS:-} -m "127.0.0.1:${mc[0]}" & pids+=($!)
target mwproxy-1 "$p" "$!"
p=$(free_port); "$BIN/mwproxy" -p "$p" --log warn --engine async --threads 2 -m "${three[@]}" & pids+=($!)
target async-3-2loops "$p" "$!"
p=$(free_port); "$BIN/mwproxy" -p "$p" --log warn --engine pool -t 8 -m "${three[@]}" & pids+=($!)
target pool-3 "$p" "$!"
for h in ${HASHES-fnv1a_64 murmur}; do
  # shellcheck disable=SC2086
  p=$(free_port); "$BIN/mwproxy" -p "$p" --log warn ${MWPROXY_ARGS:-} --key-hash "$h" -m "${three[@]}" & pids+=($!)
  target "mwproxy-3-$h" "$p" "$!"
done
# shellcheck disable=SC2086
p=$(free_port); "$BIN/mwproxy" -p "$p" --log warn ${MWPROXY_ARGS:-} --hash-tag "{}" -m "${three[@]}" & pids+=($!)
target mwproxy-3-tag "$p" "$!"
if [ "$CLIENT" = memtier_benchmark ]; then
  # The same processes, spoken to in the binary protocol (mwload speaks text only).
  target memcached-bin "${mc[0]}" "${pids[0]}" memcache_binary
  target mwproxy-3-bin "${ports[2]}" "${procs[2]}" memcache_binary
  target mwproxy-1-bin "${ports[3]}" "${procs[3]}" memcache_binary
fi
for p in "${ports[@]}"; do wait_port "$p"; done
# The same keys everywhere: prefilled through a 3-server proxy and on mc[0].
for p in "${mc[0]}" "${ports[2]}"; do
  "$BIN/mwload" -p "$p" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --prefill -n 1 -t 1 -c 1 --progress never \
    > /dev/null 2>&1
done

echo "client $CLIENT; set:get $RATIO, ${VALUE_SIZE} B values, $KEYS keys, memcached 1 thread per server;" \
  "$ROUNDS rounds x $SECS s per target and shape" >&2
for shape in $SHAPES; do
  # 1x32 -> 1 thread, 32 connections in all; 1x8p16 -> pipeline 16.
  threads=${shape%%x*} rest=${shape#*x}
  conns=${rest%%p*} pipeline=1
  [ "$rest" != "$conns" ] && pipeline=${rest#*p}
  per_thread=$((conns / threads))  # both clients count -c per thread
  for r in $(seq "$ROUNDS"); do
    for i in "${!names[@]}"; do
      out="$work/$shape-${names[$i]}-$r.json"
      before=$(cpu_ticks "${procs[$i]}")
      if [ "$CLIENT" = memtier_benchmark ]; then
        memtier_benchmark -s 127.0.0.1 -p "${ports[$i]}" -P "${protos[$i]}" -t "$threads" -c "$per_thread" \
          --pipeline="$pipeline" --ratio="$RATIO" --test-time="$SECS" --key-maximum="$KEYS" -d "$VALUE_SIZE" \
          --hide-histogram --json-out-file "$out" > /dev/null 2>&1
      else
        "$BIN/mwload" -p "${ports[$i]}" -t "$threads" -c "$per_thread" --virtual-clients "$pipeline" \
          --ratio "$RATIO" --key-maximum $((KEYS - 1)) -d "$VALUE_SIZE" --test-time "$SECS" --warmup 0 \
          --progress never --out "$work/run" > /dev/null
        cp "$work/run/summary.json" "$out"
      fi
      after=$(cpu_ticks "${procs[$i]}")
      echo "$((after - before))" > "$out.cpu"
      echo "  $shape round $r ${names[$i]} done" >&2
    done
  done
done

python3 - "$work" "$CLIENT" "$SHAPES" "$(getconf CLK_TCK)" "${JSON:-}" "${names[@]}" <<'PY'
import json, statistics, sys
from pathlib import Path
sys.path.insert(0, "bench")
from figures import figures
work, client, shapes, tck, json_out, names = (Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(),
                                               int(sys.argv[4]), sys.argv[5], sys.argv[6:])

def measured(path):
    f = figures(path, client)
    cpu_s = int(Path(str(path) + ".cpu").read_text()) / tck
    return f.ops, f.p99_ms, cpu_s * 1e6 / max(f.requests, 1)

label = {"1x32": "1 thread x 32 conns", "2x16": "2 threads x 16 conns", "1x8p16": "1 x 8 conns, pipeline 16"}
med = {}
for shape in shapes:
    for n in names:
        runs = [measured(p) for p in sorted(work.glob(f"{shape}-{n}-*.json"))]
        med[shape, n] = tuple(statistics.median(r[k] for r in runs) for k in range(3))
print(f"client: {client}; medians of the rounds; /tw-3: against twemproxy with 3 servers; CPU: the target's "
      "own user + system time per request")
for shape in shapes:
    tw = med[shape, "twemproxy-3"]
    print(f"\n== {label.get(shape, shape)}")
    print(f"{'target':<20}{'ops/s':>10}{'/tw-3':>7}{'p99 ms':>8}{'/tw-3':>7}{'CPU us/req':>11}{'/tw-3':>7}")
    for n in names:
        o, p, c = med[shape, n]
        print(f"{n:<20}{o:>10.0f}{o / tw[0]:>7.2f}{p:>8.3f}{p / tw[1]:>7.2f}{c:>11.2f}{c / tw[2]:>7.2f}")
    o1, direct = med[shape, "mwproxy-1"][0], med[shape, "memcached"][0]
    print(f"mwproxy-1 / memcached direct: {o1 / direct:.2f}")
    md5 = med[shape, "mwproxy-3"]
    for n in names:
        if n.startswith("mwproxy-3-") and n != "mwproxy-3-bin":
            o, p, c = med[shape, n]
            print(f"{n} / mwproxy-3 (md5): ops {o / md5[0]:.2f}, p99 {p / md5[1]:.2f}, CPU {c / md5[2]:.2f}")
    if (shape, "mwproxy-3-bin") in med:
        for n in ("mwproxy-3", "mwproxy-1"):
            b, t = med[shape, n + "-bin"], med[shape, n]
            print(f"{n} binary / text: ops {b[0] / t[0]:.2f}, p99 {b[1] / t[1]:.2f}, CPU {b[2] / t[2]:.2f}")
        b1, bd = med[shape, "mwproxy-1-bin"][0], med[shape, "memcached-bin"][0]
        print(f"mwproxy-1 / memcached direct, both binary: {b1 / bd:.2f}")
print("\nGoals (docs/mwproxy.md): mwproxy-3 >= 1.30 x twemproxy-3 with p99 <= 1.00 x, CPU <= 0.60 x;"
      " mwproxy-1 >= 0.80 x memcached direct; binary through mwproxy >= 0.95 x text through mwproxy;"
      " every key hash >= 1.00 x md5 (within the noise)")
if json_out:
    Path(json_out).write_text(json.dumps({f"{s}/{n}": dict(zip(("ops_per_sec", "p99_ms", "cpu_us_per_request"), v))
                                          for (s, n), v in med.items()}, indent=1))
PY

#!/usr/bin/env bash
# What the /ui page costs: mwmq with QUEUES queues (each with a few
# messages, so every QINFO counts something), then
#
#   - how long GET /ui/api/queues takes (the page asks it every 5 s): the
#     median and the slowest of 20 (QINFO's figures cached for a second, the
#     default), and the CPU time mwmq spends on one (from /proc, over 100);
#   - SEND and POP rates (redis-benchmark, CLIENTS connections) alone, and
#     with PAGES pages open (a GET every 5 s / PAGES), alternated round by
#     round.
#
# Usage: bench/mq-ui.sh [requests] [rounds]    (env: CLIENTS, QUEUES, PAGES)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-20000}
ROUNDS=${2:-3}
CLIENTS=${CLIENTS:-8}
QUEUES=${QUEUES:-200}
PAGES=${PAGES:-10}
BIN=target/release
PY=.venv/bin/python
[ -x "$BIN/mwmq" ] || { echo "build first: make build" >&2; exit 2; }
throwaway_postgres mwmq-ui

MQ=$(free_port)
ADMIN=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQ" --db "$db" --admin "127.0.0.1:$ADMIN" --log warn & pids+=($!)
mq_pid=$!
wait_port "$MQ"
. bench/mqlib.sh
echo "$QUEUES queues with 10 messages each; $N requests, $CLIENTS connections, $ROUNDS rounds" >&2
for i in $(seq "$QUEUES"); do
  printf 'QCREATE q%s\n' "$i"
  for m in $(seq 10); do printf 'SEND q%s m%s\n' "$i" "$m"; done
done | redis-cli -p "$MQ" >/dev/null
redis-cli -p "$MQ" QCREATE q0 >/dev/null

page_ms() {  # -> "median slowest" of 20 GETs of /ui/api/queues, ms
  for _ in $(seq 20); do curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$ADMIN/ui/api/queues"; done |
    "$PY" -c "import statistics,sys; t=[float(l)*1000 for l in sys.stdin]; print(f'{statistics.median(t):.1f} {max(t):.1f}')"
}
listed=$(curl -s "http://127.0.0.1:$ADMIN/ui/api/queues" | "$PY" -c "import json,sys; print(len(json.load(sys.stdin)['queues']))")
cached=$(page_ms)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$mq_pid/stat"; }
t0=$(cpu_ticks)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$ADMIN/ui/api/queues"; done
cpu_ms=$(( ($(cpu_ticks) - t0) * 1000 / $(getconf CLK_TCK) / 100 ))
echo "  /ui/api/queues lists $listed queues: ${cached% *} ms median, ${cached#* } ms slowest; mwmq CPU ${cpu_ms} ms each" >&2

every=$("$PY" -c "print(5 / $PAGES)")
poller() {  # PAGES pages open: a GET every 5 s / PAGES, until killed
  while :; do curl -s -o /dev/null "http://127.0.0.1:$ADMIN/ui/api/queues"; sleep "$every"; done
}
for r in $(seq "$ROUNDS"); do
  for v in alone pages; do
    p=""
    if [ "$v" = pages ]; then poller & p=$!; fi
    send=$(rb_run SEND q0 "$BODY")
    pop=$(rb_run POP q0)
    if [ -n "$p" ]; then kill "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; fi
    echo "$v ${send%% *} ${pop%% *}" >> "$work/rows"
    echo "  round $r $v: SEND ${send%% *}/s POP ${pop%% *}/s" >&2
  done
done
"$PY" - "$work/rows" "$cached" "$cpu_ms" "$PAGES" "$listed" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {v: [statistics.median(float(r[k]) for r in rows if r[0] == v) for k in (1, 2)] for v in ("alone", "pages")}
a, p = med["alone"], med["pages"]
pages = f"{sys.argv[4]} pages open"
print(f"{'':<20}{'SEND/s':>10}{'POP/s':>10}")
print(f"{'alone':<20}{a[0]:>10.0f}{a[1]:>10.0f}")
print(f"{pages:<20}{p[0]:>10.0f}{p[1]:>10.0f}")
print(f"{'ratio':<20}{p[0] / a[0]:>10.2f}{p[1] / a[1]:>10.2f}")
m, s = sys.argv[2].split()
print(f"(GET /ui/api/queues, {sys.argv[5]} queues: {m} ms median, {s} ms slowest of 20, {sys.argv[3]} ms of mwmq CPU; "
      "medians of the rounds)")
PY

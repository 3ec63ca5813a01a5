#!/usr/bin/env bash
# A long churn of mwmq over one PostgreSQL: does the messages table bloat, and
# does p99 climb? A backlog of 100,000 messages is loaded; a closed-loop run
# (SEND, then RECV and ACK, 16 clients) finds the maximum rate; then mwload
# runs an open loop at 80% of it for MINUTES, the backlog staying about the
# same. Printed per minute: the table's and its indexes' size, live, leased
# and dead rows, autovacuum's and mwmq's own vacuums so far, and the minute's
# throughput and p99. (The maximum is a 30 s run: a shorter one measures a
# freshly vacuumed table and overstates what can be sustained.)
#
# With RETAIN=ms the queue keeps what is acknowledged that long (QALTER ...
# RETAIN): the archive's size is printed beside the live table's, which
# should stay as it is without retention.
#
# Usage: bench/mq-soak.sh [MINUTES]   (default 30; env BACKLOG, SHARE (0.8), RETAIN)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
MINUTES=${1:-30}
BACKLOG=${BACKLOG:-100000}
SHARE=${SHARE:-0.8}
BIN=target/release
PY=.venv/bin/python
for b in "$BIN/mwmq" "$BIN/mwload"; do [ -x "$b" ] || { echo "$b is not built: run make build" >&2; exit 2; }; done
throwaway_postgres mwmq-soak
psql_q() { as_pg env PGOPTIONS=-csearch_path=mwmq "$PGBIN/psql" -h "$pg" -U postgres -d mwmq -qAtX -c "$1"; }

MQ=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQ" --db "$db" --workers 8 --log warn & pids+=($!)
wait_port "$MQ"
redis-cli -p "$MQ" QCREATE q0 > /dev/null
if [ -n "${RETAIN:-}" ]; then redis-cli -p "$MQ" QALTER q0 RETAIN "$RETAIN" > /dev/null; fi
psql_q "INSERT INTO mwmq_messages (queue_id, sender, body, visible_at)
        SELECT (SELECT id FROM mwmq_queues WHERE name = 'q0'), 'backlog', repeat('x', 200)::bytea, now()
        FROM generate_series(1, $BACKLOG); ANALYZE mwmq_messages;"

load() {  # extra mwload arguments
  "$BIN/mwload" -P mq -p "$MQ" -t 2 -c 8 --ratio 1:1 --receive recv -d 200 --progress never "$@"
}
load --test-time 30 --out "$work/max" > /dev/null
# The open loop's rate counts SENDs and RECVs (each RECV's ACK follows it).
max=$("$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); o=s['ops']
print((o['send']['count'] + o['recv']['count']) * 1000 / s['duration_ms'])" "$work/max/summary.json")
rate=$("$PY" -c "print(round($max * $SHARE))")
echo "maximum $(printf %.0f "$max") SENDs + RECVs/s (each RECV then ACKed; 16 clients); soaking at $rate/s" \
  "for $MINUTES min" >&2

stats() {
  local db_row vacuums
  db_row=$(psql_q "SELECT pg_relation_size('mwmq_messages'), pg_indexes_size('mwmq_messages'), n_live_tup,
                          n_dead_tup, autovacuum_count, autoanalyze_count,
                          (SELECT count(*) FROM mwmq_messages WHERE lease IS NOT NULL AND visible_at > now()),
                          pg_total_relation_size('mwmq_archive'), (SELECT count(*) FROM mwmq_archive)
                   FROM pg_stat_user_tables WHERE relname = 'mwmq_messages'")
  vacuums=$(redis-cli -p "$MQ" INFO | tr -d '\r' | sed -n 's/^vacuums://p')
  echo "$db_row|${vacuums:-0}"
}
: > "$work/stats"
(
  for m in $(seq 0 "$MINUTES"); do
    echo "$m|$(stats)" >> "$work/stats"
    echo "  minute $m: $(tail -1 "$work/stats")" >&2
    sleep 60
  done
) &
sampler=$!
pids+=($sampler)
load --rate "$rate" --test-time $((MINUTES * 60)) --window-ms 60000 --out "$work/soak" > /dev/null
sleep 1
kill "$sampler" 2> /dev/null || true
echo "$(( MINUTES ))|$(stats)" >> "$work/stats"

"$PY" - "$work" <<'PY'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
windows = [json.loads(l) for l in (work / "soak" / "windows.jsonl").read_text().splitlines()]
windows = [w for w in windows if w["client"]["phase"] == "measure" and w["duration_ms"] >= 50_000]
rows = {}
for line in (work / "stats").read_text().splitlines():
    m, rest = line.split("|", 1)
    rows[int(m)] = [int(x) for x in rest.split("|")]
print(f"{'minute':>6}{'table MB':>10}{'index MB':>10}{'live':>9}{'leased':>9}{'dead':>9}{'autovac':>9}"
      f"{'vacuums':>9}{'req/s':>9}{'p99 ms':>9}{'archive MB':>11}{'kept':>9}")
print("(requests: SENDs, RECVs and ACKs; p99 of all of them; vacuums: mwmq's own, queues.vacuum_s;"
      " archive: acknowledged messages kept, with RETAIN)")
for i, w in enumerate(windows):
    a = w["ops"]["all"]
    st = rows.get(i + 1) or rows.get(max(rows))
    print(f"{i + 1:>6}{st[0] / 2**20:>10.1f}{st[1] / 2**20:>10.1f}{st[2]:>9}{st[6]:>9}{st[3]:>9}{st[4]:>9}"
          f"{st[9]:>9}{a['count'] * 1000 / w['duration_ms']:>9.0f}{a['response_us']['p99'] / 1000:>9.2f}"
          f"{st[7] / 2**20:>11.1f}{st[8]:>9}")
PY

# What the message-queue benchmarks share (sourced after scripts/lib.sh and
# throwaway_postgres, with BIN, PY, N, CLIENTS and MQ set): mwmq's own
# statements as pgbench scripts, runs of pgbench, redis-benchmark and
# mwload with their rate and latency, and CPU accounting.

BODY=$(printf 'x%.0s' $(seq 128))
HEX=$(printf '78%.0s' $(seq 128))

# mwmq's statements, as pgbench scripts on queue "pg" (crates/mwmq/sql/statements.sql: send, pop, recv_plain + ack), run
# with search_path = mwmq as mwmq's own connections run them.
mq_statements() {
  cat >"$work/send.sql" <<SQL
INSERT INTO mwmq_messages (queue_id, sender, receiver, body, visible_at, counted)
SELECT id, '', NULL, '\\x$HEX'::bytea, now(), (max_messages IS NOT NULL OR max_bytes IS NOT NULL)
FROM mwmq_queues WHERE name = 'pg' AND dropped_at IS NULL
  AND (max_messages IS NULL AND max_bytes IS NULL OR mwmq_room(id, max_messages, max_bytes, 128)) RETURNING id;
SQL
  cat >"$work/pop.sql" <<'SQL'
DELETE FROM mwmq_messages m USING (SELECT queue_id, id FROM mwmq_messages
  WHERE queue_id = (SELECT id FROM mwmq_queues WHERE name = 'pg' AND dropped_at IS NULL)
  AND visible_at <= now() AND receiver IS NULL ORDER BY visible_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) c
WHERE m.queue_id = c.queue_id AND m.id = c.id RETURNING m.id, m.sender, m.body;
SQL
  cat >"$work/recvack.sql" <<'SQL'
UPDATE mwmq_messages m SET lease = mwmq_lease_token(), leased_to = NULL, visible_at = now() + interval '30 seconds',
  deliveries = m.deliveries + 1
FROM (SELECT queue_id, id FROM mwmq_messages
  WHERE queue_id = (SELECT id FROM mwmq_queues WHERE name = 'pg' AND dropped_at IS NULL AND max_deliveries IS NULL)
  AND visible_at <= now() AND receiver IS NULL ORDER BY visible_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) c
WHERE m.queue_id = c.queue_id AND m.id = c.id RETURNING m.queue_id AS qid, m.id AS mid, m.lease AS lease
\gset
DELETE FROM mwmq_messages WHERE queue_id = :qid AND id = :mid AND lease = :lease AND (NULL::text IS NULL OR leased_to = NULL);
SQL
  # Since schema 17 (priorities) the statements walk the priorities of the
  # queue (mwmq_walk) and take each one's range of the ready index, as mwmq's do.
  if [ "$(as_pg "$PGBIN/psql" -h "$pg" -U postgres -d mwmq -qAtX \
          -c "SELECT to_regproc('mwmq.mwmq_walk') IS NOT NULL")" = t ]; then
    local walk="(SELECT c.queue_id, c.id FROM (SELECT id, prioritized FROM mwmq_queues
                                               WHERE name = 'pg' AND dropped_at IS NULL %s) q
  CROSS JOIN LATERAL mwmq_walk(q.id, q.prioritized) AS v(pr)
  CROSS JOIN LATERAL (SELECT queue_id, id FROM mwmq_messages WHERE queue_id = q.id AND priority = v.pr
    AND visible_at <= now() AND receiver IS NULL ORDER BY visible_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) c LIMIT 1) c"
    # shellcheck disable=SC2059
    printf "DELETE FROM mwmq_messages m USING $walk\nWHERE m.queue_id = c.queue_id AND m.id = c.id RETURNING m.id, m.sender, m.body;\n" \
      "" >"$work/pop.sql"
    # shellcheck disable=SC2059
    printf "UPDATE mwmq_messages m SET lease = mwmq_lease_token(), leased_to = NULL, lease_until = NULL,
  visible_at = now() + interval '30 seconds', deliveries = m.deliveries + 1
FROM $walk
WHERE m.queue_id = c.queue_id AND m.id = c.id RETURNING m.queue_id AS qid, m.id AS mid, m.lease AS lease
\\gset
DELETE FROM mwmq_messages WHERE queue_id = :qid AND id = :mid AND lease = :lease AND (NULL::text IS NULL OR leased_to = NULL);
" "AND max_deliveries IS NULL" >"$work/recvack.sql"
  fi
  chmod 644 "$work"/*.sql
  mkdir -p "$work/pgb"
  if [ "$(id -u)" = 0 ]; then chown postgres "$work/pgb"; fi
}

# pgbench_run SCRIPT [TRANSACTIONS] -> "rate p50 p99" (transactions per second, ms)
pgbench_run() {
  local script=$1 n=${2:-$N}
  rm -f "$work"/pgb/log*
  as_pg env PGOPTIONS="-c search_path=mwmq -c enable_bitmapscan=off -c enable_seqscan=off -c enable_sort=off" \
    "$PGBIN/pgbench" -n -h "$pg" -U postgres -M prepared -c "$CLIENTS" -j 2 -t $((n / CLIENTS)) \
    -f "$script" -l --log-prefix="$work/pgb/log" mwmq >"$work/pgb.out" 2>&1 || { cat "$work/pgb.out" >&2; exit 1; }
  "$PY" - "$work" <<'PY'
import glob, re, sys
work = sys.argv[1]
out = open(f"{work}/pgb.out").read()
rate = float(re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out).group(1))
lat = sorted(int(l.split()[2]) for f in glob.glob(f"{work}/pgb/log*") for l in open(f))
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1000
print(f"{rate:.0f} {q(0.5):.2f} {q(0.99):.2f}")
PY
}

# rb_run ARGS... -> "rate p50 p99": redis-benchmark, CLIENTS connections, N requests (env PORT: another mwmq)
rb_run() {
  redis-benchmark -p "${PORT:-$MQ}" -c "$CLIENTS" -n "$N" --csv "$@" 2>/dev/null | tail -1 |
    "$PY" -c "import csv,sys; r=next(csv.reader(sys.stdin)); print(f'{float(r[1]):.0f} {float(r[4]):.2f} {float(r[6]):.2f}')"
}

# recvack_run -> "pairs/s p50 p99": mwload -P mq, CLIENTS connections, each RECV then its ACK
# (RECEIVE=stream: each XREADGROUP of one entry then its XACK; the queue q0 a stream)
recvack_run() {
  rm -rf "$work/ra"
  "$BIN/mwload" -P mq -p "${PORT:-$MQ}" -t 2 -c $((CLIENTS / 2)) --ratio 0:1 --receive "${RECEIVE:-recv}" -n $((N / CLIENTS)) \
    --progress never --out "$work/ra" >/dev/null
  "$PY" - "$work/ra/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
o = s["ops"]
# A pair is a RECV and its ACK; the latency shown is per request (RECV or ACK).
print(f"{o['recv']['count'] * 1000 / s['duration_ms']:.0f} {o['all']['response_us']['p50'] / 1000:.2f} "
      f"{o['all']['response_us']['p99'] / 1000:.2f}")
PY
}

# pg_ticks -> CPU ticks of the whole PostgreSQL cluster so far: the postmaster,
# its live children, and the children it has reaped (connections that ended).
pg_ticks() {
  local pm
  pm=$(head -1 "$pg/data/postmaster.pid")
  { awk '{print $14 + $15 + $16 + $17}' "/proc/$pm/stat"
    for c in $(pgrep -P "$pm"); do awk '{print $14 + $15}' "/proc/$c/stat" 2>/dev/null || true; done
  } | awk '{s += $1} END {print s}'
}

# mark_children FILE: this shell's finished children's CPU so far, into FILE
# (call it directly, not in $(...): a subshell knows only its own children);
# children_ticks FILE -> those CPU ticks. The clients run as such children;
# the small helpers here use awk rather than Python, to add little.
mark_children() { times >"$1"; }
children_ticks() {
  tail -1 "$1" | tr 'ms' '  ' | awk -v hz="$(getconf CLK_TCK)" '{printf "%d\n", ($1 * 60 + $2 + $3 * 60 + $4) * hz}'
}

# us_per TICKS_DELTA MESSAGES -> microseconds of CPU per message
us_per() { awk -v t="$1" -v n="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f\n", t / hz * 1e6 / n}'; }

#!/usr/bin/env bash
# Celery on mwmq against Celery on Redis, and the mwmq package's Worker
# against raw RECV+ACK, on this machine in one run, the systems alternated
# round by round:
#
#   mwmq       Celery's broker mwmq:// (mwmq.kombu), mwmq on a throwaway
#              PostgreSQL (fsync and synchronous_commit on)
#   always     Celery's broker redis://, redis-server with appendonly yes and
#              appendfsync always: every write on disk before its reply, the
#              durability mwmq gives
#   everysec   the same with appendfsync everysec (a crash loses up to a second)
#
# Each with no-op tasks, `task_acks_late`, results ignored (no backend),
# `celery worker -P $POOL -c $CONCURRENCY` (prefork 8: Celery's default
# pool, one process per task slot, as most deployments run it), TASKS tasks:
#
#   send/s     a loop of `noop.delay()` (on $PRODUCERS threads, 1) filling the queue
#   drain/s    the worker started on that full queue: first ACK to last ACK
#   e2e/s      that worker running, TASKS more sent: first send to last ACK
#
# with the CPU a task costs the producer and the worker's processes, and on
# mwmq the commands and the database statements per task (INFO). Every SEND
# carries a KEY (the client's auto_key: a uuid4 per publish, so that a retry
# never stores it twice), which mwmq does not batch with other SENDs
# (SEND_KEYS=0: mwmq.kombu's send_keys off, SENDs without a KEY).
#
# Then the mwmq package's Worker (CONCURRENCY threads, a no-op handler)
# against mwload's RECV then ACK on CONCURRENCY connections (mqlib.sh's
# recvack_run), each draining TASKS 128-byte messages sent beforehand.
# Printed: the medians of the rounds, and the median of each round's ratios
# mwmq/always (the goal: 1 or more), mwmq/everysec (0.5 or more) and
# Worker/mwload.
#
# Usage: bench/celery.sh [tasks] [rounds]   (defaults 2000 and 3; env POOL=prefork|threads,
#        CONCURRENCY=8, PRODUCERS=1, SEND_KEYS=1, SYSTEMS="mwmq always everysec": a subset,
#        BIN: where mwmq and mwload are). About 3 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-2000}
ROUNDS=${2:-3}
POOL=${POOL:-prefork}
PRODUCERS=${PRODUCERS:-1}
CONCURRENCY=${CONCURRENCY:-8}
CLIENTS=$CONCURRENCY
BIN=${BIN:-target/release}
PY=$PWD/.venv/bin/python
# This checkout's mwmq package, whatever checkout .venv's editable install names (the workers inherit it).
export PYTHONPATH=$PWD/clients/python/src${PYTHONPATH:+:$PYTHONPATH}
# shellcheck disable=SC2206
systems=(${SYSTEMS:-mwmq always everysec})
[ -x "$BIN/mwmq" ] && [ -x "$BIN/mwload" ] || { echo "build first: make build" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "redis-server is not installed (Debian's redis-server)" >&2; exit 2; }
"$PY" -c 'import celery, mwmq.kombu' 2>/dev/null ||
  { echo "celery or the mwmq package is missing: .venv/bin/pip install -e './clients/python[celery]'" >&2; exit 2; }
throwaway_postgres celery-bench
. bench/mqlib.sh

MQ=$(free_port)
"$BIN/mwmq" --listen "127.0.0.1:$MQ" --db "$db" --log warn & pids+=($!)
wait_port "$MQ" $!
redis-cli -p "$MQ" QCREATE q0 >/dev/null

# redis_server NAME FSYNC: a redis-server on a free port, its AOF in a directory of its own; prints the port
declare -A url=([mwmq]="mwmq://127.0.0.1:$MQ//")
redis_server() {
  local name=$1 port
  port=$(free_port)
  mkdir -p "$work/$name"
  cat >"$work/$name/redis.conf" <<CONF
bind 127.0.0.1
port $port
dir $work/$name
appendonly yes
appendfsync $2
save ""
CONF
  redis-server "$work/$name/redis.conf" >"$work/$name/log" 2>&1 & pids+=($!)
  wait_port "$port" $!
  url[$name]="redis://127.0.0.1:$port/0"
}
redis_server always always
redis_server everysec everysec

echo "Celery -P $POOL -c $CONCURRENCY on ${systems[*]}, $N no-op tasks from $PRODUCERS producer(s)" \
  "(mwmq: send_keys ${SEND_KEYS:-1}), $ROUNDS rounds;" \
  "Worker and mwload: $N messages, $CLIENTS threads/connections" >&2
: >"$work/rows"
for r in $(seq "$ROUNDS"); do
  for s in "${systems[@]}"; do
    got=$(cd bench && "$PY" celery_bench.py celery "${url[$s]}" "$N" "$POOL" "$CONCURRENCY" "$PRODUCERS")
    echo "$r $s $got" >>"$work/rows"
    read -r send drain e2e _ <<<"$got"
    echo "  round $r $s: send $send/s drain $drain/s e2e $e2e/s" >&2
  done
  rb_run SEND q0 "$BODY" >/dev/null
  ra=$(recvack_run)
  rb_run SEND q0 "$BODY" >/dev/null
  wk=$(cd bench && "$PY" celery_bench.py worker "$MQ" q0 "$N" "$CONCURRENCY")
  echo "$r mwload ${ra%% *} - - - - - -" >>"$work/rows"
  echo "$r worker $wk - - - - - -" >>"$work/rows"
  echo "  round $r: mwload RECV+ACK ${ra%% *}/s, Worker $wk/s" >&2
done

"$PY" - "$work/rows" "$POOL" "$CONCURRENCY" "$PRODUCERS" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
pool, conc, producers = sys.argv[2:5]
# (round, system) -> [send/s, drain/s, e2e/s, producer CPU ms, worker CPU ms, commands, statements]
by = {(r, s): [None if x == "-" else float(x) for x in v] for r, s, *v in rows}
rounds = sorted({r for r, _ in by})
systems = [s for s in ("mwmq", "always", "everysec") if any((r, s) in by for r in rounds)]
med = lambda s, k: st.median(by[r, s][k] for r in rounds if (r, s) in by)
def ratio(a, b, k):
    per = [by[r, a][k] / by[r, b][k] for r in rounds if (r, a) in by and (r, b) in by]
    return st.median(per) if per else None
names = {"mwmq": "Celery on mwmq", "always": "Celery on Redis, appendfsync always",
         "everysec": "Celery on Redis, appendfsync everysec"}
print(f"Celery -P {pool} -c {conc}, no-op tasks, acks_late, {producers} producer(s): tasks per second"
      f" and CPU ms per task, medians of {len(rounds)} rounds")
print(f"{'':40}{'send/s':>8}{'drain/s':>9}{'e2e/s':>8}{'CPU: producer':>15}{'worker':>8}")
for s in systems:
    print(f"{names[s]:40}{med(s, 0):>8.0f}{med(s, 1):>9.0f}{med(s, 2):>8.0f}{med(s, 3):>15.2f}{med(s, 4):>8.2f}")
for other, goal in (("always", 1.0), ("everysec", 0.5)):
    if "mwmq" in systems and other in systems:
        q = [ratio("mwmq", other, k) for k in range(5)]
        label = f"mwmq / {other} (goal >= {goal:g})"
        print(f"{label:40}{q[0]:>8.2f}{q[1]:>9.2f}{q[2]:>8.2f}{q[3]:>15.2f}{q[4]:>8.2f}")
if "mwmq" in systems:
    print(f"(on mwmq, per task: {med('mwmq', 5):.2f} commands, {med('mwmq', 6):.2f} database statements)")
w, m = med("worker", 0), med("mwload", 0)
print(f"mwmq's Worker ({conc} threads) {w:.0f} messages/s, mwload RECV+ACK ({conc} connections) {m:.0f} pairs/s:"
      f" Worker / mwload {ratio('worker', 'mwload', 0):.2f}")
print("(ratios: the median of each round's ratio; drain: a full queue, first ACK to last ACK;"
      " e2e: sent while the worker runs, first send to last ACK; CPU: the producer's filling the queue,"
      " the worker's processes' draining it)")
PY

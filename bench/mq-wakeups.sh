#!/usr/bin/env bash
# What wake-ups cost, in two parts, over a throwaway PostgreSQL:
#
# 1. A NOTIFY flood. WAITERS raw connections each send `RECV vq WAIT
#    300000` to one mwmq and stay; nothing is sent to vq. A role with no
#    grant at all runs `SELECT pg_notify('mwmq', 'vq')` in a loop (pgbench,
#    2 connections) for SECONDS. Printed for a quiet window and for the
#    flood: NOTIFYs/s, mwmq's statements/s (db_statements: its requests',
#    wait_polls: the shared poll's), PostgreSQL's committed transactions/s on
#    mwmq's database, and the median and p90 of a SEND's round trip to
#    another queue (one client, 20 a second).
# 2. Cross-process wake-ups: two mwmq processes on the database; ROUNDS
#    times a client of the second waits (`RECV wq WAIT 10000`), a client of
#    the first sends to wq once it waits, and the time from sending the SEND
#    to the RECV's reply is taken. Printed: median, p90 and the largest.
#
# Usage: bench/mq-wakeups.sh [WAITERS] [SECONDS] [ROUNDS]   (default 200 10 200;
# env MWMQ (default target/release/mwmq, else target/debug/mwmq), ENGINE (async|pool),
# EXTRA (more mwmq flags, e.g. "--config file.toml"))
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
WAITERS=${1:-200}
SECONDS_=${2:-10}
ROUNDS=${3:-200}
ENGINE=${ENGINE:-async}
MWMQ=${MWMQ:-target/release/mwmq}
[ -x "$MWMQ" ] || MWMQ=target/debug/mwmq
[ -x "$MWMQ" ] || { echo "no mwmq binary: run make build (or set MWMQ)" >&2; exit 2; }
read -r -a extra <<< "${EXTRA:-}"
ulimit -n "$(( WAITERS * 2 + 1024 ))" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
throwaway_postgres mwmq-wakeups
psql_q() { as_pg "$PGBIN/psql" -h "$pg" -U postgres -d mwmq -qAtX -c "$1"; }
commits() { psql_q "SELECT pg_stat_clear_snapshot(); SELECT xact_commit FROM pg_stat_database WHERE datname = 'mwmq'" | tail -1; }
info() { redis-cli -p "$1" INFO | tr -d '\r' | sed -n "s/^$2://p"; }

start_mwmq() {  # port
  "$MWMQ" --listen "127.0.0.1:$1" --db "$db" --engine "$ENGINE" --max-connections "$(( WAITERS + 50 ))" \
    --log warn "${extra[@]}" & pids+=($!)
  wait_port "$1"
}
A=$(free_port)
B=$(free_port)
start_mwmq "$A"
for q in vq lat wq; do redis-cli -p "$A" QCREATE "$q" > /dev/null; done
psql_q "CREATE ROLE flooder LOGIN"
echo "SELECT pg_notify('mwmq', 'vq');" > "$work/notify.sql"
chmod 644 "$work/notify.sql"
mkdir -p "$work/pgb"
if [ "$(id -u)" = 0 ]; then chown postgres "$work/pgb"; fi

cat > "$work/wake.py" <<'PY'
import os, socket, statistics, sys, time

def cmd(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out

def reply(s):
    """Reads one RESP reply (enough of one for SEND, RECV and INFO)."""
    buf = b""
    def line():
        nonlocal buf
        while b"\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                raise EOFError
            buf += d
        l, buf = buf.split(b"\r\n", 1)
        return l
    def one():
        nonlocal buf
        l = line()
        if l[:1] in b"+-:":
            return l
        if l[:1] == b"$":
            n = int(l[1:])
            if n < 0:
                return None
            while len(buf) < n + 2:
                buf += s.recv(65536)
            v, buf = buf[:n], buf[n + 2:]
            return v
        if l[:1] == b"*":
            n = int(l[1:])
            return [one() for _ in range(max(n, 0))]
        raise ValueError(l)
    return one()

def conn(port):
    return socket.create_connection(("127.0.0.1", port))

def blocked(port):
    s = conn(port)
    s.sendall(cmd("INFO"))
    info = reply(s).decode()
    s.close()
    return int(next(l for l in info.splitlines() if l.startswith("blocked_clients:")).split(":")[1])

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]

mode = sys.argv[1]
if mode == "waiters":
    # Park N clients on vq; hold them until stdin closes.
    port, n = int(sys.argv[2]), int(sys.argv[3])
    socks = [conn(port) for _ in range(n)]
    for s in socks:
        s.sendall(cmd("RECV", "vq", "WAIT", "300000"))
    sys.stdin.read()
elif mode == "sends":
    # SEND to lat 20 times a second for SECONDS; median and p90 round trip in ms.
    port, secs = int(sys.argv[2]), float(sys.argv[3])
    s = conn(port)
    lat, end = [], time.time() + secs
    while time.time() < end:
        t0 = time.perf_counter()
        s.sendall(cmd("SEND", "lat", "x"))
        reply(s)
        lat.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.05)
    print("%.1f %.1f" % (statistics.median(lat), pct(lat, 0.9)))
elif mode == "cross":
    # ROUNDS wake-ups from process A's SEND to process B's waiting RECV.
    a, b, rounds = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    sender, waiter = conn(a), conn(b)
    lat = []
    for _ in range(rounds):
        waiter.sendall(cmd("RECV", "wq", "WAIT", "10000", "VT", "1000"))
        deadline = time.time() + 5
        time.sleep(0.005)
        while blocked(b) < 1 and time.time() < deadline:
            time.sleep(0.005)
        t0 = time.perf_counter()
        sender.sendall(cmd("SEND", "wq", "m"))
        reply(sender)
        got = reply(waiter)
        lat.append((time.perf_counter() - t0) * 1000)
        if os.environ.get("VERBOSE"):
            print("%.1f" % lat[-1], file=sys.stderr)
        if not got:
            print("a RECV ended empty", file=sys.stderr)
        else:
            waiter.sendall(cmd("ACK", "wq", got[0][0], got[0][1]))
            reply(waiter)
    print("%.1f %.1f %.1f" % (statistics.median(lat), pct(lat, 0.9), max(lat)))
PY

statements() { echo $(( $(info "$A" db_statements) + $(info "$A" wait_polls) )); }
measure() {  # label
  local c0 c1 s0 s1 lat
  c0=$(commits); s0=$(statements)
  lat=$(python3 "$work/wake.py" sends "$A" "$SECONDS_")
  c1=$(commits); s1=$(statements)
  printf "%-30s %14s %10s %16s\n" "$1" "$(( (s1 - s0) / SECONDS_ ))" "$(( (c1 - c0) / SECONDS_ ))" "$lat"
}

echo "mwmq $("$MWMQ" --version | awk '{print $2}') ($MWMQ), engine $ENGINE, $WAITERS waiters, ${SECONDS_} s windows ${EXTRA:-}"
if [ "${PARTS:-flood cross}" != cross ]; then
  mkfifo "$work/hold"
  python3 "$work/wake.py" waiters "$A" "$WAITERS" < "$work/hold" & pids+=($!)
  exec 3> "$work/hold"
  for _ in $(seq 600); do
    [ "$(info "$A" blocked_clients)" -ge "$WAITERS" ] && break
    sleep 0.1
  done
  # PostgreSQL reports an idle backend's transactions up to 10 s late: let the first looks be counted.
  sleep 11
  printf "%-30s %14s %10s %16s\n" "" "statements/s" "xacts/s" "SEND p50 p90 ms"
  measure "$WAITERS waiting, quiet"
  as_pg "$PGBIN/pgbench" -n -h "$pg" -U flooder -c 2 -j 2 -T "$(( SECONDS_ + 4 ))" -f "$work/notify.sql" mwmq \
    > "$work/pgb/flood.out" 2>&1 & pids+=($!)
  flood=$!
  sleep 2
  measure "$WAITERS waiting, NOTIFY flood"
  wait "$flood" || true
  rate=$(sed -n 's/^tps = \([0-9]*\).*/\1/p' "$work/pgb/flood.out" | head -1)
  echo "(the flood: ${rate:-?} NOTIFYs a second; heard (wake_hints): $(info "$A" wake_hints 2>/dev/null || echo '-');" \
    "blocked_clients after it: $(info "$A" blocked_clients))"
  exec 3>&-
fi
if [ "${PARTS:-flood cross}" != flood ]; then
  start_mwmq "$B"
  out=$(python3 "$work/wake.py" cross "$A" "$B" "$ROUNDS")
  read -r p50 p90 top <<< "$out"
  echo "cross-process wake-up, $ROUNDS rounds: median $p50 ms, p90 $p90 ms, largest $top ms"
fi

#!/usr/bin/env bash
# A throwaway PostgreSQL server in a directory of its own, listening on a unix
# socket only (no TCP port), for tests, benchmarks, the lab and trying mwmq.
#
#   scripts/postgres.sh start DIR [SETTING=VALUE ...]   initdb if needed, start; prints the connection string
#   scripts/postgres.sh stop DIR                        fast shutdown
#   scripts/postgres.sh restart DIR [fast|immediate]    stop (immediate: as after a crash) and start again
#   scripts/postgres.sh conninfo DIR                    the connection string of a started server
#
# PostgreSQL refuses to run as root: when run as root, the server runs as the
# `postgres` user (created by Debian's package), which owns DIR. Settings such
# as fsync=off are passed to the server (`-c`); port=N changes the port (of the
# socket, and of TCP when listen_addresses is given too). The database is `mwmq`, the
# superuser `postgres`, authentication `trust` over the socket (nobody else can
# reach a socket in DIR). hba=CIDR (with listen_addresses=ADDR) also trusts TCP
# connections from CIDR: for a database on an emulated host of the lab, whose
# network is private to this machine.
set -euo pipefail

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[ $# -ge 2 ] || usage
cmd=$1
dir=$2
shift 2

bindir=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
  if [ -x "$d/initdb" ]; then bindir=$d; break; fi
done
if [ -z "$bindir" ]; then
  if command -v initdb >/dev/null 2>&1; then bindir=$(dirname "$(command -v initdb)"); else
    echo "postgres.sh: PostgreSQL is not installed (Debian package postgresql; make test installs it)" >&2
    exit 1
  fi
fi

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# The port (5432 unless a port=N setting is given at start, remembered for later).
port() { cat "$dir/port" 2>/dev/null || echo 5432; }
conninfo() { echo "host=$dir port=$(port) user=postgres dbname=mwmq"; }

start() {
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || { echo "postgres.sh: no postgres user (install the postgresql package)" >&2; exit 1; }
    chown postgres "$dir"
    chmod 700 "$dir"
    if ! runuser -u postgres -- test -x "$dir"; then
      # The parents the postgres user may not enter (mktemp -d makes one: mode 700).
      blocked=""
      p=$dir
      while [ "$p" != / ]; do
        p=$(dirname "$p")
        runuser -u postgres -- test -x "$p" || blocked="$p${blocked:+ }$blocked"
      done
      echo "postgres.sh: the postgres user cannot reach $dir: it may not enter ${blocked:-a parent directory}." >&2
      echo "  chmod 755 ${blocked:-that directory}, or use a directory whose parents others may enter (mkdir /tmp/pg)" >&2
      exit 1
    fi
  fi
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_owner "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 || {
      echo "postgres.sh: initdb failed:" >&2
      cat "$dir/initdb.log" >&2
      exit 1
    }
  fi
  local port=5432
  local opts="-c listen_addresses='' -c unix_socket_directories='$dir'"
  for s in "$@"; do
    case $s in
      port=*) port=${s#port=} ;;
      hba=*)
        line="host all all ${s#hba=} trust"
        grep -qxF "$line" "$dir/data/pg_hba.conf" || echo "$line" | as_owner tee -a "$dir/data/pg_hba.conf" >/dev/null
        ;;
      *) opts="$opts -c $s" ;;
    esac
  done
  opts="$opts -p $port"
  echo "$port" >"$dir/port"
  as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$opts" start >/dev/null || {
    echo "postgres.sh: the server did not start:" >&2
    tail -20 "$dir/server.log" >&2
    exit 1
  }
  echo "$opts" >"$dir/options"
  if ! as_owner "$bindir/psql" -h "$dir" -p "$port" -U postgres -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = 'mwmq'" | grep -q 1; then
    as_owner "$bindir/createdb" -h "$dir" -p "$port" -U postgres mwmq
  fi
  conninfo
}

stop() {
  [ -f "$dir/data/postmaster.pid" ] || return 0
  as_owner "$bindir/pg_ctl" -D "$dir/data" -m "${1:-fast}" -w -t 60 stop >/dev/null
}

case "$cmd" in
  start) start "$@" ;;
  stop) stop fast ;;
  restart)
    mode=${1:-fast}
    stop "$mode"
    opts=$(cat "$dir/options")
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$opts" start >/dev/null
    ;;
  conninfo) conninfo ;;
  *) usage ;;
esac

# Shell helpers shared by scripts/ and bench/ (sourced, not run).

# A TCP port on 127.0.0.1 that was free a moment ago and that this script
# has not been given before (the kernel may hand out the same free port twice
# in a row while the server given the first has not bound it yet; the list
# is a file because the function runs in a subshell: p=$(free_port)).
free_port() {
  local p list="/tmp/.free-ports.$$"
  while :; do
    p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    grep -qx "$p" "$list" 2>/dev/null || break
  done
  echo "$p" >> "$list"
  echo "$p"
}

# Whether something accepts connections on 127.0.0.1:$1.
in_use() { (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }

# Waits up to 20 s for 127.0.0.1:$1 to accept connections, else exits.
wait_port() {
  for _ in $(seq 400); do in_use "$1" && return 0; sleep 0.05; done
  echo "nothing listens on port $1" >&2
  exit 1
}

# CPU time (user + system) process $1 has used so far, in clock ticks (getconf CLK_TCK).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# memcached refuses to run as root without -u.
user_flag=()
if [ "$(id -u)" = 0 ]; then user_flag=(-u root); fi

# Processes started by the script (stopped on exit) and its scratch directory.
pids=()
work=""
cleanup() {
  rm -f "/tmp/.free-ports.$$"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT INT TERM

# Starts memcached on 127.0.0.1:$1 (more memcached arguments may follow).
start_memcached() {
  local port=$1
  shift
  memcached -l 127.0.0.1 -p "$port" -U 0 "${user_flag[@]}" "$@" & pids+=($!)
}

# Starts twemproxy (nutcracker, ketama/md5) on 127.0.0.1:$1 in front of the
# memcached ports that follow; its config goes into $work.
start_twemproxy() {
  local port=$1 conf p
  shift
  conf="$work/nutcracker-$port.yml"
  {
    echo "pool:"
    echo "  listen: 127.0.0.1:$port"
    echo "  hash: md5"
    echo "  distribution: ketama"
    echo "  timeout: 1000"
    echo "  servers:"
    for p in "$@"; do echo "   - 127.0.0.1:$p:1"; done
  } > "$conf"
  nutcracker -c "$conf" -s "$(free_port)" -a 127.0.0.1 >/dev/null 2>&1 & pids+=($!)
}

# A throwaway PostgreSQL for a benchmark: sets work (a scratch directory under
# /tmp, prefix $1), pg (its directory), db (the connection string), PGBIN and
# as_pg (runs a command as the server's user); stopped on exit.
throwaway_postgres() {
  work=$(mktemp -d "/tmp/$1.XXXXXX")
  chmod 755 "$work"
  pg="$work/pg"
  trap 'scripts/postgres.sh stop "$pg" >/dev/null 2>&1 || true; cleanup' EXIT INT TERM
  db=$(scripts/postgres.sh start "$pg")
  PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
}
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

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

# Port variables of the run-* scripts (make run-proxy PROXY_PORT=11400 ...).
# A variable the caller set names the port to use (exits if it is not one or
# is taken: the operator asked for that port); an unset one takes the
# script's default, or a free port when the default is taken (said on
# stderr, with the variable that chooses another).

# Checks that $2 is a port ($1 is the variable that gave it) and that nothing listens on it.
check_port() {
  if ! [[ $2 =~ ^[0-9]+$ ]] || [ "$2" -lt 1 ] || [ "$2" -gt 65535 ]; then
    echo "$1: '$2' is not a port number" >&2
    exit 2
  fi
  if in_use "$2"; then
    echo "$1: port $2 is already in use (choose another, or leave $1 unset to have a free one picked)" >&2
    exit 1
  fi
}

# Sets the variable named $1 to a port: its own value if set, else $2 or a free one.
choose_port() {
  local name=$1 default=$2 given=${!1:-} p
  if [ -n "$given" ]; then
    check_port "$name" "$given"
    return
  fi
  p=$default
  if in_use "$p"; then
    p=$(free_port)
    echo "port $default ($name's default) is in use: using $p instead" >&2
  fi
  printf -v "$name" %s "$p"
}

# Sets the array named $1 to ports: the words of its own value if set
# (spaces or commas between them), else the defaults that follow, each
# replaced by a free port when it is taken.
choose_ports() {
  local name=$1 given=${!1:-} p out=()
  shift
  if [ -n "$given" ]; then
    for p in ${given//,/ }; do
      check_port "$name" "$p"
      out+=("$p")
    done
  else
    for p in "$@"; do
      if in_use "$p"; then
        local q
        q=$(free_port)
        echo "port $p (of $name's defaults) is in use: using $q instead" >&2
        p=$q
      fi
      out+=("$p")
    done
  fi
  eval "$name=(\"\${out[@]}\")"
}

# A binary of this repository: the one the variable named $1 names (such as
# MWPROXY_BIN), else target/release/$2; exits saying how to build it (make $3).
repo_binary() {
  local b=${!1:-target/release/$2}
  if [ -n "${!1:-}" ] && [ ! -x "$b" ]; then
    echo "$1=$b: no such executable" >&2
    exit 1
  elif [ ! -x "$b" ]; then
    echo "$b is not built: make $3 builds it (or cargo build --release; $1=PATH names another)" >&2
    exit 1
  fi
  echo "$b"
}

# The command that prints the page at URL $1: curl where it is installed, else Python.
fetch_cmd() {
  if command -v curl >/dev/null 2>&1; then
    echo "curl -s $1"
  else
    echo "python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode(), end=\"\")' $1"
  fi
}

# Waits up to 20 s for 127.0.0.1:$1 to accept connections, else exits; with
# a process id ($2), exits as soon as that process has.
wait_port() {
  for _ in $(seq 400); do
    in_use "$1" && return 0
    if [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null; then
      echo "process $2 exited before listening on port $1" >&2
      exit 1
    fi
    sleep 0.05
  done
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

# mwmq's configuration for make run-mq and run-mq-ha, in $work/mwmq.toml:
# the admin endpoint on 127.0.0.1:$1 and its /ui page, logged into with a
# token made for this run ($work/admin-token).
mwmq_admin_config() {
  (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$work/admin-token")
  cat > "$work/mwmq.toml" <<TOML
[stats]
admin = "127.0.0.1:$1"
admin_token_file = "$work/admin-token"
TOML
}

# The lines of run-mq's and run-mq-ha's banners that name the admin endpoint's pages.
mwmq_admin_banner() {
  local admin="http://127.0.0.1:$1"
  echo "admin endpoint: $admin/metrics $admin/stats $admin/healthz $admin/readyz (ADMIN_PORT)"
  echo "the queues in a browser: $admin/ui"
  echo "  (log in with the admin token in $work/admin-token to pause, resume, redrive)"
}

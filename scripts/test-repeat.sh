#!/usr/bin/env bash
# Runs the tests N times from a clean clone of this checkout's HEAD and
# tabulates every failure by test: the proof that a suite does not depend on
# luck.
#
#   scripts/test-repeat.sh 3 --fresh                 make test, 3 times, each from a new clone
#   scripts/test-repeat.sh 10 lab                    the lab's tests, 10 times in one clone
#   scripts/test-repeat.sh 5 --hog lab rust          with one core kept busy the whole time
#   scripts/test-repeat.sh 10 streams lab/tests/test_netns.py
#   scripts/test-repeat.sh 1 slow                    make test-slow (what CI runs)
#
# What to run: `all` (make test, the default), `slow` (make test-slow),
# `rust` (every Rust test binary), `lab`, a Rust suite's name (`streams`,
# `mwmq::streams`, a crate's name) or a pytest path. Several may be given.
# --hog keeps one core busy with a CPU-bound process from start to end (what
# a shared CI host looks like). --fresh clones anew for every run (and so
# builds and installs every time); otherwise one clone, kept in
# target/test-repeat/clone between invocations (its build and .venv reused, its
# files brought to HEAD), serves every run. --keep leaves the fresh clones.
#
# Each run's output is kept in target/test-repeat/<when>/run-K.log (and a red
# run's suites' own logs beside it, run-K-suites/); the
# table at the end counts, for every test that failed at least once, the runs
# it failed in.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  [ $# -eq 0 ] && exit 2 || exit 0
fi
n=$1
shift
hog=0 fresh=0 keep=0 what=()
for a in "$@"; do
  case "$a" in
    --hog) hog=1 ;;
    --fresh) fresh=1 ;;
    --keep) keep=1 ;;
    -*) echo "unknown option $a" >&2; exit 2 ;;
    *) what+=("$a") ;;
  esac
done
[ "${#what[@]}" -gt 0 ] || what=(all)
[[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || { echo "N must be a positive number, not $n" >&2; exit 2; }

src=$PWD
top=$(mktemp -d /tmp/test-repeat.XXXXXX)
hog_pid=""
finish() {
  [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null
  if [ "$keep" = 0 ]; then rm -rf "$top"; else echo "clones kept in $top"; fi
}
trap finish EXIT
if [ "$hog" = 1 ]; then
  python3 -c 'while True: pass' &
  hog_pid=$!
  echo "a CPU hog runs as process $hog_pid"
fi

# The command one run is, inside a clone.
command_of() {
  local args=() w
  for w in "${what[@]}"; do
    case "$w" in
      all) echo "make test"; return ;;
      slow) echo "make test-slow"; return ;;
      rust) args+=(--only mcproto --only mctest --only mwload --only mwmq --only mwproxy --only mwrelay --only mwserve --only mwstats --only respproto) ;;
      *) args+=(--only "$w") ;;
    esac
  done
  # As make test runs them: two Rust test binaries side by side.
  echo "scripts/testrun.py --no-build --jobs 2 ${args[*]}"
}
cmd=$(command_of)

clone() {
  local dir=$1
  git clone -q "$src" "$dir"
  git -C "$dir" checkout -q "$(git -C "$src" rev-parse HEAD)"
}

logdir="$src/target/test-repeat/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$logdir"
results="$logdir/failures.tsv"
: > "$results"
dir="$top/clone"
if [ "$fresh" = 0 ]; then
  # One clone for every run, kept between invocations in target/ so that its
  # build is incremental: brought to HEAD and cleaned of everything but its
  # build and its .venv before each invocation.
  dir="$src/target/test-repeat/clone"
  if [ -d "$dir/.git" ]; then
    git -C "$dir" fetch -q "$src" HEAD
    git -C "$dir" checkout -q --force FETCH_HEAD
    git -C "$dir" clean -q -ffdx -e /target -e /.venv
  else
    clone "$dir"
  fi
  if [[ "$cmd" != make* ]]; then
    echo "preparing the clone (installs and build)"
    (cd "$dir" && make -s deps test-deps rust-deps python-deps >/dev/null && cargo build -q --workspace --bins && \
      cargo test -q --workspace --no-run >/dev/null 2>&1)
  fi
fi
for k in $(seq "$n"); do
  if [ "$fresh" = 1 ]; then
    dir="$top/clone-$k"
    clone "$dir"
  fi
  log="$logdir/run-$k.log"
  t0=$(date +%s)
  set +e
  (cd "$dir" && $cmd) > "$log" 2>&1
  rc=$?
  set -e
  took=$(( $(date +%s) - t0 ))
  # The failures of the run, from the summary scripts/testrun.py ends with.
  python3 - "$log" "$k" >> "$results" <<'EOF'
import re, sys
log, run = sys.argv[1], sys.argv[2]
seen, inside = [], False
for line in open(log, errors="replace"):
    if line.startswith("==> FAILED"):
        inside = True
    elif inside:
        m = re.match(r"^  (.+?): (.+?)   \(log: ", line)
        if not m:
            break
        seen.append(f"{m.group(1)} {m.group(2)}")
for s in seen:
    print(f"{run}\t{s}")
EOF
  nfail=$(awk -F'\t' -v r="$k" '$1 == r' "$results" | wc -l)
  if [ "$rc" = 0 ]; then
    status=green
  else
    status="RED ($nfail failed)"
    [ "$nfail" = 0 ] && printf '%s\t(exit status %s, see the log)\n' "$k" "$rc" >> "$results"
    cp -r "$dir/target/test-logs" "$logdir/run-$k-suites" 2>/dev/null || true
  fi
  printf 'run %d of %d: %s in %d min %d s   (%s)\n' "$k" "$n" "$status" $((took / 60)) $((took % 60)) "$log"
  [ "$fresh" = 1 ] && [ "$keep" = 0 ] && [ "$k" -lt "$n" ] && rm -rf "$dir"
done

echo
echo "$cmd, $n runs$([ "$hog" = 1 ] && echo ', one core taken by a CPU hog')"
if [ ! -s "$results" ]; then
  echo "no test failed"
else
  printf '%-8s %s\n' "failed" "test (runs)"
  cut -f2 "$results" | sort | uniq -c | sort -rn | while read -r count name; do
    runs=$(awk -F'\t' -v t="$name" '$2 == t {print $1}' "$results" | paste -sd, -)
    printf '%2d of %-3d %s (%s)\n' "$count" "$n" "$name" "$runs"
  done
  exit 1
fi

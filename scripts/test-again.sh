#!/usr/bin/env bash
# Runs one crate's integration tests again, from the binaries `cargo test
# --workspace` built, with other settings in the environment:
#
#   scripts/test-again.sh mwproxy MWPROXY_TEST_ENGINE=async
#   scripts/test-again.sh mwmq MWMQ_TEST_ENGINE=pool -- --skip some_test
#   scripts/test-again.sh mwmq MWMQ_TEST_ENGINE=pool --without failover --without crash
#   scripts/test-again.sh mwmq MWMQ_TEST_ENGINE=pool --only failover --only crash
#
# (--without leaves a suite, tests/NAME.rs, out; --only runs just the suites named.)
#
# (`cargo test -p CRATE` would resolve the dependencies' features for that
# crate alone and rebuild a third of them: over a minute of `make test`.)
# Every binary runs, in the crate's directory as cargo runs it; the exit
# status is 1 when any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=${1:?usage: scripts/test-again.sh CRATE [VAR=VALUE ...] [-- TEST ARGS]}
shift
envs=() without=() only=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --without) without+=("$2"); shift 2 ;;
    --only) only+=("$2"); shift 2 ;;
    *) envs+=("$1"); shift ;;
  esac
done
[ "${1:-}" = "--" ] && shift
mapfile -t exes < <(cargo test --workspace --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
pkg = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target") or {}
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in t.get("kind", []) \
            and t.get("src_path", "").startswith(sys.argv[2]):
        print(m["executable"])
' "$pkg" "$PWD/crates/$pkg/")
[ "${#exes[@]}" -gt 0 ] || { echo "no integration tests of crate $pkg were built: run cargo test --workspace first" >&2; exit 2; }
failed=()
for exe in "${exes[@]}"; do
  suite=$(basename "$exe")
  suite=${suite%-*}
  skip=0
  for w in "${without[@]}"; do [ "$suite" = "$w" ] && skip=1; done
  if [ "${#only[@]}" -gt 0 ]; then
    skip=1
    for o in "${only[@]}"; do [ "$suite" = "$o" ] && skip=0; done
  fi
  [ "$skip" = 1 ] && continue
  echo "     Running $(basename "$exe") (${envs[*]:-})"
  (cd "crates/$pkg" && env "${envs[@]}" "$exe" "$@") || failed+=("$(basename "$exe")")
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi

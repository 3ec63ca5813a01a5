#!/usr/bin/env python3
"""Runs the project's tests as `make test` and `make test-slow` do, and says
where the time went.

    scripts/testrun.py                 every test, each service's default engine (make test)
    scripts/testrun.py --engines both  and every mwproxy and mwmq suite again with the
                                       other engine (make test-slow, what CI runs)
    scripts/testrun.py --jobs 2        two Rust test binaries side by side
    scripts/testrun.py --only streams --only lab   some suites (Rust binary names, `lab`,
                                       `clients` or a pytest path such as lab/tests/test_netns.py)
    scripts/testrun.py --only mwproxy::hostile -- clients_that_never_read
                                       arguments after -- go to each Rust test binary

Phases: the build (every binary and test binary), the Rust test binaries (each
run from its crate's directory as cargo runs it, its output kept in
target/test-logs/), the second engines, the lab (pytest), the Python client of
mwmq (`clients`: pytest over clients/python/tests). At the end: how long
each phase took, the ten slowest tests, and every failure with the log that
holds it. A Rust binary's per-test times come from libtest's `--report-time`
(an unstable flag of the test harness, unlocked for the test binaries alone
with RUSTC_BOOTSTRAP; the code itself is built by the stable compiler as
always); where a harness refuses it, the binary's time stands for its tests.

`make test` stamps its start in target/test-logs/start before installing
what it needs, so the installs are a phase too. Only the standard library is
used: this runs before the lab's virtual environment exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "target" / "test-logs"
# The other engine of each service (the default is tested first).
OTHER_ENGINE = {"mwproxy": "MWPROXY_TEST_ENGINE=pool", "mwmq": "MWMQ_TEST_ENGINE=pool"}
TEST_LINE = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)(?: <(\d+(?:\.\d+)?)s>)?")
PRINT_LOCK = threading.Lock()


@dataclass
class Binary:
    """A test binary cargo built: the crate, the suite's name, its path."""

    crate: str
    suite: str  # "unit" for a crate's own tests, else tests/<suite>.rs
    exe: str

    @property
    def name(self) -> str:
        return f"{self.crate}::{self.suite}"


@dataclass
class Outcome:
    """What one run of a suite gave."""

    name: str
    seconds: float
    ok: bool
    log: Path
    tests: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


def say(*parts: str) -> None:
    with PRINT_LOCK:
        print(*parts, flush=True)


def timed(label: str, cmd: list[str], phases: dict[str, float]) -> None:
    """Runs a command in the foreground (its output shown), timed as a phase."""
    say(f"==> {label}: {' '.join(cmd)}")
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT)
    phases[label] = phases.get(label, 0.0) + time.monotonic() - t0
    if r.returncode != 0:
        say(f"{label} failed (exit status {r.returncode})")
        sys.exit(r.returncode)


def test_binaries(phases: dict[str, float]) -> list[Binary]:
    """Builds every test binary of the workspace; the list cargo reports."""
    say("==> build: cargo test --workspace --no-run")
    t0 = time.monotonic()
    r = subprocess.run(
        ["cargo", "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    phases["build"] = phases.get("build", 0.0) + time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(r.returncode)
    found = []
    for line in r.stdout.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") != "compiler-artifact" or not m.get("executable"):
            continue
        target = m["target"]
        if not m.get("profile", {}).get("test"):
            continue
        crate = Path(m["manifest_path"]).parent.name
        suite = target["name"] if "test" in target["kind"] else "unit" if "lib" in target["kind"] else target["name"]
        found.append(Binary(crate, suite, m["executable"]))
    return found


def run_binary(b: Binary, env: str | None, args: list[str]) -> Outcome:
    """Runs one test binary from its crate's directory, its output to a log."""
    tag = b.name + (f" [{env}]" if env else "")
    log = LOGS / (f"{b.crate}-{b.suite}" + (f"-{env.split('=')[1]}" if env else "") + ".log")
    e = dict(os.environ, RUSTC_BOOTSTRAP="1")
    if env:
        k, v = env.split("=", 1)
        e[k] = v
    say(f"     running {tag}")
    t0 = time.monotonic()
    with log.open("w") as out:
        r = subprocess.run(
            [b.exe, "-Z", "unstable-options", "--report-time", *args],
            cwd=ROOT / "crates" / b.crate,
            env=e,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    took = time.monotonic() - t0
    o = Outcome(tag, took, r.returncode == 0, log)
    for line in log.read_text(errors="replace").splitlines():
        m = TEST_LINE.match(line)
        if m:
            if m.group(2) == "FAILED":
                o.failed.append(m.group(1))
            if m.group(3):
                o.tests[f"{tag} {m.group(1)}"] = float(m.group(3))
    if not o.ok and not o.failed:
        o.failed.append(f"(the binary exited with status {r.returncode})")
    count = sum(1 for line in log.read_text(errors="replace").splitlines() if TEST_LINE.match(line))
    if o.ok:
        say(f"  ok {tag}: {count} tests in {took:.1f} s")
    else:
        with PRINT_LOCK:
            print(f"FAIL {tag}: {', '.join(o.failed)} ({took:.1f} s; whole output in {log})")
            print(failure_section(log), flush=True)
    return o


def failure_section(log: Path) -> str:
    """The part of a libtest output that tells why (from `failures:` on)."""
    text = log.read_text(errors="replace")
    i = text.find("\nfailures:\n")
    return text[i:] if i >= 0 else text[-8000:]


# The pytest suites: a name (what --only takes), the directory of its
# pyproject.toml (pytest's rootdir, which JUnit's class names start from) and
# what pytest runs by default.
PYTEST_SUITES = {"lab": ("lab", "lab"), "clients": ("clients/python", "clients/python/tests")}


def pytest_suite(only: str) -> str | None:
    """The pytest suite a --only value names (its name or a path in it), or None."""
    for name, (root, _) in PYTEST_SUITES.items():
        if only == name or only.startswith(root + "/"):
            return name
    return None


def node_id(classname: str, name: str, root: str = "lab") -> str:
    """pytest's own name of a test (what `--only` and pytest take) from a
    JUnit case: `tests.test_mq` + `test_x` -> `lab/tests/test_mq.py::test_x`."""
    parts = classname.split(".")
    module = max((i for i, p in enumerate(parts) if p.startswith("test_")), default=len(parts) - 1)
    return "::".join([f"{root}/" + "/".join(parts[: module + 1]) + ".py", *parts[module + 1 :], name])


def run_lab(phases: dict[str, float], paths: list[str], suite: str = "lab") -> list[Outcome]:
    """pytest over a suite (the lab, the Python client; or the paths given),
    per-test times from its JUnit file; its whole output is shown and kept in
    target/test-logs/<suite>.log."""
    root, default = PYTEST_SUITES[suite]
    junit, log = LOGS / f"{suite}.xml", LOGS / f"{suite}.log"
    junit.unlink(missing_ok=True)
    cmd = [str(ROOT / ".venv" / "bin" / "pytest"), *(paths or [default]), f"--junitxml={junit}", "--durations=10"]
    say(f"==> {suite}: {' '.join(cmd)}")
    t0 = time.monotonic()
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, cwd=ROOT, env=lab_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.stdout is not None
        for line in p.stdout:
            sys.stdout.write(line)
            out.write(line)
        returncode = p.wait()
    took = time.monotonic() - t0
    phases[suite] = phases.get(suite, 0.0) + took
    o = Outcome(suite, took, returncode == 0, log)
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = node_id(case.get("classname", ""), case.get("name", ""), root)
            o.tests[name] = float(case.get("time", 0))
            if case.find("failure") is not None or case.find("error") is not None:
                o.failed.append(name)
    if not o.ok and not o.failed:
        o.failed.append(f"(pytest exited with status {returncode})")
    return [o]


def lab_env() -> dict[str, str]:
    """The lab runs the binaries this run built (target/debug), not a release
    build an earlier `make run` or `make bench` left behind."""
    env = dict(os.environ)
    debug = ROOT / "target" / "debug"
    for name in ("mwproxy", "mwmq", "mwload", "mwrelay", "mwsample"):
        if (debug / name).exists():
            env.setdefault(f"{name.upper()}_BIN", str(debug / name))
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", choices=["default", "both"], default="default")
    ap.add_argument("--jobs", type=int, default=1, help="Rust test binaries run side by side")
    ap.add_argument("--only", action="append", default=[], help="a suite: a Rust binary's name, lab, or a path")
    ap.add_argument("--no-build", action="store_true", help="skip `cargo build --bins` (test binaries are still brought up to date)")
    ap.add_argument("test_args", nargs="*", help="after --: given to each Rust test binary (a filter, --nocapture)")
    args = ap.parse_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    # Only this run's logs (the start stamp stays: `make` left it).
    for old in LOGS.iterdir():
        if old.is_file() and old.name != "start":
            old.unlink()
    start = time.time()
    phases: dict[str, float] = {}
    stamp = LOGS / "start"
    if stamp.exists():
        began = float(stamp.read_text().strip() or start)
        phases["installs"] = max(0.0, start - began)
        stamp.unlink()
    else:
        began = start
    if not args.no_build:
        timed("build", ["cargo", "build", "--workspace", "--bins"], phases)
    binaries = test_binaries(phases)
    py_only = {name: [o for o in args.only if pytest_suite(o) == name] for name in PYTEST_SUITES}
    rust_only = [o for o in args.only if pytest_suite(o) is None]
    if args.only:
        # Only the named suites: none of the Rust binaries when only the lab's were named.
        binaries = [b for b in binaries if b.suite in rust_only or b.name in rust_only or b.crate in rust_only]
        unknown = [o for o in rust_only if not any(o in (b.suite, b.name, b.crate) for b in binaries)]
        if unknown:
            print(f"no test suite is called {', '.join(unknown)}", file=sys.stderr)
            return 2
    outcomes: list[Outcome] = []
    runs: list[tuple[str, Binary, str | None]] = [("rust", b, None) for b in binaries]
    if args.engines == "both":
        runs += [
            ("second engine", b, OTHER_ENGINE[b.crate])
            for b in binaries
            # (Not the unit tests of the library or of the binary itself.)
            if b.crate in OTHER_ENGINE and b.suite not in ("unit", b.crate)
        ]
    for phase in ("rust", "second engine"):
        mine = [(b, env) for p, b, env in runs if p == phase]
        if not mine:
            continue
        say(f"==> {phase}: {len(mine)} test binaries, {args.jobs} at a time")
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes += list(pool.map(lambda be: run_binary(be[0], be[1], args.test_args), mine))
        phases[phase] = time.monotonic() - t0
    for suite, named in py_only.items():
        if not args.only or named:
            outcomes += run_lab(phases, [p for p in named if p != suite], suite)
    summary(outcomes, phases, time.time() - began)
    return 0 if all(o.ok for o in outcomes) else 1


def summary(outcomes: list[Outcome], phases: dict[str, float], total: float) -> None:
    """Where the time went, the slowest tests, and what failed."""
    print("\n==> where the time went")
    for name, secs in phases.items():
        print(f"  {name:<14} {secs / 60:5.1f} min")
    print(f"  {'in all':<14} {total / 60:5.1f} min")
    suites = sorted((o for o in outcomes), key=lambda o: -o.seconds)[:10]
    print("\n==> the ten slowest suites")
    for o in suites:
        print(f"  {o.seconds:7.1f} s  {o.name}")
    tests = sorted(((t, n) for o in outcomes for n, t in o.tests.items()), reverse=True)[:10]
    print("\n==> the ten slowest tests")
    for secs, name in tests:
        print(f"  {secs:7.1f} s  {name}")
    failed = [o for o in outcomes if not o.ok]
    if failed:
        print("\n==> FAILED")
        for o in failed:
            for t in o.failed:
                print(f"  {o.name}: {t}   (log: {o.log})")
    else:
        print(f"\n==> all {len(outcomes)} suites passed")


if __name__ == "__main__":
    sys.exit(main())

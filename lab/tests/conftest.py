"""Fixtures: real memcached and mwproxy processes on free loopback ports (stopped
after each test, through the lab's own process group), and a textbook example.

A failed test explains itself: its report ends with the tail of the log of
every process it started (memcached, mwproxy, mwmq, mwload, PostgreSQL, the
relays: `mwlab.procs.started_since`), those of the module- and
session-scoped fixtures it uses included, and the seeds it ran with (the
`--seed` of each command, and any `seed` the test recorded with
`record_property`)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mwlab.procs import (
    ProcessGroup,
    Started,
    binary,
    free_port,
    note_started,
    started_mark,
    started_since,
    wait_port,
)

# How much of each log a failure report shows.
TAIL_LINES = 40
TAIL_CHARS = 6000
# At most this many logs per failure (the latest ones).
MAX_LOGS = 16

# Per fixture name (of a broader scope than a test): the processes its last setup started.
_FIXTURE_STARTS: dict[str, tuple[int, int]] = {}
_TEST_START = pytest.StashKey[int]()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    before = started_mark()
    yield
    if fixturedef.scope != "function":
        _FIXTURE_STARTS[fixturedef.argname] = (before, started_mark())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_TEST_START] = started_mark()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("setup", "call", "teardown"):
        for title, text in failure_sections(item):
            report.sections.append((title, text))


def failure_sections(item) -> list[tuple[str, str]]:
    """The seeds and log tails of what `item` started, and of the broader fixtures it uses."""
    procs: dict[int, Started] = {}
    for name in item.fixturenames:
        if name in _FIXTURE_STARTS:
            lo, hi = _FIXTURE_STARTS[name]
            procs.update((s.seq, s) for s in started_since(lo, hi))
    procs.update((s.seq, s) for s in started_since(item.stash.get(_TEST_START, started_mark())))
    started = [procs[k] for k in sorted(procs)]
    sections = []
    seeds = [f"{k} = {v}" for k, v in item.user_properties if "seed" in str(k)]
    for s in started:
        for i, arg in enumerate(s.cmd[:-1]):
            if arg == "--seed":
                seeds.append(f"{s.name}: --seed {s.cmd[i + 1]}")
    if seeds:
        sections.append(("seeds", "\n".join(seeds)))
    if started:
        lines = [f"{s.name}: {' '.join(s.cmd)}" for s in started]
        sections.append(("processes started", "\n".join(lines)))
    logs = [(s.name, log) for s in started for log in s.logs()]
    if len(logs) > MAX_LOGS:
        left_out = len(logs) - MAX_LOGS
        sections.append(("logs", f"{left_out} earlier logs left out; the latest {MAX_LOGS} follow"))
    for name, log in logs[-MAX_LOGS:]:
        sections.append((f"log tail: {name} ({log})", tail(log)))
    return sections


def tail(path: Path) -> str:
    """The last lines of a log (what there is of it)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4 * TAIL_CHARS))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(not readable: {e})"
    text = "\n".join(text.splitlines()[-TAIL_LINES:])[-TAIL_CHARS:]
    return text or "(empty)"


GOREDIS = Path(__file__).parent / "goredis"
_GO_BUILD = pytest.StashKey["GoBuild"]()


class GoBuild:
    """The go-redis stream worker of lab/tests/goredis, compiled in the
    background: on a cold Go cache it takes minutes, which the tests
    collected before it spend running (none of them times anything)."""

    def __init__(self) -> None:
        go = shutil.which("go") or "/usr/local/go/bin/go"
        self.dir = Path(tempfile.mkdtemp(prefix="mwlab-goredis-"))
        self.exe = self.dir / "goredis-streams"
        self.log = self.dir / "build.log"
        cmd = [go, "build", "-o", str(self.exe), "."]
        self.error = ""
        self.proc: subprocess.Popen | None = None
        try:
            with self.log.open("wb") as f:
                self.proc = subprocess.Popen(cmd, cwd=GOREDIS, stdout=f, stderr=subprocess.STDOUT)
            note_started("go build", cmd, self.log)
        except OSError as e:
            self.error = f"`{' '.join(cmd)}` could not start: {e} (make test-deps says how to install Go)"

    def wait(self, timeout: float = 900) -> Path:
        """The worker's path once built (fails the test with go's output if it did not build)."""
        if self.proc is None:
            pytest.fail(self.error)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"go build did not finish in {timeout:.0f} s: {tail(self.log)}")
        if code != 0:
            pytest.fail(f"go build failed ({code}): {tail(self.log)}")
        return self.exe

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def pytest_collection_finish(session):
    if any(item.name.startswith("test_go_redis") for item in session.items):
        session.config.stash[_GO_BUILD] = GoBuild()


def pytest_sessionfinish(session):
    build = session.config.stash.get(_GO_BUILD, None)
    if build is not None:
        build.close()


@pytest.fixture
def goredis_worker(request) -> Path:
    """The go-redis stream worker's executable (built when the session began)."""
    config = request.config
    if _GO_BUILD not in config.stash:
        config.stash[_GO_BUILD] = GoBuild()
    return config.stash[_GO_BUILD].wait()


# Jain, Example 18.1 (a 2^2 3 design): (memory, cache) levels -> three observations.
JAIN_18_1 = {
    ("-", "-"): (15, 18, 12),
    ("+", "-"): (45, 48, 51),
    ("-", "+"): (25, 28, 19),
    ("+", "+"): (75, 75, 81),
}


@pytest.fixture
def jain_18_1() -> tuple[list[tuple[str, str]], list[float]]:
    """Rows of factor levels and observations of Jain's Example 18.1."""
    rows, y = [], []
    for levels, obs in JAIN_18_1.items():
        rows += [levels] * len(obs)
        y += list(obs)
    return rows, y


@pytest.fixture
def memcached(tmp_path) -> Iterator[int]:
    """A memcached server on a free port."""
    with ProcessGroup(tmp_path / "memcached-logs") as group:
        yield group.memcached("mc").port


class Proxy:
    """An mwproxy process with its admin endpoint on."""

    def __init__(self, group: ProcessGroup, args: list[str]):
        self.port = free_port()
        self.admin_port = free_port()
        cmd = [
            str(binary("mwproxy")),
            "-p",
            str(self.port),
            "--admin",
            str(self.admin_port),
            "--log",
            "warn",
            *args,
        ]
        self.proc = group.start("mwproxy", cmd, self.port).popen
        wait_port(self.admin_port)

    def stop(self) -> int:
        """SIGTERM, then the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)


@pytest.fixture
def start_proxy(tmp_path) -> Iterator:
    with ProcessGroup(tmp_path / "proxy-logs") as group:
        yield lambda args: Proxy(group, args)

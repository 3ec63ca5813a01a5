"""A red run explains itself: when a lab test fails, its report ends with the
seeds it ran with and the tail of the log of every process it started —
those of a module-scoped fixture it uses too, PostgreSQL's after the server
was stopped — and a passing test prints none of it (the hooks of
conftest.py, run in an inner pytest on a deliberately failing test)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

INNER = '''
import pytest

from mwlab.procs import Postgres, ProcessGroup, binary, free_port, memcached_cmd


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """memcached (verbose) and mwproxy in front of it, shared by the module."""
    with ProcessGroup(tmp_path_factory.mktemp("servers")) as g:
        mc = free_port()
        g.start("mc0", [*memcached_cmd("127.0.0.1", mc), "-vv"], mc)
        mw = free_port()
        cmd = [str(binary("mwproxy")), "-p", str(mw), "-m", f"127.0.0.1:{mc}", "--log", "info"]
        g.start("mw0", cmd, mw)
        yield mw


def test_passes(servers):
    assert servers


def test_fails_after_load_and_a_database(servers, tmp_path, record_property):
    record_property("seed", 977)
    with ProcessGroup(tmp_path / "load") as g:
        cmd = [str(binary("mwload")), "-p", str(servers), "-t", "1", "-c", "1", "-n", "20"]
        cmd += ["--seed", "4242", "--progress", "never", "--out", str(tmp_path / "cl0")]
        assert g.start("cl0", cmd).popen.wait(timeout=60) == 0
    with Postgres(tmp_path / "pg-logs") as pg:
        assert pg.conninfo
    assert 1 + 1 == 3, "deliberately"
'''


def test_a_failed_test_prints_its_seeds_and_the_tail_of_every_log(tmp_path: Path):
    here = Path(__file__).parent
    shutil.copy(here / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "1 failed, 1 passed" in out, out
    failure = out[out.index("test_fails_after_load_and_a_database") :]
    # The seeds: the one the test recorded, and the load generator's.
    assert "seed = 977" in failure and "cl0: --seed 4242" in failure, failure
    # Each process with its command, and the end of its log.
    for name in ("mc0", "mw0", "cl0", "postgres"):
        assert f"log tail: {name} (" in failure, name
    section = {
        name: failure.split(f"log tail: {name} (", 1)[1].split("log tail:", 1)[0]
        for name in ("mc0", "mw0", "cl0")
    }
    assert "STORED" in section["mc0"], "memcached -vv's lines (the module's fixture)"
    assert "mwproxy listening" in section["mw0"], "mwproxy's log at info level"
    assert "Totals" in section["cl0"], "mwload's table"
    # PostgreSQL's log, copied out of its directory when the server stopped.
    assert "database system is ready to accept connections" in failure, failure
    assert "pg-logs/pg-server.log" in failure
    # Nothing of the kind for the test that passed.
    passed = out[: out.index("FAILURES")] if "FAILURES" in out else ""
    assert "log tail" not in passed


def test_free_ports_are_distinct_below_the_ephemeral_range_and_skip_a_bound_one():
    import socket

    from mwlab import procs

    taken = socket.socket()
    taken.bind(("127.0.0.1", procs._NEXT_PORT[0]))
    try:
        blocked = taken.getsockname()[1]
        ports = [procs.free_port() for _ in range(500)]
    finally:
        taken.close()
    assert len(set(ports)) == len(ports)
    assert all(10_000 <= p < 20_000 for p in ports), "outside the lab's range"
    assert blocked not in ports, "a port something listens on was handed out"

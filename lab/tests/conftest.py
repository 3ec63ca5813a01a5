"""Fixtures: real memcached and mwproxy processes on free loopback ports (stopped
after each test, through the lab's own process group), and a textbook example."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from mwlab.procs import ProcessGroup, binary, free_port, wait_port

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

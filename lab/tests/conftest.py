"""Fixtures that start real processes: memcached servers and mwproxy, on free
loopback ports, stopped after each test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

from mwlab.procs import binary, free_port, wait_port

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
def memcached() -> Iterator[int]:
    exe = shutil.which("memcached")
    if exe is None:
        raise RuntimeError("memcached is not installed (make test installs it)")
    port = free_port()
    cmd = [exe, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-t", "1", "-m", "64"]
    if os.geteuid() == 0:
        cmd += ["-u", "root"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield port
    finally:
        proc.kill()
        proc.wait()


class Proxy:
    """An mwproxy process."""

    def __init__(self, args: list[str]):
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
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)
        wait_port(self.admin_port)

    def stop(self) -> int:
        """SIGTERM, then the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)


@pytest.fixture
def start_proxy() -> Iterator:
    started: list[Proxy] = []

    def start(args: list[str]) -> Proxy:
        p = Proxy(args)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()

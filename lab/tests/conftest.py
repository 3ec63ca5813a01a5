"""Fixtures that start real processes: memcached servers and mwproxy, on free
loopback ports, stopped after each test."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port}")


def binary(name: str) -> Path:
    env = os.environ.get(f"{name.upper()}_BIN")
    if env:
        return Path(env)
    for profile in ("debug", "release"):
        p = REPO / "target" / profile / name
        if p.exists():
            return p
    raise RuntimeError(f"{name} is not built: run `cargo build` (make test does)")


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

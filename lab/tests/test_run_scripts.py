"""How the `make run-*` scripts choose their ports (scripts/lib.sh:
choose_port, choose_ports): a port the operator set is used, or refused when
something listens there; a default that is taken is replaced by a free port,
and the script says which. (The scripts themselves run in test_readme.py.)"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mwlab.procs import free_port

REPO = Path(__file__).resolve().parents[2]


def lib(snippet: str, **env: str | int) -> subprocess.CompletedProcess[str]:
    """Runs `snippet` in bash after sourcing scripts/lib.sh, from the repository."""
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; . scripts/lib.sh; {snippet}"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", **{k: str(v) for k, v in env.items()}},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def test_a_default_that_is_taken_is_replaced_by_a_free_port(taken: int):
    done = lib(f'choose_port PROXY_PORT {taken}; echo "$PROXY_PORT"')
    assert done.returncode == 0, done.stderr
    chosen = int(done.stdout)
    assert chosen != taken
    assert done.stderr == f"port {taken} (PROXY_PORT's default) is in use: using {chosen} instead\n"


def test_a_free_default_is_kept():
    port = free_port()
    done = lib(f'choose_port MQ_PORT {port}; echo "$MQ_PORT"')
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{port}\n", "")


def test_a_port_set_is_used_or_refused(taken: int):
    port = free_port()
    done = lib('choose_port ADMIN_PORT 9100; echo "$ADMIN_PORT"', ADMIN_PORT=port)
    assert (done.returncode, done.stdout) == (0, f"{port}\n")
    done = lib('choose_port ADMIN_PORT 9100; echo "$ADMIN_PORT"', ADMIN_PORT=taken)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(f"ADMIN_PORT: port {taken} is already in use (choose another, or leave")
    done = lib("choose_port ADMIN_PORT 9100", ADMIN_PORT="93x")
    assert (done.returncode, done.stderr) == (2, "ADMIN_PORT: '93x' is not a port number\n")


def test_a_list_of_ports(taken: int):
    a, b = free_port(), free_port()
    done = lib(f'choose_ports MC_PORTS {a} {taken} {b}; echo "${{MC_PORTS[@]}}"')
    assert done.returncode == 0, done.stderr
    got = [int(p) for p in done.stdout.split()]
    assert len(got) == 3 and got[0] == a and got[2] == b and got[1] not in (a, b, taken)
    assert done.stderr == f"port {taken} (of MC_PORTS's defaults) is in use: using {got[1]} instead\n"
    # Set: spaces or commas between them; none taken.
    done = lib('choose_ports MC_PORTS 1 2 3; echo "${MC_PORTS[@]}"', MC_PORTS=f"{a},{b}")
    assert (done.returncode, done.stdout) == (0, f"{a} {b}\n")
    done = lib("choose_ports MC_PORTS 1 2 3", MC_PORTS=f"{a} {taken}")
    assert done.returncode == 1
    assert done.stderr.startswith(f"MC_PORTS: port {taken} is already in use")
    # No defaults (run-mq-ha's PG_PORTS: pg-ha.sh picks them): none.
    done = lib('choose_ports PG_PORTS; echo "${#PG_PORTS[@]}"')
    assert (done.returncode, done.stdout) == (0, "0\n")

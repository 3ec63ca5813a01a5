"""Fixtures: one real PostgreSQL and mwmq for the whole session (started
through the lab's `mwlab.procs`, as lab/tests do), with users and a TLS
listener; more mwmq processes on the same database for the tests that kill
one; a fresh queue name per test.

Users of the shared mwmq (`USERS`): `app` may do anything, `other` may send
and receive but administers nothing (so it cannot ACK app's deliveries),
`sender` may only send. A failed test's report ends with the tail of the
logs of the processes started for it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import trustme
from mwlab.procs import Postgres, ProcessGroup, Started, binary, free_port, started_since, wait_port

import mwmq

# name: (password, send, receive, admin); app also acts in SQL as the
# PostgreSQL role app_sql (its database_roles).
USERS = {
    "app": ("app-secret", "*", "*", "*"),
    "other": ("other-secret", "*", "*", None),
    "sender": ("sender-secret", "*", None, None),
}
# This checkout's package, for the Python processes the tests start.
SRC = Path(__file__).resolve().parents[1] / "src"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a Python child process: this checkout's mwmq first."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


# The largest body the shared mwmq takes (--max-body): small, so that a body
# at the limit is cheap to send.
MAX_BODY = 1 << 20


def user_table(name: str, password: str, send: str | None, receive: str | None, admin: str | None) -> str:
    """`mwmq user add`'s [[users]] table (an argon2id hash of the password)."""
    cmd = [str(binary("mwmq")), "user", "add", name, "--password-stdin"]
    for flag, pattern in (("--send", send), ("--receive", receive), ("--admin", admin)):
        if pattern:
            cmd += [flag, pattern]
    out = subprocess.run(cmd, input=f"{password}\n".encode(), capture_output=True, check=True)
    return out.stdout.decode()


@dataclass
class Mwmq:
    """One mwmq process: its plaintext port (loopback), its TLS port, the
    process; `url(user)` for a client."""

    port: int
    tls_port: int
    proc: subprocess.Popen
    name: str
    cmd: list[str]

    def url(self, user: str = "app", tls: bool = False) -> str:
        password = USERS[user][0]
        scheme, port = ("rediss", self.tls_port) if tls else ("redis", self.port)
        return f"{scheme}://{user}:{password}@127.0.0.1:{port}"

    def kill(self) -> None:
        """SIGKILL, and wait for it to be gone."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class Site:
    """The session's PostgreSQL, its users' configuration, the TLS files, and
    the mwmq processes started on it."""

    pg: Postgres
    group: ProcessGroup
    config: Path
    pki: dict[str, Path]
    dir: Path
    main: Mwmq | None = None
    _names: Iterator[int] = field(default_factory=itertools.count)

    def start(
        self, extra_config: str = "", args: list[str] | None = None, users: bool = True, cert: str = "cert"
    ) -> Mwmq:
        """Another mwmq process on the same database (with the same users,
        or none), `extra_config` added to its configuration file; `cert`:
        its TLS certificate and key (`pki`'s `cert`/`key`, or `other`)."""
        n = next(self._names)
        config = self.config
        if extra_config or not users:
            config = self.dir / f"mwmq-{n}.toml"
            config.write_text(extra_config + "\n" + (self.config.read_text() if users else ""))
            config.chmod(0o600)
        tls_port, port = free_port(), free_port()
        cmd = [str(binary("mwmq")), "-c", str(config), "--listen", f"127.0.0.1:{tls_port}"]
        cmd += [
            "--db",
            self.pg.conninfo,
            "--tls-cert",
            str(self.pki[cert]),
            "--tls-key",
            str(self.pki["key" if cert == "cert" else f"{cert}-key"]),
        ]
        cmd += ["--plain-listen", f"127.0.0.1:{port}", "--max-body", str(MAX_BODY), "--log", "warn"]
        cmd += args or []
        p = self.group.start(f"mwmq{n}", cmd)
        wait_port(port, timeout=30, proc=p.popen)
        wait_port(tls_port, timeout=30, proc=p.popen)
        return Mwmq(port, tls_port, p.popen, f"mwmq{n}", cmd)

    def restart(self, old: Mwmq) -> Mwmq:
        """SIGKILLs `old` and starts it again on the same ports."""
        old.kill()
        p = self.group.start(f"{old.name}-again", old.cmd)
        wait_port(old.port, timeout=30, proc=p.popen)
        wait_port(old.tls_port, timeout=30, proc=p.popen)
        return Mwmq(old.port, old.tls_port, p.popen, old.name, old.cmd)

    def freeze_postgres(self) -> list[psutil.Process]:
        """SIGSTOPs every process of the PostgreSQL server (as a frozen
        database: sockets open, nothing answered); `thaw` undoes it."""
        pid = self.pg.pid()
        assert pid is not None
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        return procs

    @staticmethod
    def thaw(procs: list[psutil.Process]) -> None:
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGCONT)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA and a certificate for 127.0.0.1 it signed (`cert`, `key`); and
    one for another name (`other`, `other-key`), as a server in the middle
    holding a valid certificate of its own would show."""
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    other = ca.issue_cert("elsewhere.example")
    paths = {name: d / f"{name}.pem" for name in ("ca", "cert", "key", "other", "other-key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    other.cert_chain_pems[0].write_to_path(str(paths["other"]))
    other.private_key_pem.write_to_path(str(paths["other-key"]))
    return paths


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[Site]:
    d = tmp_path_factory.mktemp("mwmq")
    config = d / "mwmq.toml"
    tables = {name: user_table(name, *spec) for name, spec in USERS.items()}
    tables["app"] += 'database_roles = ["app_sql"]\n'
    config.write_text("".join(tables.values()))
    config.chmod(0o600)
    with Postgres(d / "pg") as pg, ProcessGroup(d / "logs") as group:
        s = Site(pg, group, config, pki, d)
        s.main = s.start()
        yield s


@pytest.fixture(scope="session")
def mq(site: Site) -> Mwmq:
    """The shared mwmq process."""
    assert site.main is not None
    return site.main


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    """A queue name of this test's own (not created)."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    return f"t.{name}"[:120]


@pytest.fixture
def client(mq: Mwmq) -> Iterator[mwmq.Client]:
    """A client logged in as `app`."""
    with mwmq.Client(mq.url("app"), retries=3) as c:
        yield c


# -- a failed test shows the logs of the processes it (and its session) started


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        started: list[Started] = started_since(0)
        for s in started[-8:]:
            for log in s.logs():
                try:
                    tail = log.read_text(errors="replace").splitlines()[-30:]
                except OSError:
                    continue
                report.sections.append((f"log tail: {s.name} ({log})", "\n".join(tail)))

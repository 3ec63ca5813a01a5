"""mwproxy with TLS as real clients see it: pymemcache with a `tls_context`,
python's `ssl` and `openssl s_client` talk to its TLS listener; mwproxy talks
TLS to memcached servers started with `-Z`; with `--tls-ca` a client without
a certificate is refused; with `--auth-file` a client logs in as memcached's
`-Y` wants, over TLS."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
import trustme
from pymemcache.client.base import Client as PymemcacheClient
from test_client_libraries import pymemcache_scenario

from mwlab.procs import ProcessGroup, free_port, memcached_cmd


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA, a certificate for 127.0.0.1 it signed, and a client certificate it signed."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@mwlab")
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "client")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    client.private_key_and_cert_chain_pem.write_to_path(str(paths["client"]))
    return paths


def tls_servers(group: ProcessGroup, pki: dict[str, Path], n: int) -> list[int]:
    """`n` memcached servers that speak only TLS (`-Z`)."""
    ports = []
    for i in range(n):
        port = free_port()
        ssl_opts = f"ssl_chain_cert={pki['cert']},ssl_key={pki['key']}"
        group.start(f"mc{i}", [*memcached_cmd("127.0.0.1", port), "-Z", "-o", ssl_opts], port)
        ports.append(port)
    return ports


def context(pki: dict[str, Path], client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if client_cert:
        ctx.load_cert_chain(str(pki["client"]))
    return ctx


def call(sock: ssl.SSLSocket, request: bytes, end: bytes = b"\r\n") -> bytes:
    sock.sendall(request)
    out = b""
    while not out.endswith(end):
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def test_tls_on_both_sides_with_pymemcache_python_ssl_and_openssl(tmp_path, pki, start_proxy):
    with ProcessGroup(tmp_path / "servers") as group:
        ports = tls_servers(group, pki, 3)
        proxy = start_proxy(
            [
                "-m",
                *[f"127.0.0.1:{p}" for p in ports],
                "-r",
                "2",
                "--tls-cert",
                str(pki["cert"]),
                "--tls-key",
                str(pki["key"]),
                "--server-tls",
                "--server-tls-ca",
                str(pki["ca"]),
            ]
        )
        c = PymemcacheClient(("127.0.0.1", proxy.port), timeout=5, tls_context=context(pki))
        try:
            pymemcache_scenario(c)
        finally:
            c.close()
        with context(pki).wrap_socket(
            socket.create_connection(("127.0.0.1", proxy.port)), server_hostname="127.0.0.1"
        ) as s:
            assert s.version() in ("TLSv1.2", "TLSv1.3")
            assert call(s, b"set ssl:k 0 0 5\r\nhello\r\n") == b"STORED\r\n"
            assert call(s, b"get ssl:k\r\n", b"END\r\n") == b"VALUE ssl:k 0 5\r\nhello\r\nEND\r\n"
        openssl = shutil.which("openssl")
        assert openssl, "openssl is installed with the system"
        out = subprocess.run(
            [openssl, "s_client", "-connect", f"127.0.0.1:{proxy.port}", "-CAfile", str(pki["ca"]), "-quiet"],
            input=b"get ssl:k\r\nquit\r\n",
            capture_output=True,
            timeout=20,
        )
        assert b"VALUE ssl:k 0 5\r\nhello\r\nEND\r\n" in out.stdout, out
        # Plaintext to the TLS port gets no answer, and is counted.
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as plain:
            plain.sendall(b"get ssl:k\r\n")
            assert b"VALUE" not in plain.recv(4096)
        with context(pki).wrap_socket(
            socket.create_connection(("127.0.0.1", proxy.port)), server_hostname="127.0.0.1"
        ) as s:
            stats = call(s, b"stats\r\n", b"END\r\n").decode()
        failures = int(
            next(line.split()[2] for line in stats.splitlines() if "tls_handshake_failures" in line)
        )
        assert failures >= 1, stats


def test_client_certificates_and_a_login_over_tls(tmp_path, pki, start_proxy):
    users = tmp_path / "users"
    users.write_text("app:correct-horse\n")
    users.chmod(0o600)
    with ProcessGroup(tmp_path / "servers") as group:
        port = group.memcached("mc0").port
        proxy = start_proxy(
            [
                "-m",
                f"127.0.0.1:{port}",
                "--tls-cert",
                str(pki["cert"]),
                "--tls-key",
                str(pki["key"]),
                "--tls-ca",
                str(pki["ca"]),
                "--auth-file",
                str(users),
            ]
        )
        # No client certificate: the handshake is refused.
        with (
            pytest.raises((ssl.SSLError, ConnectionError)),
            context(pki).wrap_socket(
                socket.create_connection(("127.0.0.1", proxy.port), timeout=5), server_hostname="127.0.0.1"
            ) as s,
        ):
            call(s, b"version\r\n")
        raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        with context(pki, client_cert=True).wrap_socket(raw, server_hostname="127.0.0.1") as s:
            assert call(s, b"get k\r\n") == b"CLIENT_ERROR unauthenticated\r\n"
        raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        with context(pki, client_cert=True).wrap_socket(raw, server_hostname="127.0.0.1") as s:
            assert call(s, b"set auth 0 0 17\r\napp correct-horse\r\n") == b"STORED\r\n"
            assert call(s, b"set k 0 0 1\r\nv\r\n") == b"STORED\r\n"
            assert call(s, b"get k\r\n", b"END\r\n") == b"VALUE k 0 1\r\nv\r\nEND\r\n"


def test_redis_py_speaks_tls_to_mwmq_and_logs_in(tmp_path, pki):
    """mwmq with TLS and a user: redis-py with `ssl=True`, `username=` and
    `password=` (RESP2 and RESP3), as an application would connect."""
    import redis

    from mwlab.procs import Postgres, binary, wait_port

    table = subprocess.run(
        [
            str(binary("mwmq")),
            "user",
            "add",
            "app",
            "--password-stdin",
            "--send",
            "jobs*",
            "--receive",
            "jobs*",
            "--admin",
            "jobs*",
        ],
        input=b"app-secret\n",
        capture_output=True,
        check=True,
    ).stdout.decode()
    config = tmp_path / "mwmq.toml"
    config.write_text(table)
    config.chmod(0o600)
    with Postgres(tmp_path / "pg") as pg, ProcessGroup(tmp_path / "mq") as group:
        port = free_port()
        cmd = [
            str(binary("mwmq")),
            "-c",
            str(config),
            "--listen",
            f"127.0.0.1:{port}",
            "--db",
            pg.conninfo,
            "--tls-cert",
            str(pki["cert"]),
            "--tls-key",
            str(pki["key"]),
            "--log",
            "warn",
        ]
        group.start("mwmq", cmd)
        wait_port(port)
        for protocol in (2, 3):
            r = redis.Redis(
                port=port,
                ssl=True,
                ssl_ca_certs=str(pki["ca"]),
                username="app",
                password="app-secret",
                protocol=protocol,
            )
            assert r.ping()
            r.execute_command("QCREATE", f"jobs{protocol}")
            msg_id = r.execute_command("SEND", f"jobs{protocol}", "over tls")
            [[got_id, lease, sender, body]] = r.execute_command("RECV", f"jobs{protocol}")
            assert (got_id, sender, body) == (msg_id, b"app", b"over tls")
            assert r.execute_command("ACK", f"jobs{protocol}", got_id, lease) == 1
            with pytest.raises(redis.exceptions.ResponseError, match="no permissions"):
                r.execute_command("SEND", "payroll", "x")
            r.close()
        wrong = redis.Redis(port=port, ssl=True, ssl_ca_certs=str(pki["ca"]), username="app", password="nope")
        with pytest.raises(redis.exceptions.AuthenticationError):
            wrong.ping()

"""examples/python, run as its README says: an mwmq without users on a
database of its own (`shop`, in the session's PostgreSQL, as `make run-mq`
gives one), the shop's web handler and its three workers (`python -m mwmq
worker`, `celery worker`, `taskiq worker`). Orders placed over HTTP are
shipped by each worker once; an order that always fails is tried three
times by each, and on mwmq's own queue ends in the dead letters."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from mwlab.procs import binary, free_port, wait_port

import mwmq

from conftest import Site

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python"


def call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as r:
        return json.loads(r.read())


def test_the_example_shop_and_its_three_workers(site: Site) -> None:
    with psycopg.connect(site.pg.conninfo, autocommit=True) as admin:
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = 'shop'").fetchone() is None:
            admin.execute("CREATE DATABASE shop")
    database = site.pg.conninfo.replace("dbname=mwmq", "dbname=shop")
    port, web = free_port(), free_port()
    cmd = [str(binary("mwmq")), "--listen", f"127.0.0.1:{port}", "--db", database]
    mq = site.group.start("shop-mwmq", cmd)
    wait_port(port, timeout=30, proc=mq.popen)
    env = {
        "DATABASE": database,
        "MWMQ_URL": f"redis://127.0.0.1:{port}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(EXAMPLE), os.environ.get("PYTHONPATH")) if p),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        py = sys.executable
        shop = site.group.start("shop", [py, str(EXAMPLE / "shop.py"), "--port", str(web)])
        wait_port(web, timeout=60, proc=shop.popen)
        commands = {
            "shop-worker": ["mwmq", "worker", "worker_mwmq:handle", "-q", "shop.orders"],
            "shop-celery": ["celery", "-A", "worker_celery", "worker", "-P", "threads"],
            "shop-taskiq": ["taskiq", "worker", "worker_taskiq:broker", "--workers", "1"],
        }
        workers = [site.group.start(name, [py, "-m", *cmd]) for name, cmd in commands.items()]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    placed = {
        (item, via): call(f"http://127.0.0.1:{web}/orders", {"item": item, "via": via})["id"]
        for via in ("mwmq", "celery", "taskiq")
        for item in ("book", "explode")
    }

    def settled() -> bool:
        now = {k: call(f"http://127.0.0.1:{web}/orders/{i}") for k, i in placed.items()}
        return all(
            (o["status"], o["attempts"]) == (("shipped", 1) if item == "book" else ("new", 3))
            for (item, _), o in now.items()
        )

    deadline = time.monotonic() + 60
    while not settled():
        assert time.monotonic() < deadline, "the orders were not shipped (and tried) as expected within 60 s"
        time.sleep(0.1)
    with mwmq.Client(f"redis://127.0.0.1:{port}") as mq_client:
        deadline = time.monotonic() + 30
        while mq_client.length("shop.orders.dead") != 1:
            assert time.monotonic() < deadline, "the failing order is not in the dead letters"
            time.sleep(0.1)
        [dead] = mq_client.dead_letters("shop.orders")
        assert json.loads(dead.body) == {"order": placed[("explode", "mwmq")]} and dead.deliveries == 3
    for p in [*workers, shop, mq]:  # all done: no need to wait for their graceful stops
        os.killpg(p.popen.pid, signal.SIGKILL)
        p.popen.wait()


def test_the_shop_refuses_what_it_should_not_read() -> None:
    """The web handler as an attacker meets it, before any database: a
    Content-Length it should not read (too large, negative, missing) is
    refused at once, unread (it read until the client hung up: a thread held
    for ever, or memory for a length of a terabyte); an item too long is
    refused; an order id past PostgreSQL's bigint is simply not found."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        import shop
    finally:
        sys.path.remove(str(EXAMPLE))
    server = ThreadingHTTPServer(("127.0.0.1", 0), shop.Shop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def status(head: str, body: bytes = b"") -> int:
        """The status of a request whose client stays connected."""
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(head.encode() + b"\r\n\r\n" + body)
            return int(s.makefile("rb").readline().split()[1])

    try:
        assert status(f"POST /orders HTTP/1.1\r\nContent-Length: {10**12}", b'{"item": ') == 413
        assert status("POST /orders HTTP/1.1\r\nContent-Length: -1", b'{"item": "book"}') == 400
        assert status("POST /orders HTTP/1.1", b'{"item": "book"}') == 411
        long = json.dumps({"item": "x" * 201}).encode()
        assert status(f"POST /orders HTTP/1.1\r\nContent-Length: {len(long)}", long) == 400
        deep = b"[" * 10_000
        assert status(f"POST /orders HTTP/1.1\r\nContent-Length: {len(deep)}", deep) == 400
        assert status(f"GET /orders/{10**30} HTTP/1.1") == 404
        assert status("GET /orders/\u0663 HTTP/1.1") == 404  # a digit, but not 0-9
    finally:
        server.shutdown()
        server.server_close()

"""Celery on mwmq's queues (mwmq.kombu): real `celery worker` processes run
the tasks of celery_app.py with `acks_late`, retries, countdowns, a group
and a chord whose results go to Celery's database backend on the test's
PostgreSQL; a worker SIGKILLed mid-task has its task run again by another
after the lease; a task longer than the lease runs once. The shared mwmq
and PostgreSQL of conftest.py; the queues are named `celery-test.*`."""

from __future__ import annotations

import base64
import contextlib
import importlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import psycopg
import pytest
from mwlab.procs import Proc
from test_sql import app_sql  # noqa: F401  (the fixture)

import mwmq
import mwmq.kombu

from conftest import Mwmq, Site, child_env

TESTS = Path(__file__).resolve().parent
PREFIX = "celery-test."
T = TypeVar("T")


def until(what: Callable[[], T], deadline: float = 30.0, why: str = "") -> T:
    """`what()` once it is truthy, polled until the deadline (then a failure saying why)."""
    end = time.monotonic() + deadline
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > end:
            pytest.fail(f"not within {deadline} s: {why}")
        time.sleep(0.05)


def backend_url(conninfo: str) -> str:
    """Celery's database backend URL for a libpq conninfo (a unix socket)."""
    kv = dict(part.split("=", 1) for part in conninfo.split())
    return f"db+postgresql+psycopg://{kv['user']}@/{kv['dbname']}?host={kv['host']}&port={kv['port']}"


def runs(app: ModuleType, name: str) -> list[tuple[str, int, float]]:
    """What celery_app recorded for `name`: (event, pid, time) per line."""
    path = app.RUNS / name
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(event, int(pid), float(at)) for event, pid, at in rows]


@pytest.fixture(scope="module")
def celery_env(site: Site, mq: Mwmq, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment celery_app.py reads, set in this process (the
    producer) and so in the workers it starts."""
    env = {
        "MWMQ_TEST_BROKER": f"mwmq://app:{'app-secret'}@127.0.0.1:{mq.port}//",
        "MWMQ_TEST_BACKEND": backend_url(site.pg.conninfo),
        "MWMQ_TEST_RUNS": str(tmp_path_factory.mktemp("celery-runs")),
        "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def app(celery_env: dict[str, str]) -> ModuleType:
    """celery_app, imported once its environment is set."""
    return importlib.import_module("celery_app")


def start_worker(site: Site, name: str, queue: str, pool: str = "threads") -> Proc:
    """`celery -A celery_app worker` on `queue`, once it says it is ready."""
    cmd = [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-Q", queue, "-n", f"{name}@%h"]
    cmd += ["-P", pool, "-c", "2", "--loglevel=INFO", "--without-mingle", "--without-gossip"]
    p = site.group.start(f"celery-{name}", cmd)
    assert p.log is not None
    log = p.log
    until(
        lambda: p.popen.poll() is not None or "ready." in log.read_text(errors="replace"),
        60,
        f"worker {name} ready ({log})",
    )
    assert p.popen.poll() is None, f"worker {name} exited: {log.read_text(errors='replace')[-3000:]}"
    return p


@pytest.fixture(scope="module")
def worker(site: Site, app: ModuleType) -> Iterator[Proc]:
    """A worker of the queue `work` (two threads) for the module."""
    p = start_worker(site, "main", "work")
    yield p
    os.killpg(p.popen.pid, signal.SIGKILL)
    p.popen.wait()


def test_the_mwmq_url_works_without_importing_mwmq(mq: Mwmq) -> None:
    """A fresh interpreter knows mwmq:// as soon as kombu's transports load,
    with nothing imported by hand (the installed startup hook), and the
    hook pulls in neither kombu nor mwmq before they are needed."""
    code = (
        "import sys\n"
        "assert 'kombu' not in sys.modules and 'mwmq' not in sys.modules\n"
        "from kombu import Connection\n"
        "assert 'mwmq' not in sys.modules\n"
        f"with Connection('mwmq://app:app-secret@127.0.0.1:{mq.port}//') as c:\n"
        "    c.connect()\n"
        "    print(type(c.transport).__module__, c.transport.mwmq.ping())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mwmq.kombu", "True"]


def test_a_queues_dead_letter_queue_is_created_with_it(mq: Mwmq, client: mwmq.Client, queue: str) -> None:
    """`x-mwmq-dead-letter` names a queue QCREATE wants to exist: declaring
    the queue creates that one first, so the documented arguments work on a
    fresh mwmq (they used to stop the worker at start with NOQUEUE)."""
    from kombu import Connection, Queue

    args = {"x-mwmq-max-deliveries": 2, "x-mwmq-dead-letter": f"{queue}.dead"}
    with Connection(f"mwmq://app:app-secret@127.0.0.1:{mq.port}//") as conn:
        Queue(queue, queue_arguments=args)(conn.default_channel).declare()
    info = client.info(queue)
    assert (info.max_deliveries, info.dead_letter) == (2, f"{queue}.dead")
    assert client.length(f"{queue}.dead") == 0


def test_inspect_says_that_mwmq_has_no_fanout(app: ModuleType, celery_env: dict[str, str]) -> None:
    """`celery inspect` (remote control) needs a fanout exchange: instead of
    only Celery's "No nodes replied", the transport says why."""
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "celery_app", "inspect", "ping", "--timeout", "0.2"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert out.returncode != 0
    assert "mwmq has no fanout exchanges: what is sent to 'celery.pidbox' reaches no one" in out.stderr


def test_tasks_run_acks_late_and_are_acknowledged(app: ModuleType, worker: Proc, client: mwmq.Client) -> None:
    results = [app.add.delay(i, 10) for i in range(6)]
    assert [r.get(timeout=30) for r in results] == [i + 10 for i in range(6)]
    # Each ran once, and each ACK came after its run: the queue holds nothing.
    assert all(len(runs(app, f"add-{i}-10")) == 1 for i in range(6))
    until(lambda: client.length(PREFIX + "work") == 0, why="the tasks acknowledged")


def test_a_task_longer_than_the_lease_holds_it_and_runs_once(
    app: ModuleType, worker: Proc, client: mwmq.Client
) -> None:
    """4 s of work against a 2 s lease: the worker renews the lease (without
    that, the worker's free thread would take the message again after 2 s),
    and with acks_late the message stays in mwmq until the task is done."""
    result = app.slow.delay("long", 4)
    until(lambda: runs(app, "long"), why="the task started")
    assert client.length(PREFIX + "work") == 1  # held (leased), not acknowledged yet
    assert result.get(timeout=60) == "long"
    assert [e for e, _, _ in runs(app, "long")] == ["start", "end"]
    until(lambda: client.length(PREFIX + "work") == 0, why="the task acknowledged")


def test_a_retry_runs_again_after_its_countdown(app: ModuleType, worker: Proc) -> None:
    assert app.flaky.delay("retried", 2).get(timeout=30) == 2
    times = [at for _, _, at in runs(app, "retried")]
    assert len(times) == 3
    # Each retry waited out its countdown (never earlier; later is the machine's business).
    assert all(b - a >= 0.3 for a, b in itertools.pairwise(times))


def test_a_countdown_is_a_delay_in_mwmq(app: ModuleType, worker: Proc, client: mwmq.Client) -> None:
    """A task for later is held by mwmq (delayed, not leased by a worker
    waiting for its ETA); one due in 1 s runs no earlier."""
    app.stamp.apply_async(("far",), countdown=3600, queue="later")
    info = until(
        lambda: (i := client.info(PREFIX + "later")).delayed == 1 and i, why="QINFO shows it delayed"
    )
    assert info.ready == 0 and info.leased == 0
    sent = time.time()
    ran = app.stamp.apply_async(("soon",), countdown=1).get(timeout=30)
    assert ran - sent >= 1


def test_priorities_are_mwmq_priorities(app: ModuleType, client: mwmq.Client) -> None:
    """Tasks waiting in a queue are handed out highest priority first."""
    for name, priority in (("p1", 1), ("p9", 9), ("none", None), ("p5", 5)):
        app.stamp.apply_async((name,), queue="ranked", priority=priority)
    msgs = client.recv(PREFIX + "ranked", count=4)
    args = [json.loads(base64.b64decode(json.loads(m.body)["body"]))[0][0] for m in msgs]
    assert args == ["p9", "p5", "p1", "none"]
    client.ack_many(msgs)


def test_tasks_sent_in_the_applications_transaction(
    app: ModuleType,
    client: mwmq.Client,
    app_sql: str,  # noqa: F811
) -> None:
    """Inside mwmq.kombu.sql_transaction, `apply_async()` is mwmq.send() in
    the application's transaction: nothing before its COMMIT, nothing at all
    after a ROLLBACK. (On a queue no worker takes, to look at what is there.)"""
    with psycopg.connect(app_sql) as conn:
        with conn.transaction(force_rollback=True), conn.cursor() as cur, mwmq.kombu.sql_transaction(cur):
            app.stamp.apply_async(("rolled-back",), queue="txn")
        with conn.transaction(), conn.cursor() as cur, mwmq.kombu.sql_transaction(cur):
            app.stamp.apply_async(("committed",), queue="txn", priority=3)
            assert client.length(PREFIX + "txn") == 0
    app.stamp.apply_async(("after",), queue="txn")  # over RESP again, outside the block
    msgs = client.recv(PREFIX + "txn", count=10)
    args = [json.loads(base64.b64decode(json.loads(m.body)["body"]))[0][0] for m in msgs]
    assert args == ["committed", "after"]  # the committed one first: its priority went along
    client.ack_many(msgs)


def test_a_group_and_a_chord_with_the_database_backend(app: ModuleType, worker: Proc) -> None:
    from celery import chord, group

    assert group(app.add.s(i, i) for i in range(4))().get(timeout=30) == [0, 2, 4, 6]
    # The database backend joins a chord with chord_unlock, a task retried every second (countdowns).
    assert chord(app.add.s(i, 1) for i in range(3))(app.total.s()).get(timeout=60) == 6


def test_a_killed_workers_task_comes_back_after_the_lease(site: Site, app: ModuleType) -> None:
    """Worker A is SIGKILLed while it runs a task (acks_late): its lease is
    no longer renewed, and worker B runs the task once the lease is over."""
    a = start_worker(site, "doomed", "doomed", pool="solo")
    result = app.slow.apply_async(("killed", 30), {"once": True}, queue="doomed")
    until(lambda: runs(app, "killed"), why="worker A started the task")
    os.killpg(a.popen.pid, signal.SIGKILL)
    a.popen.wait()
    b = start_worker(site, "heir", "doomed", pool="solo")
    assert result.get(timeout=60) == "killed"
    seen = runs(app, "killed")
    assert [(e, pid) for e, pid, _ in seen] == [
        ("start", a.popen.pid),
        ("start", b.popen.pid),
        ("end", b.popen.pid),
    ]
    os.killpg(b.popen.pid, signal.SIGKILL)
    b.popen.wait()


# Bodies a program other than kombu may SEND to a Celery queue (redis-cli,
# a bug, an attacker with the send right), each of which kombu cannot read.
NOT_KOMBU = [
    b"\xff\xfe not UTF-8",
    b"not JSON",
    b"[1, 2]",
    b"[" * 100_000,
    b'{"properties": []}',
    b'{"properties": {"delivery_info": 5}}',
    b'{"properties": {}, "headers": [1]}',
    b'{"properties": {}, "body": 5}',
    b'{"properties": {"body_encoding": "base64"}, "body": "abcde"}',
    b'{"properties": {"body_encoding": "rot13"}, "body": "x"}',
]


def test_a_message_that_is_not_kombus_is_dead_lettered_not_looping(mq: Mwmq, client: mwmq.Client, queue: str):
    """Each body above, sent ahead of a task, is kept from kombu: on a queue
    with MAXDELIVERIES it ends in the dead letters, and the task behind it is
    delivered. (A `{"properties": []}` used to raise out of every drain, so
    that neither it nor anything after it was ever delivered.) On a queue
    without MAXDELIVERIES such a message is dropped."""
    from kombu import Connection, Consumer, Queue

    dlq, plain = f"{queue}.dead", f"{queue}.plain"
    client.create_queue(dlq)
    client.create_queue(queue, max_deliveries=2, dead_letter=dlq)
    client.create_queue(plain)
    for name in (queue, plain):
        client.send_many(name, NOT_KOMBU)
    got: list[object] = []
    url = f"mwmq://app:app-secret@127.0.0.1:{mq.port}//"
    with Connection(url, transport_options={"visibility_timeout": 30}) as conn:
        queues = [Queue(name, routing_key=name) for name in (queue, plain)]
        with Consumer(conn, queues, callbacks=[lambda body, m: (got.append(body), m.ack())], accept=["json"]):
            with conn.Producer() as producer:
                for q in queues:
                    producer.publish({"task": q.name}, routing_key=q.name, declare=[q])
            end = time.monotonic() + 30
            while len(got) < 2 or client.length(dlq) < len(NOT_KOMBU):
                assert time.monotonic() < end, f"got {got}, {client.length(dlq)} dead letters"
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.2)
    assert sorted(got, key=str) == [{"task": queue}, {"task": plain}]
    assert sorted(d.body for d in client.dead_letters(queue, count=100)) == sorted(NOT_KOMBU)
    assert client.length(queue) == 0 and client.length(plain) == 0


def test_mwmqs_checks_the_servers_certificate(mq: Mwmq, pki) -> None:
    """`mwmqs://` verifies the server: refused with the system's CAs (the
    test's CA is not among them), accepted with Celery's `broker_use_ssl`
    naming the CA."""
    from kombu import Connection

    url = f"mwmqs://app:app-secret@127.0.0.1:{mq.tls_port}//"
    with Connection(url) as conn, pytest.raises(mwmq.ConnectionLost, match="certificate verify failed"):
        conn.transport.mwmq.ping()
    with Connection(url, ssl={"ssl_ca_certs": str(pki["ca"])}) as conn:
        assert conn.transport.mwmq.ping()


def test_a_consumer_without_the_receive_right_is_refused_loudly(
    mq: Mwmq, client: mwmq.Client, queue: str
) -> None:
    """A user who may send but not receive: the consumer's drain raises
    NoPerm (a channel error: `celery worker` logs `Unrecoverable error:
    NoPerm(...)` and exits 1), rather than finding the queue empty."""
    from kombu import Connection, Consumer, Queue

    client.create_queue(queue)
    client.send(queue, "kept")
    with Connection(f"mwmq://sender:sender-secret@127.0.0.1:{mq.port}//") as conn:
        q = Queue(queue, routing_key=queue)
        with (
            Consumer(conn, [q], callbacks=[lambda body, m: None]),
            pytest.raises(mwmq.NoPerm, match="receive"),
        ):
            conn.drain_events(timeout=5)
        assert isinstance(mwmq.NoPerm("x"), conn.channel_errors)
    assert client.length(queue) == 1

"""The worker against a real mwmq: a handler that raises (retried after the
queue's backoff, then dead-lettered by MAXDELIVERIES), a handler slower
than its lease (extended by TOUCH, never handed to anyone else), SIGTERM
in the middle of a batch of a worker process (nothing lost, nothing done
twice), mwmq SIGKILLed and restarted under a worker, and the asyncio
worker. Every wait polls for a condition (30 s at most); nothing is timed."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import mwmq
from mwmq.aio import AsyncClient

from conftest import Mwmq, Site

DEADLINE = 30.0


def until(cond: Callable[[], object], what: str, seconds: float = DEADLINE) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.02)


def start(worker: mwmq.Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, name="worker")
    t.start()
    return t


def test_a_failing_handler_is_retried_after_the_backoff_then_dead_lettered(client: mwmq.Client, queue: str):
    dlq = f"{queue}.dead"
    client.create_queue(dlq)
    client.create_queue(queue, max_deliveries=3, dead_letter=dlq, backoff=(50, 200))
    calls: collections.Counter[bytes] = collections.Counter()

    def handler(m: mwmq.Message) -> None:
        calls[m.body] += 1
        if m.body == b"poison" or calls[m.body] < 2:
            raise ValueError(f"cannot handle {m.body!r}")

    poison = client.send(queue, "poison")
    client.send(queue, "flaky")
    w = mwmq.Worker(client, queue, handler, concurrency=2, vt_ms=5000, wait_ms=100)
    t = start(w)
    until(lambda: client.dead_letters(queue), "the poison message dead-lettered")
    until(lambda: w.stats.acked == 1, "the flaky message done on its second try")
    w.stop()
    t.join(DEADLINE)
    assert calls == {b"poison": 3, b"flaky": 2}
    [dead] = client.dead_letters(queue)
    assert (dead.id, dead.deliveries, dead.reason, dead.queue) == (poison, 3, "max_deliveries", dlq)
    assert (w.stats.failed, w.stats.acked, w.stats.lease_lost) == (4, 1, 0)
    assert client.length(queue) == 0


def test_a_handler_slower_than_its_lease_keeps_it_and_runs_once(client: mwmq.Client, mq: Mwmq, queue: str):
    """Leases of 1 s, handlers of 2.5 s: without TOUCH a second receiver
    would get both messages after a second."""
    client.create_queue(queue)
    ids = client.send_many(queue, ["slow 1", "slow 2"])
    runs: list[str] = []
    started = threading.Semaphore(0)

    def handler(m: mwmq.Message) -> None:
        runs.append(m.id)
        started.release()
        time.sleep(2.5)

    w = mwmq.Worker(client, queue, handler, concurrency=2, vt_ms=1000, wait_ms=100)
    t = start(w)
    for _ in ids:
        assert started.acquire(timeout=DEADLINE)
    with mwmq.Client(mq.url("app")) as rival:
        stolen = []
        while w.stats.acked < 2:
            stolen += rival.recv(queue, count=2)
            time.sleep(0.05)
    w.stop()
    t.join(DEADLINE)
    assert stolen == []
    assert sorted(runs) == sorted(ids)
    assert (w.stats.acked, w.stats.lease_lost, w.stats.failed) == (2, 0, 0)
    assert client.length(queue) == 0


HANDLERS = """
import os, time

def slow(msg):
    time.sleep(0.4)
    fd = os.open(os.environ["DONE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, msg.body + b"\\n")
    os.close(fd)
"""


def worker_process(tmp_path: Path, mq: Mwmq, queue: str, *args: str) -> subprocess.Popen[bytes]:
    (tmp_path / "handlers.py").write_text(textwrap.dedent(HANDLERS))
    env = {**os.environ, "DONE_FILE": str(tmp_path / "done"), "MWMQ_URL": mq.url("app")}
    cmd = [sys.executable, "-m", "mwmq", "worker", "handlers:slow", "--queue", queue, *args]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE)


def done(tmp_path: Path) -> list[str]:
    f = tmp_path / "done"
    return f.read_text().split() if f.exists() else []


def test_sigterm_mid_batch_loses_nothing_and_does_nothing_twice(
    client: mwmq.Client, mq: Mwmq, queue: str, tmp_path: Path
):
    client.create_queue(queue)
    bodies = [f"job-{i}" for i in range(12)]
    client.send_many(queue, bodies)
    p = worker_process(tmp_path, mq, queue, "--concurrency", "4", "--wait-ms", "200", "--progress")
    until(lambda: len(done(tmp_path)) >= 4, "the first jobs done")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=DEADLINE)
    assert p.returncode == 0, err.decode()
    log = err.decode()
    assert "stopping (signal=SIGTERM)" in log and "stopped" in log
    assert "done," in log  # the progress line
    first = done(tmp_path)
    assert len(first) < len(bodies) and len(first) == len(set(first))
    # What the stopped worker held was finished and acknowledged, or given
    # back: a second worker does the rest, and nothing twice.
    p = worker_process(tmp_path, mq, queue, "--concurrency", "4", "--wait-ms", "200")
    until(lambda: len(done(tmp_path)) >= len(bodies), "every job done")
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=DEADLINE)
    assert sorted(done(tmp_path)) == sorted(bodies)
    assert client.length(queue) == 0


def test_the_command_line_refuses_clearly(mq: Mwmq, queue: str, tmp_path: Path):
    env = {**os.environ, "MWMQ_URL": f"redis://app:wrong@127.0.0.1:{mq.port}"}
    (tmp_path / "h.py").write_text("def f(m):\n    pass\n")
    r = subprocess.run(
        [sys.executable, "-m", "mwmq", "worker", "h:f", "-q", queue],
        cwd=tmp_path,
        env=env,
        capture_output=True,
    )
    assert r.returncode == 1 and b"mwmq worker: WRONGPASS" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "mwmq", "worker", "h:nope", "-q", queue], cwd=tmp_path, capture_output=True
    )
    assert r.returncode == 1 and b"mwmq worker: h has no nope" in r.stderr


def test_the_worker_recovers_when_mwmq_is_sigkilled_and_restarted(
    site: Site, client: mwmq.Client, queue: str
):
    own = site.start()
    client.create_queue(queue)
    handled: collections.Counter[bytes] = collections.Counter()
    with mwmq.Client(own.url("app"), retries=4, retry_backoff=(0.05, 0.5)) as c:
        w = mwmq.Worker(c, queue, lambda m: handled.update([m.body]), concurrency=2, vt_ms=2000, wait_ms=300)
        t = start(w)
        client.send_many(queue, [f"before-{i}" for i in range(5)])
        until(lambda: len(handled) == 5, "the first five handled")
        own = site.restart(own)
        client.send_many(queue, [f"after-{i}" for i in range(5)])
        until(lambda: len(handled) == 10, "the five sent after the restart handled")
        w.stop()
        t.join(DEADLINE)
    own.kill()
    assert set(handled) == {f"{s}-{i}".encode() for s in ("before", "after") for i in range(5)}
    until(lambda: client.length(queue) == 0, "everything acknowledged")


def test_the_async_worker(mq: Mwmq, queue: str):
    """Async and plain handlers; a failure NACKed and retried; a stop ends
    a waiting RECV at once and gives back what runs past the deadline."""

    async def main() -> None:
        async with AsyncClient(mq.url("app")) as c:
            await c.create_queue(queue)
            calls: collections.Counter[bytes] = collections.Counter()

            async def handler(m: mwmq.Message) -> None:
                calls[m.body] += 1
                if calls[m.body] == 1:
                    raise RuntimeError("first time")
                await asyncio.sleep(0.05)

            await c.send_many(queue, ["a", "b", "c"])
            w = mwmq.AsyncWorker(c, queue, handler, concurrency=3, vt_ms=1000, wait_ms=30_000)
            run = asyncio.create_task(w.run())
            while w.stats.acked < 3:
                await asyncio.sleep(0.02)
            w.stop()  # its RECV waits for 30 s: the stop does not
            await asyncio.wait_for(run, DEADLINE)
            assert calls == {b"a": 2, b"b": 2, b"c": 2} and w.stats.failed == 3

            # A plain handler slower than the stop's deadline: given back.
            gate = threading.Event()
            await c.send(queue, "stuck")
            w = mwmq.AsyncWorker(c, queue, lambda m: gate.wait(DEADLINE), vt_ms=1000, stop_timeout=0.2)
            run = asyncio.create_task(w.run())
            while w.stats.running < 1:
                await asyncio.sleep(0.02)
            w.stop()
            await asyncio.wait_for(run, DEADLINE)
            gate.set()
            assert w.stats.given_back == 1 and w.stats.acked == 0
            [back] = await c.recv(queue)
            assert back.body == b"stuck" and await c.ack(back)

    asyncio.run(main())

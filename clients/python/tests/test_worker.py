"""The worker against a real mwmq: a handler that raises (retried after the
queue's backoff, then dead-lettered by MAXDELIVERIES), a handler slower
than its lease (extended by TOUCH, never handed to anyone else), SIGTERM
in the middle of a batch of a worker process (nothing lost, nothing done
twice), mwmq SIGKILLed and restarted under a worker, and the asyncio
worker. Every wait polls for a condition (30 s at most); nothing is timed."""

from __future__ import annotations

import asyncio
import collections
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import mwmq
from mwmq.aio import AsyncClient

from conftest import Mwmq, Site, child_env

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
    """Leases of 2 s TOUCHed every 0.4 s, handlers of 4.5 s: without TOUCH a
    second receiver would get both messages after 2 s."""
    client.create_queue(queue)
    ids = client.send_many(queue, ["slow 1", "slow 2"])
    runs: list[str] = []
    started = threading.Semaphore(0)

    def handler(m: mwmq.Message) -> None:
        runs.append(m.id)
        started.release()
        time.sleep(4.5)

    w = mwmq.Worker(client, queue, handler, concurrency=2, vt_ms=2000, touch_every_ms=400, wait_ms=100)
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

def gated(msg):
    # Started: noted; then held until the test opens the gate; done: noted.
    note(msg, "started")
    while not os.path.exists(os.environ["GATE"]):
        time.sleep(0.01)
    note(msg, "done")

def note(msg, what):
    fd = os.open(os.environ["NOTES"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b"%s %s\\n" % (what.encode(), msg.body))
    os.close(fd)
"""


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes a test starts, killed if the test leaves them running."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def worker_process(
    spawned: list[subprocess.Popen[bytes]], tmp_path: Path, mq: Mwmq, queue: str, log: str, *args: str
) -> subprocess.Popen[bytes]:
    """`python -m mwmq worker handlers:gated ...`, its standard error in tmp_path/log."""
    (tmp_path / "handlers.py").write_text(textwrap.dedent(HANDLERS))
    env = child_env(NOTES=str(tmp_path / "notes"), GATE=str(tmp_path / "gate"), MWMQ_URL=mq.url("app"))
    cmd = [sys.executable, "-m", "mwmq", "worker", "handlers:gated", "--queue", queue, *args]
    with (tmp_path / log).open("wb") as err:
        spawned.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=err))
    return spawned[-1]


def notes(tmp_path: Path, what: str) -> list[str]:
    f = tmp_path / "notes"
    lines = f.read_text().splitlines() if f.exists() else []
    return [line.split()[1] for line in lines if line.split()[0] == what]


def test_sigterm_mid_batch_loses_nothing_and_does_nothing_twice(
    client: mwmq.Client, mq: Mwmq, queue: str, tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
):
    """A worker process with 4 handlers held mid-job gets SIGTERM: it takes
    nothing more, finishes the 4 (once they may go on) and ACKs them, exits
    0; a second worker does the other 8. Every job once."""
    client.create_queue(queue)
    bodies = [f"job-{i}" for i in range(12)]
    client.send_many(queue, bodies)
    p = worker_process(
        spawned, tmp_path, mq, queue, "first.log", "--concurrency", "4", "--wait-ms", "200", "--progress"
    )
    until(lambda: len(notes(tmp_path, "started")) == 4, "four jobs started")
    p.send_signal(signal.SIGTERM)
    log = tmp_path / "first.log"
    until(lambda: "stopping (signal=SIGTERM)" in log.read_text(), "the worker says it is stopping")
    (tmp_path / "gate").touch()
    assert p.wait(DEADLINE) == 0, log.read_text()
    assert "stopped (done=4, failed=0)" in log.read_text()
    assert "4 done, 0 failed" in log.read_text()  # the progress line
    first = notes(tmp_path, "done")
    assert len(first) == 4 and sorted(first) == sorted(notes(tmp_path, "started"))
    assert client.length(queue) == 8
    p = worker_process(spawned, tmp_path, mq, queue, "second.log", "--concurrency", "4", "--wait-ms", "200")
    until(lambda: len(notes(tmp_path, "done")) == len(bodies), "every job done")
    p.send_signal(signal.SIGINT)
    assert p.wait(DEADLINE) == 0, (tmp_path / "second.log").read_text()
    assert sorted(notes(tmp_path, "done")) == sorted(bodies)
    assert sorted(notes(tmp_path, "started")) == sorted(bodies)
    assert client.length(queue) == 0


def test_the_command_line_refuses_clearly(mq: Mwmq, queue: str, tmp_path: Path):
    env = child_env(MWMQ_URL=f"redis://app:wrong@127.0.0.1:{mq.port}")
    (tmp_path / "h.py").write_text("def f(m):\n    pass\n")
    r = subprocess.run(
        [sys.executable, "-m", "mwmq", "worker", "h:f", "-q", queue],
        cwd=tmp_path,
        env=env,
        capture_output=True,
    )
    assert r.returncode == 1 and b"mwmq worker: WRONGPASS" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "mwmq", "worker", "h:nope", "-q", queue],
        cwd=tmp_path,
        env=env,
        capture_output=True,
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
        # An ACK whose retries ran out while mwmq restarted (settle_failed)
        # leaves its message to come back after its lease: this worker
        # handles it again, so it must still run until the queue is empty.
        until(lambda: client.length(queue) == 0, "everything acknowledged")
        w.stop()
        t.join(DEADLINE)
    own.kill()
    assert set(handled) == {f"{s}-{i}".encode() for s in ("before", "after") for i in range(5)}


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


def test_a_worker_waits_for_its_queue_and_stops_on_a_refusal(client: mwmq.Client, mq: Mwmq, queue: str):
    """A queue that does not exist yet is waited for (recv_failed, retried);
    a receiver without the right gets NoPerm out of run(), not a silent
    empty queue."""
    seen: list[str] = []

    class Events(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(getattr(record, "mwmq_event", ""))

    handler = Events()
    logging.getLogger("mwmq.worker").addHandler(handler)
    try:
        handled: list[bytes] = []
        w = mwmq.Worker(client, queue, lambda m: handled.append(m.body), wait_ms=100)
        t = start(w)
        until(lambda: "recv_failed" in seen, "the missing queue noticed")
        client.create_queue(queue)
        client.send(queue, "late")
        until(lambda: handled == [b"late"], "the message handled once the queue exists")
        w.stop()
        t.join(DEADLINE)
    finally:
        logging.getLogger("mwmq.worker").removeHandler(handler)
    with mwmq.Client(mq.url("sender")) as sender:
        refused = mwmq.Worker(sender, queue, lambda m: None, wait_ms=100)
        with pytest.raises(mwmq.NoPerm, match="no permissions to receive"):
            refused.run()

    async def refused_async() -> None:
        async with AsyncClient(mq.url("sender")) as sender:
            w = mwmq.AsyncWorker(sender, queue, lambda m: None, wait_ms=100, handle_signals=False)
            await asyncio.wait_for(w.run(), DEADLINE)

    with pytest.raises(mwmq.NoPerm, match="no permissions to receive"):
        asyncio.run(refused_async())


# -- what a careless handler or a broken server does to a worker


def test_a_handler_that_exits_stops_the_worker_and_gives_its_message_back(client: mwmq.Client, queue: str):
    """sys.exit() in a handler: the worker does not lose a thread (with one
    handler thread it would wait for ever, the lease renewed for ever): the
    message goes back, the worker stops and run() raises the SystemExit."""
    client.create_queue(queue)
    client.send(queue, "exit")
    w = mwmq.Worker(client, queue, lambda m: sys.exit(3), vt_ms=60_000, wait_ms=100, handle_signals=False)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            w.run()
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(DEADLINE)
    assert not t.is_alive(), "run() did not return"
    assert len(raised) == 1 and isinstance(raised[0], SystemExit) and raised[0].code == 3
    assert (w.stats.given_back, w.stats.acked, w.stats.running) == (1, 0, 0)
    [m] = client.recv(queue)  # back at once, not after its 60 s lease
    assert m.body == b"exit" and client.ack(m)


def test_a_message_back_while_its_first_delivery_runs_is_a_delivery_of_its_own(
    client: mwmq.Client, queue: str
):
    """A handler NACKs its own message and goes on; the worker's other thread
    receives it again (same id, another lease) and takes longer than the
    lease. Each delivery is renewed and settled on its own: the second is
    kept and ACKed, not lost when the first ends (it was handed out 5 times
    when the worker kept its deliveries by id)."""
    client.create_queue(queue)
    deliveries: list[int | None] = []
    second = threading.Event()

    def handler(m: mwmq.Message) -> None:
        deliveries.append(m.lease)
        if len(deliveries) == 1:
            client.nack(m, delay_ms=0)  # careless: the worker settles what it hands out
            assert second.wait(DEADLINE)
            return
        second.set()
        time.sleep(1.5)  # 2.5 leases

    w = mwmq.Worker(client, queue, handler, concurrency=2, vt_ms=600, touch_every_ms=150, wait_ms=100)
    t = start(w)
    client.send(queue, "x")
    until(lambda: w.stats.acked == 1, "the second delivery acknowledged")
    w.stop()
    t.join(DEADLINE)
    assert len(deliveries) == 2 and len(set(deliveries)) == 2
    assert (w.stats.acked, w.stats.lease_lost, w.stats.running) == (1, 1, 0)  # the first's ACK came too late
    assert client.length(queue) == 0


def test_more_handlers_than_one_recv_may_take(client: mwmq.Client, mq: Mwmq, queue: str):
    """RECV takes at most 1,000 messages: a worker with more handlers asks
    for 1,000 (it was refused, `COUNT must be between 1 and 1000`, and ended)."""
    client.create_queue(queue)
    client.send_many(queue, ["a", "b"])

    async def main() -> None:
        async with AsyncClient(mq.url("app")) as c:
            w = mwmq.AsyncWorker(
                c, queue, lambda m: None, concurrency=1001, wait_ms=100, handle_signals=False
            )
            run = asyncio.create_task(w.run())
            while w.stats.acked < 1 and not run.done():
                await asyncio.sleep(0.02)
            w.stop()
            await asyncio.wait_for(run, DEADLINE)

    asyncio.run(main())
    w = mwmq.Worker(client, queue, lambda m: None, concurrency=1001, wait_ms=100, handle_signals=False)
    t = start(w)
    until(lambda: client.length(queue) == 0 or not t.is_alive(), "the messages handled")
    w.stop()
    t.join(DEADLINE)
    assert client.length(queue) == 0


def test_a_stop_ends_even_when_mwmq_no_longer_answers(
    site: Site, client: mwmq.Client, queue: str, tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
):
    """mwmq SIGSTOPped under a worker process waiting in RECV (its socket
    open, nothing answered): SIGTERM, then a second SIGTERM, end it (it
    used to wait for the reply for ever, signals or not)."""
    own = site.start()
    try:
        client.create_queue(queue)
        (tmp_path / "h.py").write_text("def f(m):\n    pass\n")
        cmd = [sys.executable, "-m", "mwmq", "worker", "h:f", "-q", queue, "--wait-ms", "200"]
        log = tmp_path / "log"
        with log.open("wb") as err:
            spawned.append(
                subprocess.Popen(cmd, cwd=tmp_path, env=child_env(MWMQ_URL=own.url("app")), stderr=err)
            )
        p = spawned[-1]
        until(lambda: "started" in log.read_text(), "the worker started")
        time.sleep(0.3)  # it is in a RECV
        own.proc.send_signal(signal.SIGSTOP)
        p.send_signal(signal.SIGTERM)
        until(lambda: "stopping (signal=SIGTERM)" in log.read_text(), "the first SIGTERM taken")
        p.send_signal(signal.SIGTERM)
        assert p.wait(DEADLINE) == 0, log.read_text()
        assert "stop_abandoned" in log.read_text()
    finally:
        own.proc.send_signal(signal.SIGCONT)
        own.kill()


def test_the_async_workers_stop_ends_when_mwmq_no_longer_answers(site: Site, queue: str):
    """A handler holds a message when mwmq is SIGSTOPped: at the stop's
    deadline its give-back (a NACK nobody answers) is abandoned after
    GRACE, and run() returns (it used to wait for the NACK's reply for ever)."""
    own = site.start()

    async def main() -> None:
        gate = asyncio.Event()

        async def handler(m: mwmq.Message) -> None:
            await gate.wait()

        async with AsyncClient(own.url("app"), retries=0) as c:
            await c.create_queue(queue)
            await c.send(queue, "held")
            w = mwmq.AsyncWorker(c, queue, handler, vt_ms=5000, wait_ms=100, stop_timeout=0.2)
            run = asyncio.create_task(w.run())
            while w.stats.running < 1:
                await asyncio.sleep(0.02)
            own.proc.send_signal(signal.SIGSTOP)
            w.stop()
            await asyncio.wait_for(run, DEADLINE)
            assert w.stats.given_back == 0 and w.stats.acked == 0

    try:
        asyncio.run(main())
    finally:
        own.proc.send_signal(signal.SIGCONT)
        own.kill()


def test_the_command_line_fails_over_past_an_mwmq_that_does_not_answer(
    site: Site,
    mq: Mwmq,
    client: mwmq.Client,
    queue: str,
    tmp_path: Path,
    spawned: list[subprocess.Popen[bytes]],
):
    """The first address accepts connections and never answers (SIGSTOPped):
    with --socket-timeout the worker gives it up for the second and works
    (without a timeout it waited on the first for ever)."""
    frozen = site.start()
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        client.create_queue(queue)
        client.send(queue, "job-1")
        p = worker_process(
            spawned,
            tmp_path,
            mq,
            queue,
            "log",
            "--url",
            frozen.url("app"),
            "--url",
            mq.url("app"),
            "--socket-timeout",
            "1",
            "--wait-ms",
            "200",
        )
        (tmp_path / "gate").touch()
        until(lambda: notes(tmp_path, "done") == ["job-1"], "the job done through the second address")
        p.send_signal(signal.SIGTERM)
        assert p.wait(DEADLINE) == 0, (tmp_path / "log").read_text()
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
        frozen.kill()

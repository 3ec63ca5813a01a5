"""The measuring half of bench/celery.sh (which starts PostgreSQL, mwmq and
the two redis-servers, alternates the rounds and prints the table): one
measurement per run of this file, its figures on one line of stdout.

    celery URL N POOL CONCURRENCY PRODUCERS
        -> "send/s drain/s e2e/s send-CPU-ms drain-CPU-ms commands/task statements/task"
    worker PORT QUEUE N CONCURRENCY         -> "messages/s"

`celery`: Celery with no-op tasks (`task_acks_late`, results ignored) on
the broker at URL (`mwmq://` or `redis://`), queue `bench`, which must be
empty. N tasks are sent by a loop of `noop.delay()` on each of PRODUCERS
threads (send/s: their rate; the first task, which connects and declares
the queue, left out); then `celery worker -P POOL -c CONCURRENCY` is started and drains
them (drain/s: from the first ACK, the worker's start-up left out, to the
last); then, that worker still running on the empty queue, N more are sent
and the clock runs from the first send to the last ACK (e2e/s). What the
broker holds unacknowledged is polled every POLL seconds (a Redis list and
kombu's `unacked` hash; mwmq's QLEN): the times are exact to about that.
The CPU a task costs the producer (this process, while it fills the
queue) and the worker (its processes, while it drains), in ms. On mwmq,
also INFO's commands and database statements per task over the whole
measurement (the polls left out; the worker's idle waits and lease
renewals in).

`worker`: the mwmq package's Worker (CONCURRENCY threads, a handler that
does nothing) on QUEUE of the mwmq at 127.0.0.1:PORT, which holds N
messages: the time from `run()` to the Nth ACK.

This file is also the Celery application (`celery -A celery_bench`): the
worker processes import it with BENCH_BROKER set.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from celery import Celery

QUEUE = "bench"
POLL = 0.01
HERE = Path(__file__).resolve().parent

app = Celery("celery_bench", broker=os.environ.get("BENCH_BROKER", "memory://"))
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # mwmq.kombu's option (Redis's transport ignores it): SEND_KEYS=0 sends tasks without a KEY.
    broker_transport_options={"send_keys": os.environ.get("SEND_KEYS", "1") != "0"},
)


@app.task(name="bench.noop", ignore_result=True)
def noop() -> None:
    """Nothing: what is measured is the broker and Celery around it."""


class Broker:
    """What the broker at `url` holds of the queue, and for mwmq what it did
    (INFO's counts)."""

    def __init__(self, url: str):
        self.polls = 0
        self.mwmq = None
        if url.startswith("mwmq"):
            import mwmq

            self.mwmq = mwmq.Client(url.rstrip("/"))
        else:
            import redis

            self.redis = redis.Redis.from_url(url)

    def held(self) -> int:
        """The tasks not yet acknowledged: waiting in the queue or taken by a
        worker (mwmq's QLEN; kombu's Redis transport keeps those taken in
        its `unacked` hash until their ACK)."""
        self.polls += 1
        if self.mwmq is not None:
            return self.mwmq.length(QUEUE)
        with self.redis.pipeline(transaction=False) as p:
            ready, unacked = p.llen(QUEUE).hlen("unacked").execute()
        return int(ready) + int(unacked)

    def counts(self) -> tuple[int, int]:
        """mwmq's commands and database statements so far, less this
        object's QLENs (a command and a statement each) and INFOs."""
        assert self.mwmq is not None
        self.polls += 1
        info = self.mwmq.execute("INFO").decode()
        kv = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        return int(kv["total_commands_processed"]) - self.polls, int(kv["db_statements"]) - self.polls


def send(n: int, producers: int) -> float:
    """N tasks sent by `noop.delay()` in a loop on each of `producers`
    threads, as an application sends them; seconds taken."""
    share = [n // producers + (k < n % producers) for k in range(producers)]
    threads = [threading.Thread(target=lambda m=m: [noop.delay() for _ in range(m)]) for m in share]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def cpu(pid: int) -> float:
    """The CPU seconds (user and system) of process `pid` and its children so far."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def until(cond: Callable[[], bool], what: str, deadline: float = 600.0) -> float:
    """Polls `cond` every POLL seconds until it holds; the time it did."""
    end = time.monotonic() + deadline
    while not cond():
        if time.monotonic() > end:
            raise SystemExit(f"celery_bench: not within {deadline:.0f} s: {what}")
        time.sleep(POLL)
    return time.perf_counter()


def celery(url: str, n: int, pool: str, concurrency: int, producers: int) -> None:
    os.environ["BENCH_BROKER"] = url
    app.conf.broker_url = url
    broker = Broker(url)
    noop.delay()  # the connection and the queue's declaration, before the clock
    until(lambda: broker.held() == 1, "the first task in the queue")
    before = broker.counts() if broker.mwmq else None
    cpu0 = time.process_time()
    send_s = send(n - 1, producers)
    send_cpu = (time.process_time() - cpu0) / (n - 1)
    total = broker.held()
    if total != n:
        raise SystemExit(f"celery_bench: the queue holds {total} tasks, not {n} (not empty before?)")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    )
    cmd = [sys.executable, "-m", "celery", "-A", "celery_bench", "worker", "-Q", QUEUE, "-P", pool]
    cmd += [
        "-c",
        str(concurrency),
        "-l",
        "WARNING",
        "--without-mingle",
        "--without-gossip",
        "--without-heartbeat",
    ]
    with tempfile.TemporaryFile() as log:
        worker = subprocess.Popen(
            cmd, env=env, cwd=HERE, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
        )

        def alive() -> bool:
            if worker.poll() is not None:
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace")[-3000:])
                raise SystemExit(f"celery_bench: the worker exited ({worker.returncode})")
            return True

        try:
            start = until(lambda: alive() and broker.held() < n, "the worker's first ACK")
            cpu0 = cpu(worker.pid)
            end = until(lambda: alive() and broker.held() == 0, "every task acknowledged")
            drain = n / (end - start)
            drain_cpu = (cpu(worker.pid) - cpu0) / n
            t0 = time.perf_counter()
            send(n, producers)
            end = until(lambda: alive() and broker.held() == 0, "every task acknowledged")
            e2e = n / (end - t0)
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    per = "- -"
    if before is not None:
        after = broker.counts()
        per = f"{(after[0] - before[0]) / (2 * n - 1):.2f} {(after[1] - before[1]) / (2 * n - 1):.2f}"
    ms = f"{send_cpu * 1000:.3f} {drain_cpu * 1000:.3f}"
    print(f"{(n - 1) / send_s:.0f} {drain:.0f} {e2e:.0f} {ms} {per}")


def worker(port: int, queue: str, n: int, concurrency: int) -> None:
    import mwmq

    mq = mwmq.Client(f"redis://127.0.0.1:{port}")
    w = mwmq.Worker(mq, queue, lambda m: None, concurrency=concurrency, progress=False, handle_signals=False)
    done: list[float] = []

    def watch() -> None:
        while w.stats.acked < n:
            time.sleep(POLL / 10)
        done.append(time.perf_counter())
        w.stop()

    threading.Thread(target=watch, daemon=True).start()
    t0 = time.perf_counter()
    w.run()
    print(f"{n / (done[0] - t0):.0f}")


if __name__ == "__main__":
    kind, args = sys.argv[1], sys.argv[2:]
    if kind == "celery":
        celery(args[0], int(args[1]), args[2], int(args[3]), int(args[4]))
    elif kind == "worker":
        worker(int(args[0]), args[1], int(args[2]), int(args[3]))
    else:
        raise SystemExit(__doc__)

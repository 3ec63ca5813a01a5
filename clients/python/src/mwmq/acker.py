"""ACKs sent in the background: the caller goes on at once, as an AMQP
`basic.ack` does (no reply awaited), and a few threads send them, each on a
connection of its own from the client's pool.

Why threads and not one pipeline: mwmq carries out one connection's
pipelined requests one at a time, each its own transaction and commit,
while ACKs waiting at the same moment on different connections share one
statement. A process that settles its messages from one thread — Celery's
prefork pool acknowledges in the parent's result-handler thread — would
otherwise pay a commit's round trip per task in that thread and nothing
else could overlap it.

An ACK handed over is sent unless the process dies first; then its message
comes back after its lease, as it would had the process died before the
ACK. `flush` waits until those handed over are answered (a transport's
close calls it before the connections go).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

import redis.exceptions as rex

from .client import Client
from .errors import MwmqError
from .types import Message

logger = logging.getLogger(__name__)

# What becomes of an ACK: the message and True (acknowledged), False (its
# lease was no longer current) or the error that stopped it.
Outcome = Callable[[Message, "bool | BaseException"], None]


class Acker:
    """Sends ACKs handed to `ack` on up to `threads` threads (started on
    first use), and tells `outcome` what became of each (called on those
    threads)."""

    def __init__(self, client: Client, threads: int = 8, outcome: Outcome | None = None):
        if threads < 1:
            raise ValueError(f"threads is 1 or more, not {threads}")
        self.client, self.threads, self.outcome = client, threads, outcome
        self._start()

    def _start(self) -> None:
        """A fresh state: no thread yet, nothing in hand. Again in a forked
        child, which has none of its parent's threads (a lock one of them
        held stays held), and whose parent's ACKs in hand are the parent's."""
        self._jobs: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._pending = 0
        self._running: list[threading.Thread] = []
        self._pid = os.getpid()

    def ack(self, msg: Message) -> None:
        """Hands `msg`'s ACK over; returns at once."""
        if self._pid != os.getpid():
            self._start()
        with self._lock:
            if not self._running:
                self._running = [
                    threading.Thread(target=self._serve, name=f"mwmq-acker-{n}", daemon=True)
                    for n in range(self.threads)
                ]
                for t in self._running:
                    t.start()
            self._pending += 1
        self._jobs.put(msg)

    @property
    def pending(self) -> int:
        """ACKs handed over and not answered yet."""
        with self._lock:
            return self._pending

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every ACK handed over is answered (or failed); False
        when `timeout` seconds passed first."""
        with self._settled:
            return self._settled.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float | None = 10.0) -> bool:
        """`flush`, then stops the threads (they may be started again by `ack`)."""
        done = self.flush(timeout)
        with self._lock:
            running, self._running = self._running, []
        for _ in running:
            self._jobs.put(None)
        for t in running:
            t.join(1.0)
        return done

    def _serve(self) -> None:
        while True:
            msg = self._jobs.get()
            if msg is None:
                return
            result: bool | BaseException
            try:
                result = self.client.ack(msg)
            except (MwmqError, rex.RedisError, OSError) as e:
                result = e
            try:
                if self.outcome is not None:
                    self.outcome(msg, result)
                elif isinstance(result, BaseException):
                    logger.warning("mwmq: the ACK of message %s of %r failed: %s", msg.id, msg.queue, result)
            except Exception:  # the thread must outlive its callback
                logger.exception("mwmq: the outcome of an ACK raised")
            finally:
                with self._settled:
                    self._pending -= 1
                    if self._pending == 0:
                        self._settled.notify_all()

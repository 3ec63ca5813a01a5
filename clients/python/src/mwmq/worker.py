"""The sync worker: a handler run for each message of a queue on N threads,
the leases of the messages in hand extended while their handlers run, ACK
when a handler returns, NACK when it raises, and a graceful stop.

How it holds together:

- The main thread (the one calling `run`) takes messages with `RECV ...
  COUNT free WAIT wait_ms`, `free` being the threads idle then: a worker
  never holds a message it is not working on, so none waits out its lease
  in a local buffer.
- A keeper thread TOUCHes the leases of the messages being handled every
  `touch_every_ms` (a third of the lease by default), pipelined, each for
  another `vt_ms`: a handler may run longer than the lease without its
  message being handed to another worker. A TOUCH answered 0 means the
  lease was lost (the process stalled past it): logged, counted; the
  message's ACK will then answer 0 too.
- A handler that raises is NACKed without a DELAY, so the queue's BACKOFF
  decides when it comes back, and its MAXDELIVERIES when it goes to the
  dead letters.
- `stop()` (and SIGTERM or SIGINT when `run` is on the main thread): no
  more RECVs (a RECV answered after the stop gives its messages back at
  once: NACK DELAY 0), the handlers running have until `stop_timeout`
  seconds after the stop to finish and be ACKed; what is still running then
  is given back (NACK DELAY 0) for another worker, and its handler's end is
  ignored. A second signal gives everything back at once. Giving back
  counts as a delivery against MAXDELIVERIES, as every RECV does.
- The stop is bounded even when mwmq no longer answers (a frozen process,
  a network that drops everything): the RECVs, ACKs and give-backs run on
  their own threads, and `run` returns at the latest GRACE seconds after the
  stop's deadline (or after a second signal), leaving what hangs to its
  daemon threads; the leases they hold run out on the server.
- A handler that raises SystemExit or KeyboardInterrupt (`sys.exit()` in a
  handler) stops the worker: its message is given back, the other handlers
  finish as at a stop, and `run` raises it.
- Each delivery is told apart by its message id and its lease: a message
  given back and received again while its first handler still runs (a
  handler that NACKs its own message, a lease lost) is two deliveries,
  each renewed and settled on its own.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue as queues
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from .client import Client
from .errors import AuthError, BadRequest, LoginThrottled, MwmqError, NoPerm
from .progress import Progress, WorkerStats, event
from .types import Message

Handler = Callable[[Message], Any]
Delivery = tuple[str, int | None]

# The most RECV ... COUNT takes (docs/mwmq.md, RECV).
MAX_COUNT = 1000
# Seconds `run` gives the give-backs (and a RECV in flight) past the stop's
# deadline, or past a second signal, before it returns without them.
GRACE = 3.0


def delivery(m: Message) -> Delivery:
    """One delivery of a message: its id and its lease."""
    return (m.id, m.lease)


def fatal(e: MwmqError) -> bool:
    """A refusal that waiting does not cure (no right, a wrong password, a
    malformed request): the worker stops and raises it. A throttled login
    is cured by waiting."""
    return isinstance(e, (NoPerm, AuthError, BadRequest)) and not isinstance(e, LoginThrottled)


def check(concurrency: int, vt_ms: int, wait_ms: int, touch_every_ms: int | None) -> int:
    """Validates a worker's settings; the TOUCH interval in ms."""
    if concurrency < 1:
        raise ValueError(f"concurrency is 1 or more, not {concurrency}")
    if vt_ms < 100:
        raise ValueError(f"vt_ms is the lease in ms, at least 100, not {vt_ms}")
    if wait_ms < 0:
        raise ValueError(f"wait_ms is 0 or more, not {wait_ms}")
    every = touch_every_ms if touch_every_ms is not None else vt_ms // 3
    if not 0 < every < vt_ms:
        raise ValueError(f"touch_every_ms must be above 0 and below vt_ms ({vt_ms}), not {every}")
    return every


class Worker:
    """Runs `handler(message)` for each message of `queue` on `concurrency`
    threads. The handler may be a plain function or a coroutine function
    (run to its end on the thread). Its return value is ignored; an
    exception NACKs the message. See the module's docstring for the leases
    and the stop. `progress`: the line on standard error (None: when it is
    a terminal)."""

    def __init__(
        self,
        client: Client,
        queue: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        vt_ms: int = 30_000,
        wait_ms: int = 1_000,
        touch_every_ms: int | None = None,
        stop_timeout: float = 30.0,
        sender: str | None = None,
        handle_signals: bool = True,
        progress: bool | None = None,
    ):
        self.touch_every_ms = check(concurrency, vt_ms, wait_ms, touch_every_ms)
        self.client, self.queue, self.handler = client, queue, handler
        self.concurrency, self.vt_ms, self.wait_ms = concurrency, vt_ms, wait_ms
        self.stop_timeout, self.sender, self.handle_signals = stop_timeout, sender, handle_signals
        self.stats = WorkerStats()
        self._progress = Progress(queue, self.stats, progress)
        self._stopping = threading.Event()
        self._hurry = threading.Event()
        self._stopped_at = 0.0
        # Reentrant: stop() may run in a signal handler while the main thread holds it.
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._hurried_at = 0.0
        self._running: dict[Delivery, Message] = {}
        self._given_back: set[Delivery] = set()
        self._jobs: queues.SimpleQueue[Message | None] = queues.SimpleQueue()
        # What ended the take loop with an exception, or a handler's SystemExit.
        self._raised: BaseException | None = None
        self._taken = threading.Event()

    def stop(self) -> None:
        """Stops taking messages; a second call gives back what is held at once.
        Safe from any thread and from a signal handler."""
        if self._stopping.is_set():
            if not self._hurry.is_set():
                self._hurried_at = time.monotonic()
            self._hurry.set()
        else:
            self._stopped_at = time.monotonic()
            self._stopping.set()
        with self._idle:
            self._idle.notify_all()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        event(logging.INFO, "stopping", self.queue, signal=signal.Signals(signum).name)
        self.stop()

    def run(self) -> None:
        """Takes and handles messages until `stop()`; returns once the stop
        is done (see the module's docstring)."""
        old: dict[int, Any] = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                old[s] = signal.signal(s, self._on_signal)
        threads = [
            threading.Thread(target=self._serve, name=f"mwmq-handler-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        keeper = threading.Thread(target=self._keep_leases, name="mwmq-leases", daemon=True)
        taker = threading.Thread(target=self._take_and_finish, name="mwmq-take", daemon=True)
        event(logging.INFO, "started", self.queue, concurrency=self.concurrency, vt_ms=self.vt_ms)
        abandoned = False
        try:
            for t in [*threads, keeper, taker]:
                t.start()
            abandoned = not self._wait_taken()
        finally:
            self._stopping.set()
            self._hurry.set()
            for _ in threads:
                self._jobs.put(None)
            # The keeper may be TOUCHing: done before the caller closes the client
            # (unless mwmq stopped answering: then nothing is waited for).
            keeper.join(0 if abandoned else 10.0)
            for s, h in old.items():
                signal.signal(s, h)
            self._progress.end()
            event(logging.INFO, "stopped", self.queue, done=self.stats.acked, failed=self.stats.failed)
        if self._raised is not None:
            raise self._raised

    def _take_and_finish(self) -> None:
        """The take loop's thread: RECVs until the stop, then the stop's end."""
        try:
            self._take()
            self._finish()
        except BaseException as e:
            with self._lock:
                self._raised = self._raised or e
        finally:
            self._taken.set()

    def _wait_taken(self) -> bool:
        """Waits (on the thread of `run`, where signals are handled) for the
        take loop to end; False when it outlasted the stop's deadline by
        GRACE seconds (or a second stop by GRACE): mwmq does not answer."""
        while not self._taken.wait(0.1):
            if not self._stopping.is_set():
                continue
            if self._hurry.is_set():
                limit = self._hurried_at + GRACE
            else:
                limit = self._stopped_at + max(self.stop_timeout, self.wait_ms / 1000) + GRACE
            if time.monotonic() >= limit:
                with self._lock:
                    held = len(self._running)
                event(logging.WARNING, "stop_abandoned", self.queue, held=held)
                return False
        return True

    def _take(self) -> None:
        """The main loop: RECV as many as there are idle threads."""
        pause = 0.1
        while not self._stopping.is_set():
            with self._idle:
                while len(self._running) >= self.concurrency and not self._stopping.is_set():
                    self._idle.wait(1.0)
                free = min(self.concurrency - len(self._running), MAX_COUNT)
            if self._stopping.is_set():
                return
            try:
                msgs = self.client.recv(
                    self.queue, count=free, vt_ms=self.vt_ms, wait_ms=self.wait_ms, sender=self.sender
                )
            except MwmqError as e:
                if fatal(e):
                    raise
                event(logging.WARNING, "recv_failed", self.queue, error=str(e), retry_in=round(pause, 2))
                self._stopping.wait(pause)
                pause = min(pause * 2, 5.0)
                continue
            pause = 0.1
            self.stats.received += len(msgs)
            if self._stopping.is_set():
                self._give_back(msgs)
                return
            with self._lock:
                for m in msgs:
                    self._running[delivery(m)] = m
                self.stats.running = len(self._running)
            for m in msgs:
                self._jobs.put(m)
            self._progress.tick()

    def _finish(self) -> None:
        """After the stop: wait for the handlers running, until the deadline."""
        deadline = self._stopped_at + self.stop_timeout
        with self._idle:
            while self._running and not self._hurry.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(min(left, 0.5))
            late = [m for d, m in self._running.items() if d not in self._given_back]
            self._given_back.update(delivery(m) for m in late)
        self._give_back(late)

    def _give_back(self, msgs: list[Message]) -> None:
        for m in msgs:
            try:
                self.client.nack(m, delay_ms=0)
            except MwmqError as e:
                event(logging.WARNING, "give_back_failed", self.queue, m, error=str(e))
                continue
            with self._lock:
                self.stats.given_back += 1
            event(logging.DEBUG, "given_back", self.queue, m)

    def _serve(self) -> None:
        """A handler thread."""
        while True:
            m = self._jobs.get()
            if m is None:
                return
            ok, error = True, None
            try:
                result = self.handler(m)
                if inspect.isawaitable(result):
                    asyncio.run(_awaited(result))
            except Exception as e:
                ok, error = False, e
            except BaseException as e:
                # sys.exit() or a KeyboardInterrupt in a handler: the worker
                # stops (run raises it), the message goes back untouched.
                self._exit(m, e)
                continue
            self._settle(m, ok, error)

    def _exit(self, m: Message, e: BaseException) -> None:
        event(logging.ERROR, "handler_exit", self.queue, m, error=repr(e))
        with self._lock:
            self._raised = self._raised or e
            late = delivery(m) in self._given_back  # given back by the stop already
            self._given_back.add(delivery(m))
        if not late:
            self._give_back([m])
        self.stop()
        with self._idle:
            self._running.pop(delivery(m), None)
            self._given_back.discard(delivery(m))
            self.stats.running = len(self._running)
            self._idle.notify_all()

    def _settle(self, m: Message, ok: bool, error: BaseException | None) -> None:
        """ACK or NACK a handled message (unless it was given back meanwhile)."""
        with self._lock:
            given_back = delivery(m) in self._given_back
        if not given_back:
            try:
                if ok:
                    done = self.client.ack(m)
                    with self._lock:
                        self.stats.acked += done
                        self.stats.lease_lost += not done
                    event(
                        logging.DEBUG if done else logging.WARNING,
                        "acked" if done else "lease_lost",
                        self.queue,
                        m,
                    )
                else:
                    with self._lock:
                        self.stats.failed += 1
                    event(logging.WARNING, "failed", self.queue, m, error=repr(error), exc_info=error)
                    self.client.nack(m)
            except Exception as e:  # the handler thread must outlive any failure
                event(logging.WARNING, "settle_failed", self.queue, m, error=str(e))
        with self._idle:
            self._running.pop(delivery(m), None)
            self._given_back.discard(delivery(m))
            self.stats.running = len(self._running)
            self._idle.notify_all()

    def _keep_leases(self) -> None:
        """The keeper thread: TOUCH the leases of the messages in hand."""
        while not self._hurry.wait(self.touch_every_ms / 1000):
            with self._lock:
                held = [m for d, m in self._running.items() if d not in self._given_back]
            if not held:
                continue
            try:
                kept = self.client.touch_many(held, self.vt_ms)
            except Exception as e:  # the keeper must outlive any failure
                event(logging.WARNING, "touch_failed", self.queue, error=str(e))
                continue
            for m, ok in zip(held, kept, strict=True):
                with self._lock:
                    still = delivery(m) in self._running
                if not ok and still:
                    with self._lock:
                        self.stats.lease_lost += 1
                    event(logging.WARNING, "lease_lost", self.queue, m, when="touch")


async def _awaited(a: Any) -> Any:
    return await a

"""The asyncio worker: `AsyncWorker` does what `mwmq.Worker` does (see
worker.py for the leases, the ACKs and NACKs and the stop) on one event
loop: up to `concurrency` handlers at once as tasks, an async handler
awaited, a plain one run in a thread (`asyncio.to_thread`). A stop cancels
the waiting RECV at once (its connection is closed: mwmq gives back the
leases of a reply it could not deliver), and at the deadline the handlers
still running are cancelled and their messages given back; that give-back
is bounded (`worker.GRACE` seconds), so that `run` ends even when mwmq no
longer answers. Deliveries are told apart by message id and lease, as in
worker.py."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .aio import AsyncClient
from .errors import MwmqError
from .progress import Progress, WorkerStats, event
from .types import Message
from .worker import GRACE, MAX_COUNT, Delivery, check, delivery, fatal

AsyncHandler = Callable[[Message], Any]


class AsyncWorker:
    """Runs `handler(message)` (async or not) for each message of `queue`,
    `concurrency` at a time; `await worker.run()` until `stop()`."""

    def __init__(
        self,
        client: AsyncClient,
        queue: str,
        handler: AsyncHandler,
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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        self._changed = asyncio.Event()
        self._stopped_at = 0.0
        self._running: dict[Delivery, tuple[Message, asyncio.Task[None]]] = {}
        self._given_back: set[Delivery] = set()

    def stop(self) -> None:
        """Stops taking messages; a second call gives back what is held at
        once. Safe from any thread."""
        loop = self._loop
        if loop is not None and threading.current_thread() is not self._thread:
            loop.call_soon_threadsafe(self._stop)
        else:
            self._stop()

    def _stop(self) -> None:
        if self._stopping.is_set():
            self._hurry.set()
        else:
            self._stopped_at = time.monotonic()
            self._stopping.set()

    async def run(self) -> None:
        """Takes and handles messages until `stop()`."""
        self._loop = loop = asyncio.get_running_loop()
        self._thread = threading.current_thread()
        signals = []
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(s, self._on_signal, s)
                signals.append(s)
        keeper = asyncio.create_task(self._keep_leases())
        event(logging.INFO, "started", self.queue, concurrency=self.concurrency, vt_ms=self.vt_ms)
        try:
            await self._take()
            await self._finish()
        finally:
            self._hurry.set()
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            for s in signals:
                loop.remove_signal_handler(s)
            self._progress.end()
            event(logging.INFO, "stopped", self.queue, done=self.stats.acked, failed=self.stats.failed)

    def _on_signal(self, s: signal.Signals) -> None:
        event(logging.INFO, "stopping", self.queue, signal=signal.Signals(s).name)
        self._stop()

    async def _until_stopped(self, aw: Any) -> tuple[bool, Any]:
        """(True, its result) when `aw` ends first; (False, None) when the
        stop came first (then `aw` is cancelled)."""
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if task.done():
            return True, task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, MwmqError):
            await task
        return False, None

    async def _take(self) -> None:
        pause = 0.1
        while not self._stopping.is_set():
            while len(self._running) >= self.concurrency and not self._stopping.is_set():
                self._changed.clear()
                await self._until_stopped(self._changed.wait())
            if self._stopping.is_set():
                return
            free = min(self.concurrency - len(self._running), MAX_COUNT)
            recv = self.client.recv(
                self.queue, count=free, vt_ms=self.vt_ms, wait_ms=self.wait_ms, sender=self.sender
            )
            try:
                done, msgs = await self._until_stopped(recv)
            except MwmqError as e:
                if fatal(e):
                    raise
                event(logging.WARNING, "recv_failed", self.queue, error=str(e), retry_in=round(pause, 2))
                await self._until_stopped(asyncio.sleep(pause))
                pause = min(pause * 2, 5.0)
                continue
            if not done:
                return
            pause = 0.1
            self.stats.received += len(msgs)
            for m in msgs:
                self._running[delivery(m)] = (m, asyncio.create_task(self._handle(m)))
            self.stats.running = len(self._running)
            self._progress.tick()

    async def _handle(self, m: Message) -> None:
        ok, error = True, None
        try:
            if inspect.iscoroutinefunction(self.handler):
                await self.handler(m)
            else:
                result = await asyncio.to_thread(self.handler, m)
                if inspect.isawaitable(result):
                    await result
        except asyncio.CancelledError:
            self._done(m)
            raise
        except Exception as e:
            ok, error = False, e
        try:
            if delivery(m) in self._given_back:
                return
            if ok:
                done = await self.client.ack(m)
                self.stats.acked += done
                self.stats.lease_lost += not done
                event(
                    logging.DEBUG if done else logging.WARNING,
                    "acked" if done else "lease_lost",
                    self.queue,
                    m,
                )
            else:
                self.stats.failed += 1
                event(logging.WARNING, "failed", self.queue, m, error=repr(error), exc_info=error)
                await self.client.nack(m)
        except Exception as e:  # a handler's task must end cleanly whatever happened
            event(logging.WARNING, "settle_failed", self.queue, m, error=str(e))
        finally:
            self._done(m)

    def _done(self, m: Message) -> None:
        self._running.pop(delivery(m), None)
        self._given_back.discard(delivery(m))
        self.stats.running = len(self._running)
        self._changed.set()

    async def _finish(self) -> None:
        deadline = self._stopped_at + self.stop_timeout
        while self._running and not self._hurry.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            tasks = [t for _, t in self._running.values()]
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait({*tasks, hurry}, timeout=min(left, 0.5), return_when=asyncio.FIRST_COMPLETED)
            hurry.cancel()
        late = list(self._running.values())
        self._given_back.update(delivery(m) for m, _ in late)
        for _, task in late:
            task.cancel()
        before = self.stats.given_back
        try:
            await asyncio.wait_for(self._give_back([m for m, _ in late]), GRACE)
        except asyncio.TimeoutError:
            held = len(late) - (self.stats.given_back - before)
            event(logging.WARNING, "stop_abandoned", self.queue, held=held)
        for _, task in late:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _give_back(self, msgs: list[Message]) -> None:
        for m in msgs:
            try:
                await self.client.nack(m, delay_ms=0)
                self.stats.given_back += 1
                event(logging.DEBUG, "given_back", self.queue, m)
            except MwmqError as e:
                event(logging.WARNING, "give_back_failed", self.queue, m, error=str(e))

    async def _keep_leases(self) -> None:
        while True:
            await asyncio.sleep(self.touch_every_ms / 1000)
            held = [m for d, (m, _) in self._running.items() if d not in self._given_back]
            if not held:
                continue
            try:
                kept = await self.client.touch_many(held, self.vt_ms)
            except Exception as e:  # the keeper must outlive any failure
                event(logging.WARNING, "touch_failed", self.queue, error=str(e))
                continue
            for m, ok in zip(held, kept, strict=True):
                if not ok and delivery(m) in self._running:
                    self.stats.lease_lost += 1
                    event(logging.WARNING, "lease_lost", self.queue, m, when="touch")

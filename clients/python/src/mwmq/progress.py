"""What the sync and async workers share: their counters, the progress
line on a terminal, their structured log records, and the rules of a stop.

A worker logs to the `mwmq.worker` logger: its start and stop at INFO, a
handler's exception and a lost lease at WARNING, each message's outcome at
DEBUG; every record carries `mwmq_queue` and, for a message, `mwmq_id` and
`mwmq_event` (`acked`, `failed`, `lease_lost`, `given_back`) as extra fields,
for a JSON formatter to pick up.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

from .types import Message

log = logging.getLogger("mwmq.worker")


@dataclass
class WorkerStats:
    """What a worker did since it started."""

    received: int = 0
    acked: int = 0
    failed: int = 0
    given_back: int = 0
    lease_lost: int = 0
    running: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self, queue: str) -> str:
        took = max(time.monotonic() - self.started, 1e-9)
        return (
            f"mwmq worker {queue}: {self.acked} done, {self.failed} failed, {self.running} running, "
            f"{self.given_back} given back, {self.acked / took:.1f}/s"
        )


def event(level: int, what: str, queue: str, msg: Message | None = None, **fields: Any) -> None:
    """A log record of the worker with its extra fields (`exc_info` is logging's)."""
    exc_info = fields.pop("exc_info", None)
    extra: dict[str, Any] = {
        "mwmq_queue": queue,
        "mwmq_event": what,
        **{f"mwmq_{k}": v for k, v in fields.items()},
    }
    if msg is not None:
        extra["mwmq_id"] = msg.id
    text = f"{queue}: {what}" + (f" message {msg.id}" if msg is not None else "")
    if fields:
        text += " (" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"
    log.log(level, text, extra=extra, exc_info=exc_info)


class Progress:
    """A line on standard error rewritten at most once a second, when it is
    a terminal (`enabled=None`) or when asked (`True`); nothing otherwise."""

    def __init__(self, queue: str, stats: WorkerStats, enabled: bool | None, out: IO[str] | None = None):
        self.out = out or sys.stderr
        self.queue, self.stats = queue, stats
        self.enabled = self.out.isatty() if enabled is None else enabled
        self.last = 0.0

    def tick(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if force or now - self.last >= 1.0:
            self.last = now
            self.out.write("\r\x1b[K" + self.stats.line(self.queue))
            self.out.flush()

    def end(self) -> None:
        if self.enabled:
            self.tick(force=True)
            self.out.write("\n")
            self.out.flush()

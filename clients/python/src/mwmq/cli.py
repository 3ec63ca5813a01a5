"""The command line: `python -m mwmq worker module:function --queue q` (or
`mwmq-worker module:function --queue q`) runs a Worker, or an AsyncWorker
when the function is a coroutine function, until SIGTERM or SIGINT.

The address comes from `--url` (repeated: failover) or `$MWMQ_URL`, so that
a password need not be on the command line where `ps` shows it. Logs go to
standard error, as text or, with `--log-format json`, one JSON object a
line with the worker's extra fields (`mwmq_queue`, `mwmq_id`,
`mwmq_event`, ...) at the top level. Exit status: 0 after a stop, 1 when
mwmq refused the worker (a wrong password, no right to receive), 2 for
a usage error.

Every reply must come within `--socket-timeout` seconds (by default 30 s
past the RECV's wait): an mwmq that stopped answering (a frozen process, a
network that drops everything) is then given up for the next address,
rather than waited on for ever.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from .errors import MwmqError

DEFAULT_URL = "redis://127.0.0.1:6380"
_RECORD_FIELDS = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message and the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and k != "message"})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def load(spec: str) -> Callable[..., Any]:
    """`package.module:function` (the current directory is on the path)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise SystemExit(f"mwmq worker: the handler is module:function, not {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise SystemExit(f"mwmq worker: cannot import {module}: {e}") from None
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"mwmq worker: {module} has no {name}") from None
    if not callable(obj):
        raise SystemExit(f"mwmq worker: {spec} is not callable")
    return obj


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mwmq", description="mwmq's Python worker")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run a handler for each message of a queue")
    w.add_argument("handler", help="module:function, called with each mwmq.Message")
    w.add_argument("-q", "--queue", required=True, help="the queue to take messages from")
    w.add_argument(
        "--url",
        action="append",
        help=f"mwmq's address, repeated to fail over (default $MWMQ_URL or {DEFAULT_URL})",
    )
    w.add_argument("-c", "--concurrency", type=int, default=1, help="handlers at once (default 1)")
    w.add_argument(
        "--vt-ms",
        type=int,
        default=30_000,
        help="each lease, extended while its handler runs (default 30000)",
    )
    w.add_argument(
        "--wait-ms", type=int, default=1_000, help="how long a RECV waits for a message (default 1000)"
    )
    w.add_argument(
        "--stop-timeout", type=float, default=30.0, help="seconds a stop leaves running handlers (default 30)"
    )
    w.add_argument(
        "--socket-timeout",
        type=float,
        help="seconds each reply may take before the address is given up (default: the wait + 30)",
    )
    w.add_argument("--from", dest="sender", help="only messages from this sender")
    w.add_argument("--ca", help="CA certificate (PEM) to check a rediss:// server with")
    w.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the progress line (default: on a terminal)",
    )
    w.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    w.add_argument("--log-format", default="text", choices=["text", "json"])
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler], force=True)
    fn = load(args.handler)
    urls = args.url or [os.environ.get("MWMQ_URL", DEFAULT_URL)]
    timeout = args.socket_timeout if args.socket_timeout is not None else args.wait_ms / 1000 + 30.0
    connection = {"ssl_ca_certs": args.ca, "socket_timeout": timeout}
    options: dict[str, Any] = {
        "concurrency": args.concurrency,
        "vt_ms": args.vt_ms,
        "wait_ms": args.wait_ms,
        "stop_timeout": args.stop_timeout,
        "sender": args.sender,
        "progress": args.progress,
    }
    try:
        if inspect.iscoroutinefunction(fn):
            asyncio.run(_run_async(urls, connection, args.queue, fn, options))
        else:
            from .client import Client
            from .worker import Worker

            with Client(urls, **connection) as client:
                Worker(client, args.queue, fn, **options).run()
    except MwmqError as e:
        print(f"mwmq worker: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"mwmq worker: {e}", file=sys.stderr)
        return 2
    return 0


async def _run_async(
    urls: list[str], connection: dict[str, Any], queue: str, fn: Callable[..., Any], options: dict[str, Any]
) -> None:
    from .aio import AsyncClient
    from .aio_worker import AsyncWorker

    async with AsyncClient(urls, **connection) as client:
        await AsyncWorker(client, queue, fn, **options).run()


def worker_main() -> int:
    """`mwmq-worker ...`: the same as `python -m mwmq worker ...`."""
    return main(["worker", *sys.argv[1:]])

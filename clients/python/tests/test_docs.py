"""docs/mwmq.md's Python section: its `python` blocks run in order, in one
namespace, against an mwmq without users (as `make run-mq` starts), the
address 127.0.0.1:6380 replaced by its. A block whose mark says `not run`
is left out (the taskiq example runs: its startup creates its queues). The
worker's example runs until SIGTERM: the test sends it one once the queue
is empty, as an operator would."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import types
from pathlib import Path

import mwmq

from conftest import Site

DOC = Path(__file__).resolve().parents[3] / "docs" / "mwmq.md"


def python_blocks(text: str) -> list[str]:
    section = text.split("\n## Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"(<!--[^\n]*-->\n)?```python\n(.*?)\n```", section, re.S)
    return [code for mark, code in blocks if "not run" not in mark]


def test_the_python_sections_examples_run(site: Site):
    plain = site.start(users=False)
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 3
    # A module of its own, as a user's file is: taskiq's task decorator looks
    # its function's module up in sys.modules.
    module = types.ModuleType("docs")
    ns: dict[str, object] = module.__dict__
    sys.modules["docs"] = module
    watcher = threading.Thread(target=stop_the_worker_when_done, args=(ns, plain.port), daemon=True)
    watcher.start()
    try:
        for code in blocks:
            exec(compile(code.replace("127.0.0.1:6380", f"127.0.0.1:{plain.port}"), str(DOC), "exec"), ns)
        with mwmq.Client(f"redis://127.0.0.1:{plain.port}") as c:
            tasks = (c.info("tasks").dead_letter, c.length("tasks"))
    finally:
        del sys.modules["docs"]
        plain.kill()
    assert "watch_failed" not in ns, ns["watch_failed"]
    worker = ns["worker"]
    assert isinstance(worker, mwmq.Worker) and worker.stats.acked >= 1
    # The taskiq example's startup made its queue and the dead-letter queue
    # before it, and its task waits there.
    assert tasks == ("tasks.dead", 1)


def stop_the_worker_when_done(ns: dict[str, object], port: int) -> None:
    """SIGTERM to this process once the example's worker handles it and its queue is empty."""
    deadline = time.monotonic() + 30
    with mwmq.Client(f"redis://127.0.0.1:{port}") as c:
        while time.monotonic() < deadline:
            w = ns.get("worker")
            handler = signal.getsignal(signal.SIGTERM)
            if (
                isinstance(w, mwmq.Worker)
                and getattr(handler, "__self__", None) is w
                and c.length("jobs") == 0
            ):
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)
        # Not as expected: stop it anyway, so the test fails instead of hanging.
        ns["watch_failed"] = f"the worker did not take SIGTERM, or jobs kept {c.length('jobs')} messages"
        w = ns.get("worker")
        if isinstance(w, mwmq.Worker):
            w.stop()
            w.stop()

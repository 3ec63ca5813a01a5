"""The taskiq application that test_taskiq.py runs under `taskiq worker`:
a broker on one mwmq queue and a task that records each run.

Configured from the environment: MWMQ_TEST_TASKIQ_URL (mwmq's address with
a user), MWMQ_TEST_TASKIQ_QUEUE, MWMQ_TEST_RUNS (a directory where each run
appends a line: the process and the time).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mwmq.taskiq import MwmqBroker

broker = MwmqBroker(os.environ["MWMQ_TEST_TASKIQ_URL"], queue=os.environ["MWMQ_TEST_TASKIQ_QUEUE"])
RUNS = Path(os.environ["MWMQ_TEST_RUNS"])


@broker.task
async def note(name: str) -> None:
    with (RUNS / name).open("a") as f:
        f.write(f"{os.getpid()} {time.time():.6f}\n")

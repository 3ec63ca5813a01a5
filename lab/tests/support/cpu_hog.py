"""A CPU hog for the drift test: a busy loop on one CPU, in the cgroup whose
`cgroup.procs` (or v1 `tasks`) file it is given, for at most SECONDS (it ends
by itself even if the test that started it dies).

    python cpu_hog.py CPU CGROUP-FILE SECONDS

It prints `ready` once pinned and in its cgroup."""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    cpu, join, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    os.sched_setaffinity(0, {cpu})
    with open(join, "w") as f:
        f.write(str(os.getpid()))
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(100_000):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

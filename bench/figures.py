"""What one load run measured, from the file its client wrote: mwload's
summary.json or memtier_benchmark's --json-out-file. Shared by the bench
scripts (`sys.path.insert(0, "bench")`; they run from the repository root)."""

import json
from pathlib import Path
from typing import NamedTuple


class Figures(NamedTuple):
    ops: float  # requests per second
    p99_ms: float
    requests: float
    errors: int


def figures(path: Path, client: str) -> Figures:
    """`client` is "mwload" or anything else for memtier_benchmark."""
    s = json.loads(Path(path).read_text())
    if client == "mwload":
        a = s["ops"]["all"]
        return Figures(a["count"] * 1000 / s["duration_ms"], a["response_us"]["p99"] / 1000, a["count"], a["errors"])
    t = s["ALL STATS"]["Totals"]
    # memtier's own Ops/sec sometimes misreports the run time on this machine:
    # the per-second buckets of its time series instead, the last (a partial
    # second) left out.
    series = sorted((t.get("Time-Serie") or {}).items(), key=lambda kv: int(kv[0]))
    counts = [v.get("Count", 0) for _, v in series]
    ops = sum(counts[:-1]) / len(counts[:-1]) if len(counts) > 1 else t["Ops/sec"]
    p99 = t.get("Percentile Latencies", {}).get("p99.00", float("nan"))
    return Figures(ops, p99, sum(counts) or t.get("Count", 0), 0)

"""The reference point: a small fixed system every `mwlab run` measures at
its start and at its end, so that two results taken at different times (or
of different experiments) can be compared on the same machine state
(`mwlab.drift`).

The point is the same whatever the experiment: one memcached (one thread)
behind one mwproxy (pool engine, REF_WORKERS workers, one net thread), driven
by one mwload thread closed-loop with REF_CLIENTS clients, 1:10 sets to
gets, 1,000 keys of 128 bytes prefilled, on this machine's loopback (also
when the experiment runs on emulated or remote hosts). It loads both cores
of a small machine, so it moves with the CPU the machine has to give. Its
commands are written out here rather than derived from the spec's
defaults, so that a change of the lab's defaults does not move it.

Each measurement is REF_WARMUP_S of load, then REF_MEASURE_S measured in
windows of REF_WINDOW_MS; its throughput and mean response time come with
their standard errors from the windows (batch means). A row per measurement
goes to `reference.csv` in the result directory, and its files under
`reference/<phase>-<k>/`.
"""

from __future__ import annotations

import csv
import math
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from mwlab.procs import LabError, ProcessGroup, binary, free_port, memcached_cmd
from mwlab.results import read_windows

REF_CLIENTS = 16
REF_WORKERS = 2
REF_WARMUP_S = 0.5
REF_MEASURE_S = 2.0
REF_WINDOW_MS = 250
REF_KEYS = 1000
# What identifies the point: a result measured with another one is not compared.
REF_POINT = f"mc1-mw{REF_WORKERS}-N{REF_CLIENTS}-1:10"

# What it is, in words (the report says it).
DESCRIPTION = (
    f"one memcached, one mwproxy with {REF_WORKERS} workers, one mwload thread with {REF_CLIENTS} "
    f"clients closed-loop, {REF_MEASURE_S:g} s measured after {REF_WARMUP_S:g} s of warm-up"
)

FILE = "reference.csv"

# Seconds a measurement takes besides its warm-up and measured time
# (starting the three processes, the prefill, stopping; on this machine).
REF_OVERHEAD_S = 1.5


def seconds() -> float:
    """About how long the two measurements of a run take."""
    return 2 * (REF_WARMUP_S + REF_MEASURE_S + REF_OVERHEAD_S)


@dataclass
class Reference:
    """One measurement of the reference point."""

    phase: str  # start | end
    started_unix: float
    x: float  # ops/s
    x_se: float
    r_us: float
    r_se_us: float
    windows: int
    point: str = REF_POINT

    @property
    def x_cv(self) -> float:
        """The relative standard error of the throughput."""
        return self.x_se / self.x if self.x > 0 else math.nan


def _commands(where: Path, mc_port: int, mw_port: int) -> dict[str, list[str]]:
    target = ["-s", "127.0.0.1", "-p", str(mw_port)]
    common = ["--key-maximum", str(REF_KEYS - 1), "-d", "128", "--progress", "never"]
    fill = ["--ratio", "0:1", *common]
    return {
        "mc0": memcached_cmd("127.0.0.1", mc_port),
        "mw0": [
            str(binary("mwproxy")),
            "--listen",
            f"127.0.0.1:{mw_port}",
            "-m",
            f"127.0.0.1:{mc_port}",
            "--engine",
            "pool",
            "-t",
            str(REF_WORKERS),
            "--net-threads",
            "1",
            "--trace-every",
            "0",
            "--window-ms",
            str(REF_WINDOW_MS),
            "--out",
            str(where / "mw0"),
            "--log",
            "warn",
        ],
        "prefill": [str(binary("mwload")), *target, "--prefill", "-n", "1", "-t", "1", "-c", "1", *fill],
        "cl0": [
            str(binary("mwload")),
            *target,
            "-t",
            "1",
            "-c",
            str(REF_CLIENTS),
            "--ratio",
            "1:10",
            "--test-time",
            str(REF_MEASURE_S),
            "--warmup",
            str(REF_WARMUP_S),
            "--cooldown",
            "0",
            "--seed",
            "1",
            "--window-ms",
            str(REF_WINDOW_MS),
            "--out",
            str(where / "cl0"),
            "--max-error-rate",
            "1",
            *common,
        ],
    }


def measure(out: Path, phase: str) -> Reference:
    """Measures the reference point once, appends it to `out/reference.csv`
    and returns it; a LabError when it could not be measured."""
    k = len(read(out)) + 1
    where = out / "reference" / f"{phase}-{k}"
    started = time.time()
    with ProcessGroup(where / "logs") as g:
        mc_port, mw_port = free_port(), free_port()
        cmds = _commands(where, mc_port, mw_port)
        g.start("mc0", cmds["mc0"], mc_port)
        mw = g.start("mw0", cmds["mw0"], mw_port)
        pre = g.start("prefill", cmds["prefill"])
        if pre.popen.wait(timeout=60) != 0:
            raise LabError(f"its prefill failed; see {pre.log}")
        cl = g.start("cl0", cmds["cl0"])
        limit = REF_WARMUP_S + REF_MEASURE_S + 30
        try:
            code = cl.popen.wait(timeout=limit)
        except subprocess.TimeoutExpired as e:
            raise LabError(f"its load did not end within {limit:.0f} s; see {cl.log}") from e
        if code != 0:
            raise LabError(f"its load failed ({code}); see {cl.log}")
        g.terminate(mw)
    ref = summarize(read_windows(where / "cl0"), phase, started)
    append(out, ref)
    return ref


def summarize(windows: list[dict], phase: str, started: float) -> Reference:
    """The measurement from the client's windows: throughput and mean
    response time over the measured windows, standard errors from the full
    windows' spread (batch means)."""
    kept = [w for w in windows if (w.get("client") or {}).get("phase", "measure") == "measure"]
    total_ms = sum(w["duration_ms"] for w in kept)
    count = sum(w["ops"]["all"]["count"] for w in kept)
    if not kept or total_ms <= 0 or count == 0:
        raise LabError("the reference point measured nothing")
    rt = sum(
        w["ops"]["all"]["response_us"]["mean"] * w["ops"]["all"]["count"]
        for w in kept
        if w["ops"]["all"]["count"]
    )
    x, r = count / (total_ms / 1000), rt / count
    full = [w for w in kept if w["duration_ms"] >= 0.9 * REF_WINDOW_MS and w["ops"]["all"]["count"]]
    xs = [w["ops"]["all"]["count"] / (w["duration_ms"] / 1000) for w in full]
    rs = [w["ops"]["all"]["response_us"]["mean"] for w in full]
    k = len(full)
    x_se = statistics.stdev(xs) / math.sqrt(k) if k >= 2 else math.nan
    r_se = statistics.stdev(rs) / math.sqrt(k) if k >= 2 else math.nan
    return Reference(phase, started, x, x_se, r, r_se, k)


COLUMNS = [f.name for f in fields(Reference)]


def append(out: Path, ref: Reference) -> None:
    """Adds a measurement to `out/reference.csv`."""
    path = out / FILE
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        w.writerow(asdict(ref))


def read(result: Path) -> list[Reference]:
    """The reference measurements of a result, in the order taken (none: an empty list)."""
    path = result / FILE
    if not path.is_file():
        return []
    out = []
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            try:
                ref = Reference(
                    phase=row["phase"],
                    started_unix=float(row["started_unix"]),
                    x=float(row["x"]),
                    x_se=float(row["x_se"]),
                    r_us=float(row["r_us"]),
                    r_se_us=float(row["r_se_us"]),
                    windows=int(row["windows"]),
                    point=row.get("point") or REF_POINT,
                )
            except KeyError as e:
                raise LabError(f"{path} is damaged: it has no column {e}") from None
            except (TypeError, ValueError) as e:
                raise LabError(f"{path} is damaged: line {i}: {e}") from None
            if not (math.isfinite(ref.x) and ref.x >= 0):
                raise LabError(f"{path} is damaged: line {i}: throughput {row['x']}")
            out.append(ref)
    return out

"""The local runner: for each run of an experiment, start memcached servers,
mwproxy middlewares and mwload clients on loopback, let the clients run,
stop everything, and keep every result file under

    results/<experiment>/<timestamp>/<point>/rep-<r>/
        mw0/ (windows.jsonl, summary.json, trace.csv)   cl0/ cl1/ ...
        resources.csv   logs/   run.json

A failed run is recorded (run.json says why) and the experiment goes on;
`--resume` skips the runs that already finished.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from mwlab.procs import LabError, ProcessGroup, ResourceSampler, binary, free_port, usable_cores
from mwlab.spec import Experiment, Run

Progress = Callable[[int, int, str, float], None]


def run_dir(out: Path, run: Run) -> Path:
    return out / run.point.name / f"rep-{run.rep}"


def _mwproxy_cmd(s: dict[str, Any], index: int, port: int, servers: list[int], out: Path) -> list[str]:
    return [
        str(binary("mwproxy")),
        "-p",
        str(port),
        "-m",
        *[f"127.0.0.1:{p}" for p in servers],
        "-t",
        str(s["middleware.workers"]),
        "--net-threads",
        str(s["middleware.net_threads"]),
        "-r",
        str(s["middleware.replication"]),
        "--multiget",
        s["middleware.multiget"],
        "--queue-capacity",
        str(s["middleware.queue_capacity"]),
        "--out",
        str(out / f"mw{index}"),
        "--instance",
        f"mw{index}",
        "--trace-every",
        str(s["middleware.trace_every"]),
        "--window-ms",
        str(s["run.window_ms"]),
        "--log",
        "warn",
    ]


def _target_args(ports: list[int], all_targets: bool, index: int) -> list[str]:
    if all_targets and len(ports) > 1:
        return ["--servers", ",".join(f"127.0.0.1:{p}" for p in ports)]
    return ["-p", str(ports[index % len(ports)])]


def _mwload_cmd(s: dict[str, Any], index: int, instances: int, target: list[str], out: Path) -> list[str]:
    cmd = [
        str(binary("mwload")),
        *target,
        "-t",
        str(s["topology.threads"]),
        "-c",
        str(s["topology.virtual_clients"]),
        "--ratio",
        str(s["workload.ratio"]),
        "--test-time",
        str(s["run.duration"]),
        "--warmup",
        str(s["run.warmup"]),
        "--cooldown",
        str(s["run.cooldown"]),
        "--key-maximum",
        str(s["workload.keys"] - 1),
        "-d",
        str(s["workload.value_size"]),
        "--multi-key-get",
        str(s["workload.multiget_size"]),
        "--key-pattern",
        s["workload.key_pattern"],
        "--seed",
        str(s["run.seed"] * 1000 + index),
        "--window-ms",
        str(s["run.window_ms"]),
        "--out",
        str(out / f"cl{index}"),
        "--instance",
        f"cl{index}",
        "--progress",
        "never",
        "--max-error-rate",
        "1",
    ]
    if s["workload.think_time_us"]:
        cmd += ["--think-time", str(s["workload.think_time_us"]), "--think-dist", "exponential"]
    if s["workload.rate"]:
        cmd += ["--rate", str(s["workload.rate"] / instances)]
    return cmd


def _prefill(g: ProcessGroup, s: dict[str, Any], targets: list[list[str]]) -> None:
    for i, target in enumerate(targets):
        cmd = [
            str(binary("mwload")),
            *target,
            "--prefill",
            "-n",
            "1",
            "-t",
            "1",
            "-c",
            "1",
            "--ratio",
            "0:1",
            "--key-maximum",
            str(s["workload.keys"] - 1),
            "-d",
            str(s["workload.value_size"]),
            "--progress",
            "never",
        ]
        p = g.start(f"prefill{i}", cmd)
        if p.popen.wait(timeout=120) != 0:
            raise LabError(f"prefill through {' '.join(target)} failed; see {p.log}")


def run_once(run: Run, out: Path) -> dict[str, Any]:
    """Runs one repetition of one point; returns what run.json records."""
    s = run.point.settings
    if s["run.client"] != "mwload":
        raise LabError("client: memtier is not supported by this runner yet; use mwload")
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with ProcessGroup(out / "logs") as g:
        servers = [g.memcached(f"mc{i}").port for i in range(s["topology.servers"])]
        mws = []
        for m in range(s["topology.middlewares"]):
            port = free_port()
            mws.append(g.start(f"mw{m}", _mwproxy_cmd(s, m, port, servers, out), port))
        instances = s["topology.client_machines"] * s["topology.instances"]
        all_targets = s["topology.client_targets"] == "all"
        ports = [m.port for m in mws] if mws else servers
        if s["workload.prefill"]:
            if mws:
                _prefill(g, s, [["-p", str(ports[0])]])
            elif all_targets:
                _prefill(g, s, [_target_args(servers, True, 0)])
            else:
                _prefill(g, s, [["-p", str(p)] for p in servers[: min(len(servers), instances)]])
        sampler = ResourceSampler(g, out / "resources.csv", interval=min(0.5, s["run.window_ms"] / 2000))
        sampler.start()
        clients = [
            g.start(f"cl{j}", _mwload_cmd(s, j, instances, _target_args(ports, all_targets, j), out))
            for j in range(instances)
        ]
        limit = s["run.warmup"] + s["run.duration"] + s["run.cooldown"] + 60
        codes = {}
        for c in clients:
            try:
                codes[c.name] = c.popen.wait(timeout=max(1.0, limit - (time.time() - started)))
            except subprocess.TimeoutExpired:
                c.popen.kill()
                codes[c.name] = "timeout"
        for m in mws:
            codes[m.name] = g.terminate(m)
        sampler.stop()
    failed = {k: v for k, v in codes.items() if v != 0}
    record = {
        "point": run.point.name,
        "rep": run.rep,
        "factors": run.point.factors,
        "settings": run.point.settings,
        "started_unix": started,
        "ended_unix": time.time(),
        "exit_codes": codes,
        "cores": usable_cores(),
        "status": "failed" if failed else "ok",
    }
    if failed:
        record["error"] = "processes exited abnormally: " + ", ".join(f"{k}={v}" for k, v in failed.items())
    return record


def prepare(exp: Experiment, results: Path, resume: Path | None = None) -> Path:
    """The result directory of a run: a new one under `results`, or `resume`'s."""
    if resume is not None:
        if not (resume / "experiment.json").exists():
            raise LabError(f"{resume} is not an experiment result directory (no experiment.json)")
        return resume
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = results / exp.name / stamp
    n = 1
    while out.exists():
        n += 1
        out = results / exp.name / f"{stamp}-{n}"
    out.mkdir(parents=True)
    (out / "spec.yaml").write_text(yaml.safe_dump(exp.source, sort_keys=False))
    meta = {
        "name": exp.name,
        "description": exp.description,
        "scale": exp.scale,
        "settings": exp.settings,
        "factors": exp.factors,
    }
    (out / "experiment.json").write_text(json.dumps(meta, indent=1, default=str))
    return out


def run_experiment(exp: Experiment, out: Path, progress: Progress | None = None) -> Path:
    """Runs every run of `exp` into `out` (from [`prepare`]), skipping runs that finished."""
    runs = exp.runs()
    t0 = time.monotonic()
    done_now = 0
    for i, run in enumerate(runs):
        rdir = run_dir(out, run)
        record_path = rdir / "run.json"
        if record_path.exists() and json.loads(record_path.read_text()).get("status") == "ok":
            continue
        if rdir.exists():
            shutil.rmtree(rdir)
        if progress:
            elapsed = time.monotonic() - t0
            remaining = len(runs) - i
            eta = elapsed / done_now * remaining if done_now else float("nan")
            progress(i, len(runs), run.key, eta)
        try:
            record = run_once(run, rdir)
        except (LabError, OSError, subprocess.SubprocessError) as e:
            rdir.mkdir(parents=True, exist_ok=True)
            record = {
                "point": run.point.name,
                "rep": run.rep,
                "factors": run.point.factors,
                "settings": run.point.settings,
                "status": "failed",
                "error": str(e),
            }
        (rdir / "run.json").write_text(json.dumps(record, indent=1, default=str))
        done_now += 1
    if progress:
        progress(len(runs), len(runs), "done", 0.0)
    return out

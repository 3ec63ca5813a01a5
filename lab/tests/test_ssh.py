"""The SSH runner end to end: an SSH server of the test's own (asyncssh's)
inside a network namespace stands for a remote machine; the quick experiment
runs with its client and its middleware there, leaves the same files as a
local run, and its remote processes are sampled as local ones are."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import asyncssh
import pandas as pd
import psutil
import pytest
from counting import allowed_apart

from mwlab.analysis import clock_offsets, summarize
from mwlab.checks import run_checks
from mwlab.netns import Emulation, HostSpec
from mwlab.procs import started_mark, started_since, wait_port
from mwlab.report import noise_notes
from mwlab.results import read_windows
from mwlab.runner import prepare, run_experiment
from mwlab.spec import parse

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the remote host is a network namespace: needs root"
)

SERVER = Path(__file__).parent / "support" / "ssh_server.py"


def spec(ssh: dict | None) -> dict:
    doc = {
        "name": "remote",
        "topology": {"servers": 1, "middlewares": 1, "client_machines": 1, "threads": 1},
        "middleware": {"workers": 2},
        "factors": {"vcli": [2]},
        "run": {"duration": 2, "warmup": 1, "cooldown": 0, "repetitions": 1, "window_ms": 500},
    }
    if ssh:
        doc["hosts"] = {"emulation": "ssh", "ssh": ssh}
    return doc


def files(run: Path) -> set[str]:
    return {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and "logs" not in p.parts}


def test_a_remote_client_gives_the_same_files_as_a_local_one(tmp_path: Path):
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    host_key.write_private_key(str(tmp_path / "host_key"))
    client_key.write_private_key(str(tmp_path / "client_key"))
    client_key.write_public_key(str(tmp_path / "authorized_keys"))
    with Emulation([HostSpec("remote")]) as emu:
        addr = emu.addr("remote")
        server = subprocess.Popen(
            emu.wrap(
                "remote",
                [
                    sys.executable,
                    str(SERVER),
                    addr,
                    "2222",
                    str(tmp_path / "host_key"),
                    str(tmp_path / "authorized_keys"),
                ],
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(2222, host=addr, timeout=15)
            there = {
                "destination": f"root@{addr}:2222",
                "key": str(tmp_path / "client_key"),
                "known_hosts": None,
            }
            ssh = {"client0": there, "mw0": there}
            remote = parse(spec(ssh))
            remote.source = spec(ssh)
            mark = started_mark()
            out = run_experiment(remote, prepare(remote, tmp_path / "remote"))
            # Nothing started remotely outlives the run (the sampler, the
            # middleware, `timeout` around each): no process in the run's
            # remote directories (others' runs on this machine have theirs).
            works = {
                m.group(0)
                for s in started_since(mark)
                if " on " in s.name
                for a in s.cmd
                if (m := re.search(r"/tmp/mwlab-[^/\s]+", a))
            }
            assert works, [s.cmd for s in started_since(mark)]
            left = [
                p.info["cmdline"]
                for p in psutil.process_iter(["cmdline"])
                if any(w in a for a in p.info["cmdline"] or [] for w in works)
            ]
            assert not left, left
        finally:
            server.kill()
            server.wait()
    local = parse(spec(None))
    local.source = spec(None)
    here = run_experiment(local, prepare(local, tmp_path / "local"))
    run_r, run_l = out / "vcli=2" / "rep-1", here / "vcli=2" / "rep-1"
    record = json.loads((run_r / "run.json").read_text())
    assert record["status"] == "ok", record.get("error")
    client0 = record["placement"]["hosts"]["client0"]
    assert client0["addr"] == addr
    # One clock (the remote host is this machine): the offset is read to
    # within half the round trip that read it.
    assert abs(client0["clock_offset_ms"]) <= client0["clock_rtt_ms"] / 2 + 0.001, client0
    assert record["placement"]["processes"]["cl0"] == "client0"
    wanted = {"cl0/windows.jsonl", "cl0/summary.json", "mw0/windows.jsonl", "mw0/summary.json", "run.json"}
    assert wanted <= files(run_r)
    assert files(run_l) - {"links.csv", "qdisc.json"} <= files(run_r)
    for host in ("client0", "mw0"):
        assert record["placement"]["hosts"][host]["cores"] == os.cpu_count()
        assert record["placement"]["hosts"][host]["sampled"] is True
    assert record["placement"]["processes"]["mw0"] == "mw0"
    cpu = pd.read_csv(run_r / "cpu.csv")
    rows = set(zip(cpu["process"], cpu["thread"], strict=True))
    # The remote sampler's rows: each process, its thread classes, its host.
    assert {("cl0", "*"), ("cl0", "load"), ("mw0", "*"), ("mw0", "worker"), ("mw0", "net")} <= rows
    assert {("host:client0", "busy"), ("host:mw0", "busy"), ("host", "busy")} <= rows
    res = pd.read_csv(run_r / "resources.csv")
    assert {"cl0", "mw0", "host:client0", "host:mw0"} <= set(res["name"])
    assert res[res["name"] == "mw0"]["rss_mb"].max() > 1
    summary, aggregate = summarize(out)
    row = summary.iloc[0]
    assert row["status"] == "ok"
    # The remote processes' CPU, on this machine's clock (inside the clients'
    # span), per request and per thread class; not counted as this machine's.
    assert row["cpu_cl0_cores"] > 0 and row["cpu_mw0_cores"] > 0
    assert row["cpu_mw_worker_us"] > 0 and row["cpu_cl_load_us"] > 0
    assert 0 < row["host_util_client0"] <= 1.05 and row["cores_client0"] == os.cpu_count()
    assert row["cpu_host_mw0_us"] == pytest.approx(row["cpu_mw0_us"], rel=1e-6)
    names = {c.name for c in run_checks(summary, aggregate)}
    assert {"client0 CPU not saturated", "no interference on mw0"} <= names
    _, table = noise_notes(summary)
    assert {"client0 CPU busy", "others on mw0 (cores)"} <= set(table.columns)
    # One clock for both hosts: moved by its host's offset, each of the
    # middleware's windows starts where a client window starts (to within
    # the offset's uncertainty), and in those windows both counted the same
    # requests, but for those in flight at the two ends and those between
    # the two processes' collections of the end windows' counts (counting.py).
    offsets = clock_offsets(record)
    hosts = record["placement"]["hosts"]
    cl_all, mw_all = read_windows(run_r / "cl0"), read_windows(run_r / "mw0")
    clients = [w for w in cl_all if w["client"]["phase"] == "measure"]
    starts = {w["start_unix_ms"] - round(offsets["cl0"]): w["ops"]["all"]["count"] for w in clients}
    near = (hosts["client0"]["clock_rtt_ms"] + hosts["mw0"]["clock_rtt_ms"]) / 2 + 1
    matched, twins = {}, []
    for w in mw_all:
        start = w["start_unix_ms"] - round(offsets["mw0"])
        twin = [s for s in starts if abs(s - start) <= near]
        if twin:
            matched[twin[0]] = w["ops"]["all"]["count"]
            twins.append(w)
    assert set(matched) == set(starts), (sorted(starts), offsets)

    def edges(ws: list) -> tuple[int, int]:
        return ws[0]["start_unix_ms"], ws[-1]["start_unix_ms"] + ws[-1]["duration_ms"]

    allowed = allowed_apart(row["N"], cl_all, edges(clients), mw_all, edges(twins), clients + twins)
    assert abs(sum(matched.values()) - sum(starts.values())) <= allowed, (matched, starts, allowed)
    assert row["client_requests"] > 0
    logs = pd.Series(sorted(p.name for p in (run_r / "logs").iterdir()))
    assert "cl0.log" in set(logs), "the remote log is fetched"

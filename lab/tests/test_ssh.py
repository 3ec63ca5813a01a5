"""The SSH runner end to end: an SSH server of the test's own (asyncssh's)
inside a network namespace stands for a remote machine; the quick experiment
runs with its client there and leaves the same files as a local run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import asyncssh
import pandas as pd
import pytest

from mwlab.analysis import summarize
from mwlab.netns import Emulation, HostSpec
from mwlab.procs import wait_port
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
        "run": {"duration": 4, "warmup": 1, "cooldown": 0, "repetitions": 1, "window_ms": 500},
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
            ssh = {
                "client0": {
                    "destination": f"root@{addr}:2222",
                    "key": str(tmp_path / "client_key"),
                    "known_hosts": None,
                }
            }
            remote = parse(spec(ssh))
            remote.source = spec(ssh)
            out = run_experiment(remote, prepare(remote, tmp_path / "remote"))
        finally:
            server.kill()
            server.wait()
    local = parse(spec(None))
    local.source = spec(None)
    here = run_experiment(local, prepare(local, tmp_path / "local"))
    run_r, run_l = out / "vcli=2" / "rep-1", here / "vcli=2" / "rep-1"
    record = json.loads((run_r / "run.json").read_text())
    assert record["status"] == "ok", record.get("error")
    assert record["placement"]["hosts"]["client0"]["addr"] == addr
    assert abs(record["placement"]["hosts"]["client0"]["clock_offset_ms"]) < 50
    assert record["placement"]["processes"]["cl0"] == "client0"
    wanted = {"cl0/windows.jsonl", "cl0/summary.json", "mw0/windows.jsonl", "mw0/summary.json", "run.json"}
    assert wanted <= files(run_r)
    assert files(run_l) - {"links.csv", "qdisc.json"} <= files(run_r) | {"cpu.csv", "resources.csv"}
    summary, _ = summarize(out)
    row = summary.iloc[0]
    assert row["status"] == "ok"
    # The middleware's windows inside the clients' span cover a slightly
    # different stretch of time than the clients' own, and this machine is
    # shared: a wrong clock offset shows as windows outside the span (no
    # figure) or tens of per cent, not a few.
    assert abs(row["mw_tput"] - row["client_tput"]) / row["client_tput"] < 0.12, "one clock for both hosts"
    assert row["client_requests"] > 100
    logs = pd.Series(sorted(p.name for p in (run_r / "logs").iterdir()))
    assert "cl0.log" in set(logs), "the remote log is fetched"

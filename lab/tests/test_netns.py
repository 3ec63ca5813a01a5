"""Emulated hosts: namespaces, shaped links and CPU quotas are set up and
removed (also after the runner is killed), a shaped link carries its rate,
and the network-limit experiment saturates at the server's link."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from mwlab.netns import Emulation, HostSpec, clean_stale, netem_available
from mwlab.procs import LabError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (network namespaces, tc)")


def leftovers(tag: str) -> list[str]:
    """Namespaces, links and cgroups whose name contains `tag`."""
    found = [
        n
        for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        if tag in n
    ]
    found += [
        line
        for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
        if tag in line
    ]
    for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpuset")):
        if base.is_dir():
            found += [str(d) for d in base.glob(f"*{tag}*")]
    return found


def test_hosts_are_created_and_nothing_is_left_behind():
    hosts = [HostSpec("a", up_bps=50e6, down_bps=50e6, cpus=0.5), HostSpec("b", cpus="0")]
    with Emulation(hosts) as emu:
        tag = f"mwlab-{emu.id}-"
        assert len([n for n in leftovers(tag) if n.startswith("mwlab")]) == 2
        assert emu.addr("a") != emu.addr("b")
        out = subprocess.run(
            emu.wrap("a", ["ip", "-o", "addr", "show", "dev", "eth0"]), capture_output=True, text=True
        )
        assert emu.addr("a") in out.stdout
        assert any(emu.hosts["a"].cgroups) and any(emu.hosts["b"].cgroups)
        qdisc = subprocess.run(
            emu.wrap("a", ["tc", "qdisc", "show", "dev", "eth0"]), capture_output=True, text=True
        )
        assert "tbf" in qdisc.stdout and "50Mbit" in qdisc.stdout
        bridge = emu.bridge
    assert leftovers(tag) == []
    assert bridge not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_a_killed_runners_hosts_are_removed_by_the_next_run():
    script = (
        "import time\n"
        "from mwlab.netns import Emulation, HostSpec\n"
        "e = Emulation([HostSpec('x', 10e6, 10e6, 0.5), HostSpec('y')]).__enter__()\n"
        "print(e.id, e.bridge, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid, bridge = child.stdout.readline().split()
    tag = f"mwlab-{pid}-"
    assert len([n for n in leftovers(tag) if n.startswith("mwlab")]) == 2
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert leftovers(tag), "a killed runner cannot clean up"
    removed = clean_stale()
    assert any(tag in r for r in removed)
    assert leftovers(tag) == []
    assert bridge not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def _stream(emu: Emulation, src: str, dst: str, port: int, link: tuple[str, str]) -> float:
    """Bits per second `src` achieves sending to `dst` for 2 s, as `link`'s counters saw it."""
    receiver = subprocess.Popen(
        emu.wrap(
            dst,
            [
                sys.executable,
                "-c",
                "import socket\n"
                f"s = socket.socket(); s.bind(('{emu.addr(dst)}', {port})); s.listen(1)\n"
                "c, _ = s.accept()\n"
                "while c.recv(1 << 16): pass\n",
            ],
        )
    )
    time.sleep(0.5)
    sender = subprocess.Popen(
        emu.wrap(
            src,
            [
                sys.executable,
                "-c",
                "import socket, time\n"
                f"c = socket.create_connection(('{emu.addr(dst)}', {port}))\n"
                "end = time.time() + 3.5\n"
                "while time.time() < end: c.sendall(b'x' * 65536)\n",
            ],
        )
    )
    try:
        time.sleep(1.0)
        before, t0 = emu.link_counters()[link][0], time.monotonic()
        time.sleep(2.0)
        after, t1 = emu.link_counters()[link][0], time.monotonic()
        sender.wait(timeout=10)
    finally:
        for p in (sender, receiver):
            p.kill()
            p.wait()
    return (after - before) * 8 / (t1 - t0)


def test_a_shaped_link_carries_its_rate_in_each_direction():
    up, down = 50e6, 20e6
    with Emulation([HostSpec("vm", up_bps=up, down_bps=down), HostSpec("peer")]) as emu:
        sent = _stream(emu, "vm", "peer", 5001, ("vm", "up"))
        received = _stream(emu, "peer", "vm", 5002, ("vm", "down"))
    assert sent == pytest.approx(up, rel=0.05), f"{sent / 1e6:.1f} Mbit/s sent on a 50 Mbit/s uplink"
    assert received == pytest.approx(down, rel=0.05), f"{received / 1e6:.1f} Mbit/s on a 20 Mbit/s downlink"


def test_delay_needs_netem_and_says_so():
    if netem_available():
        with Emulation([HostSpec("d", delay_s=0.001)]) as emu:
            out = subprocess.run(
                emu.wrap("d", ["tc", "qdisc", "show", "dev", "eth0"]), capture_output=True, text=True
            )
            assert "netem" in out.stdout
    else:
        with pytest.raises(LabError, match="netem"):
            Emulation([HostSpec("d", delay_s=0.001)])


def test_the_network_limit_experiment_saturates_at_the_servers_link(tmp_path: Path):
    from mwlab.analysis import summarize
    from mwlab.cli import EXPERIMENTS
    from mwlab.render import write_report
    from mwlab.runner import prepare, run_experiment
    from mwlab.spec import load

    exp = load(EXPERIMENTS / "network-limit.yaml")
    out = run_experiment(exp, prepare(exp, tmp_path))
    summary, aggregate = summarize(out)
    write_report(out, summary, aggregate)
    assert (summary["status"] == "ok").all(), summary.get("error")
    model = pd.read_csv(out / "model.csv")
    top = aggregate.sort_values("N").iloc[-1]
    # The link's limit: its rate over the bytes of a reply on the wire.
    limit = top["link_server0_up_rate_mbit"] * 1e6 / 8 / top["link_server0_up_bytes_per_req"]
    assert top["client_tput"] == pytest.approx(limit, rel=0.10), (top["client_tput"], limit)
    assert top["link_server0_up_util"] > 0.9
    saturated = model[model["N"] == model["N"].max()].iloc[0]
    assert saturated["bottleneck"] == "link server0 sends"
    assert abs(saturated["x_error"]) < 0.10
    checks = pd.read_csv(out / "checks.csv")
    assert (checks["name"] == "emulated link not saturated").any()
    # The uplinks are shaped, the downlinks not (the seed's egress limits).
    down = "link_server0_down_rate_mbit"
    assert down not in aggregate or aggregate[down].isna().all()
    assert top["link_server0_up_overlimits"] > 0, "a saturated tbf holds packets back"
    assert "Emulated links" in (out / "report.html").read_text()
    assert leftovers(f"mwlab-{os.getpid()}-") == []


def test_the_generator_checks_fire_on_a_throttled_load_generator(tmp_path: Path):
    """Open loop at 4,000 requests/s: a healthy mwload keeps its schedule; the
    same load from a client host held to 3% of a core (a cgroup CPU quota)
    falls behind, and the run says the generator, not the system, limited it."""
    from mwlab.analysis import summarize
    from mwlab.checks import run_checks
    from mwlab.render import write_report
    from mwlab.runner import prepare, run_experiment
    from mwlab.spec import load

    verdicts = {}
    for name, cpus in (("healthy", None), ("throttled", 0.03)):
        spec = tmp_path / f"{name}.yaml"
        hosts = "" if cpus is None else f"hosts: {{emulation: netns, client_cpus: {cpus}}}\n"
        spec.write_text(
            f"name: gen-{name}\n"
            "topology: {servers: 1, middlewares: 0, threads: 1, virtual_clients: 4}\n"
            "workload: {ratio: '1:10', keys: 1000, value_size: 64, rate: 4000}\n"
            "run: {duration: 5, warmup: 1, cooldown: 0, repetitions: 1}\n" + hosts
        )
        exp = load(spec)
        out = run_experiment(exp, prepare(exp, tmp_path / name))
        summary, aggregate = summarize(out)
        assert (summary["status"] == "ok").all(), summary.get("error")
        checks = {c.name: c for c in run_checks(summary, aggregate)}
        verdicts[name] = (checks["load generator kept its schedule"], summary.iloc[0])
        write_report(out, summary, aggregate)
        assert (out / "plots" / "lateness.svg").exists() and "Send lateness" in (
            out / "report.html"
        ).read_text()
        verdicts[name + " gaps"] = checks["arrivals exponential"]
    healthy, h = verdicts["healthy"]
    throttled, t = verdicts["throttled"]
    assert healthy.ok, healthy.detail
    assert h["gen_rate_ratio"] > 0.95 and h["gen_late_share"] < 0.01
    assert not throttled.ok, throttled.detail
    assert t["gen_late_share"] > 0.05 or t["gen_rate_ratio"] < 0.95
    assert t["gen_late_p99_us"] > h["gen_late_p99_us"]
    # Measured here: A² 0.13 healthy; throttled 20 to 2,615 from run to run
    # (how far a 3% CPU quota bends the gaps varies; the check rejects above
    # 1.591). A healthy run may be rejected by design now and then, so the test
    # asks for A² well apart on each side rather than for the verdicts alone.
    assert h["gen_gap_ad"] < 10 * 1.321, verdicts["healthy gaps"].detail
    assert not verdicts["throttled gaps"].ok and t["gen_gap_ad"] > 4 * 1.591, verdicts[
        "throttled gaps"
    ].detail


def test_the_message_queue_system_on_emulated_hosts(tmp_path: Path):
    """PostgreSQL inside the database host's namespace on TCP, mwmq on a host
    with a CPU quota, clients on theirs; the links are centers of the model."""
    from mwlab.analysis import summarize
    from mwlab.render import write_report
    from mwlab.runner import prepare, run_experiment
    from mwlab.spec import parse

    spec = {
        "name": "mq-hosts",
        "system": "mq",
        "topology": {"middlewares": 1, "threads": 2, "virtual_clients": 2},
        "middleware": {"workers": 2, "db_pool": 2},
        "workload": {"ratio": "1:1", "value_size": 200, "receive": "pop"},
        "hosts": {"emulation": "netns", "server_link": "200mbit", "middleware_cpus": 1},
        "run": {"duration": 2, "warmup": 1, "cooldown": 0, "repetitions": 1, "window_ms": 500},
    }
    exp = parse(spec)
    exp.source = spec
    out = run_experiment(exp, prepare(exp, tmp_path))
    summary, aggregate = summarize(out)
    write_report(out, summary, aggregate)
    assert (summary["status"] == "ok").all(), summary.get("error")
    run = json.loads(next(out.glob("*/rep-1/run.json")).read_text())
    hosts = run["placement"]["hosts"]
    assert run["placement"]["processes"]["pg0"] == "server0" and "server0" in hosts
    assert aggregate["client_tput"].iloc[0] > 100
    util = pd.read_csv(out / "utilization.csv")
    assert {"link server0 sends", "link server0 receives", "CPU of mw0", "workers"} <= set(util["device"])
    assert leftovers(f"mwlab-{os.getpid()}-") == []


def test_a_delay_on_the_database_link_adds_its_round_trip(tmp_path: Path):
    """2 ms one-way on the database host's link: every statement's round trip
    takes 4 ms longer (netem where the kernel has it, a relay where not), the
    probe measures it, and the model counts it as a delay center."""
    from mwlab.analysis import summarize
    from mwlab.render import write_report
    from mwlab.runner import prepare, run_experiment
    from mwlab.spec import parse

    def run(name: str, link, client_link=None) -> tuple[pd.DataFrame, Path]:
        spec = {
            "name": name,
            "system": "mq",
            "topology": {"middlewares": 1, "threads": 1, "virtual_clients": 4},
            "middleware": {"workers": 4, "db_pool": 4},
            # SENDs only: one statement, one round trip to the database, each.
            "workload": {"ratio": "1:0", "value_size": 200, "pairs": False},
            "hosts": {"emulation": "netns", "server_link": link, "client_link": client_link},
            "run": {"duration": 4, "warmup": 1, "cooldown": 0, "repetitions": 1, "window_ms": 500},
        }
        exp = parse(spec)
        exp.source = spec
        out = run_experiment(exp, prepare(exp, tmp_path / name))
        summary, aggregate = summarize(out)
        write_report(out, summary, aggregate)
        assert (summary["status"] == "ok").all(), summary.get("error")
        return aggregate.iloc[0], out

    plain, _ = run("plain", "1gbit")
    # 2 ms on the database's link, 1 ms on the clients': +4 ms per statement,
    # +6 ms per request.
    delayed, out = run("delayed", {"delay": "2ms"}, {"delay": "1ms"})
    # A request's round trip through the database's link (PostgreSQL
    # answering an SSLRequest through the relay, against directly).
    record = json.loads(next(out.glob("*/rep-1/run.json")).read_text())["delay"]
    (db,) = [p for p in record["probes"] if p["what"].startswith("postgres ping from mw0")]
    assert db["expected_us"] == pytest.approx(4000)
    assert db["measured_us"] == pytest.approx(4000, rel=0.10), record["probes"]
    # mwmq's database time per statement and the clients' response time move
    # by the round trips: lower quartiles within 15% with release builds; the
    # debug builds `make test` runs add up to 0.9 ms more after a thread slept
    # 4 ms (a late wake-up in an unoptimized process), hence the bounds.
    added = delayed["mw_server_p25_us"] - plain["mw_server_p25_us"]
    assert 3600 <= added <= 5200, (plain["mw_server_p25_us"], delayed["mw_server_p25_us"])
    mean = delayed["mw_server_us"] - plain["mw_server_us"]
    assert 3600 <= mean <= 5600, (plain["mw_server_us"], delayed["mw_server_us"])
    client = delayed["client_rt_p25_us"] - plain["client_rt_p25_us"]
    assert 5400 <= client <= 7800, (plain["client_rt_p25_us"], delayed["client_rt_p25_us"])
    assert delayed["delay_rtt_us"] == pytest.approx(6000)
    # (10%, or 0.4 ms as for the database's 4-ms probe above: a 2-ms probe
    # measured 2.25 ms once in a clean-checkout run on the loaded machine.)
    probe = delayed["delay_probe_expected_us"]
    assert delayed["delay_probe_measured_us"] == pytest.approx(probe, rel=0.10, abs=400)
    checks = pd.read_csv(out / "checks.csv")
    assert checks[checks["name"] == "link delay as configured"]["ok"].all()
    util = pd.read_csv(out / "utilization.csv")
    assert "link delay" in set(util["device"])
    model = pd.read_csv(out / "model.csv")
    assert abs(model["r_error"].iloc[0]) < 0.25, model.to_dict("records")
    assert leftovers(f"mwlab-{os.getpid()}-") == []

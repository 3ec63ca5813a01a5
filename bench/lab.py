"""The lab's figures that its tests do not hold to a margin: how close the
emulated hosts, the load generator and the models come on this machine, now.

The tests (lab/tests) check what holds on any machine, however loaded: a
shaped link never carries more than its rate, a delay holds every round trip
at least its length, a throttled load generator falls further behind than an
unthrottled one. How near a link comes to its rate, how late an unthrottled
generator sends, how close a model's prediction comes: those depend on what
else the machine runs, so they are printed here, as figures, with the
machine's load beside them (docs/testing.md).

Usage: .venv/bin/python bench/lab.py [PART...]  (from the repository root)
  parts: link, network, generator, delay, predict, standby (default: all);
  link, network, generator and delay need root (network namespaces, tc).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from mwlab.analysis import summarize
from mwlab.cli import EXPERIMENTS
from mwlab.netns import Emulation, HostSpec, measure_link
from mwlab.render import write_report
from mwlab.runner import prepare, run_experiment
from mwlab.spec import parse

WORK = Path(tempfile.mkdtemp(prefix="mwlab-bench-"))


def run(spec: dict) -> tuple[Path, pd.DataFrame, pd.DataFrame]:
    """An experiment from a spec, analysed and reported."""
    exp = parse(spec)
    exp.source = spec
    out = run_experiment(exp, prepare(exp, WORK / spec["name"]))
    summary, aggregate = summarize(out)
    write_report(out, summary, aggregate)
    return out, summary, aggregate


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def link() -> None:
    """What a shaped link carries under a sender that offers more."""
    up, down = 50e6, 20e6
    with Emulation([HostSpec("vm", up_bps=up, down_bps=down), HostSpec("peer"), HostSpec("free")]) as emu:
        free = measure_link(emu, "free", "peer", 5000, ("free", "up"), 2.0)
        sent = measure_link(emu, "vm", "peer", 5001, ("vm", "up"), 2.0)
        received = measure_link(emu, "peer", "vm", 5002, ("vm", "down"), 2.0)
    print(f"link: unshaped {free.bps / 1e6:.0f} Mbit/s")
    for what, got, rate in (("uplink", sent, up), ("downlink", received, down)):
        print(
            f"link: {what} shaped to {rate / 1e6:.0f} Mbit/s carried {got.bps / 1e6:.2f} "
            f"({got.bps / rate:.1%}), {got.overlimits} packets held back"
        )


def network() -> None:
    """The network-limit experiment as it is: throughput against the link's limit."""
    doc = yaml.safe_load((EXPERIMENTS / "network-limit.yaml").read_text())
    out, _, aggregate = run(doc)
    model = pd.read_csv(out / "model.csv").set_index("N")
    for _, r in aggregate.sort_values("N").iterrows():
        limit = r["link_server0_up_rate_mbit"] * 1e6 / 8 / r["link_server0_up_bytes_per_req"]
        m = model.loc[r["N"]]
        print(
            f"network: N={r['N']:.0f} {r['client_tput']:.0f}/s of the link's {limit:.0f}/s "
            f"({r['client_tput'] / limit:.1%}), link busy {r['link_server0_up_util']:.1%}, "
            f"model X error {m['x_error']:+.1%}, bottleneck {m['bottleneck']}"
        )


def generator() -> None:
    """An unthrottled open-loop generator at 4,000 requests/s: how late it sends."""
    _, summary, _ = run(
        {
            "name": "bench-generator",
            "topology": {"servers": 1, "middlewares": 0, "threads": 1, "virtual_clients": 4},
            "workload": {"ratio": "1:10", "keys": 1000, "value_size": 64, "rate": 4000},
            "run": {"duration": 5, "warmup": 1, "cooldown": 0, "repetitions": 1},
        }
    )
    r = summary.iloc[0]
    print(
        f"generator: sent {r['gen_rate_ratio']:.1%} of 4000/s, {r['gen_late_share']:.1%} of sends over 1 ms "
        f"late, p99 lateness {r['gen_late_p99_us']:.0f} us, gaps' A² {r['gen_gap_ad']:.2f}"
    )


def delay() -> None:
    """2 ms on the database's link, 1 ms on the clients': what it adds against none."""
    rows = {}
    for name, server, client in (("plain", "1gbit", None), ("delayed", {"delay": "2ms"}, {"delay": "1ms"})):
        out, _, aggregate = run(
            {
                "name": f"bench-delay-{name}",
                "system": "mq",
                "topology": {"middlewares": 1, "threads": 1, "virtual_clients": 4},
                "middleware": {"workers": 4, "db_pool": 4},
                "workload": {"ratio": "1:0", "value_size": 200, "pairs": False},
                "hosts": {"emulation": "netns", "server_link": server, "client_link": client},
                "run": {"duration": 4, "warmup": 1, "cooldown": 0, "repetitions": 1, "window_ms": 500},
            }
        )
        rows[name] = aggregate.iloc[0]
    plain, delayed = rows["plain"], rows["delayed"]
    record = json.loads(next(out.glob("*/rep-1/run.json")).read_text())["delay"]
    for p in record["probes"]:
        print(f"delay: {p['what']}: {p['measured_us']:.0f} us, configured {p['expected_us']:.0f}")
    for col, what, want in (
        ("mw_server_p25_us", "database time per statement", 4000),
        ("client_rt_p25_us", "response time", 6000),
    ):
        added = delayed[col] - plain[col]
        print(f"delay: lower quartile of the {what} +{added:.0f} us (configured +{want})")
    model = pd.read_csv(out / "model.csv")
    print(f"delay: model's response time error {model['r_error'].iloc[0]:+.1%}")


def predict() -> None:
    """Calibrated on N = 1 and 4, the prediction of the measured N = 2."""
    out, _, _ = run(
        {
            "name": "bench-predict",
            "topology": {"servers": 2, "middlewares": 1, "virtual_clients": 1},
            "middleware": {"workers": 2},
            "factors": {"tcli": [1, 2, 4]},
            "run": {"duration": 5, "warmup": 1, "cooldown": 0, "repetitions": 1, "window_ms": 500},
        }
    )
    r = pd.read_csv(out / "predictions.csv").iloc[0]
    print(
        f"predict: N=2 X {r['X measured (ops/s)']:.0f}/s measured, {r['X predicted (ops/s)']:.0f} "
        f"predicted ({r['X error']:+.1%}); R error {r['R error']:+.1%}; covered {r['covered']}"
    )


def standby() -> None:
    """What a synchronous standby adds to each statement's database time."""
    _, summary, _ = run(
        {
            "name": "bench-standby",
            "system": "mq",
            "topology": {"middlewares": 1, "threads": 2},
            "middleware": {"engine": "async", "threads": 1},
            "workload": {"ratio": "1:0", "value_size": 200},
            "factors": {"standby": [0, 1], "vcli": [4]},
            "run": {"duration": 4, "warmup": 1, "cooldown": 0, "repetitions": 1, "window_ms": 500},
        }
    )
    rows = {int(r["standby"]): r for _, r in summary.iterrows()}
    print(
        f"standby: database time p25 {rows[0]['mw_server_p25_us']:.0f} us alone, "
        f"{rows[1]['mw_server_p25_us']:.0f} us with a synchronous standby "
        f"(flush lag {rows[1]['standby_lag_us']:.0f} us)"
    )


PARTS = {"link": link, "network": network, "generator": generator, "delay": delay}
PARTS |= {"predict": predict, "standby": standby}
ROOT = {"link", "network", "generator", "delay"}


def main(argv: list[str]) -> int:
    names = argv or list(PARTS)
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        print(f"unknown part(s): {', '.join(unknown)}; parts: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    for name in names:
        if name in ROOT and os.geteuid() != 0:
            print(f"{name}: skipped (needs root)")
            continue
        print(f"{name}: ({load()})")
        PARTS[name]()
    print(f"(results in {WORK})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

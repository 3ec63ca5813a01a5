"""`mwlab model ...`: the models on the command line. With `--json` every
command prints exactly one JSON object (a stable interface for scripts)."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

from mwlab.display import json_text
from mwlab.models import ModelError
from mwlab.models.factorial import analyze
from mwlab.models.laws import Center, bounds
from mwlab.models.mva import mva, schweitzer
from mwlab.models.queues import mg1, mm1, mmm, mmmb


def parse_center(text: str) -> Center:
    """NAME=DEMAND[:queue|delay|multi:M]."""
    if "=" not in text:
        raise ModelError(f"center {text!r}: expected NAME=DEMAND[:queue|delay|multi:M]")
    name, rest = text.split("=", 1)
    parts = rest.split(":")
    try:
        demand = float(parts[0])
    except ValueError as e:
        raise ModelError(f"center {text!r}: demand {parts[0]!r} is not a number") from e
    kind = parts[1] if len(parts) > 1 else "queue"
    servers = 1
    if kind == "multi":
        if len(parts) != 3 or not parts[2].isdigit():
            raise ModelError(f"center {text!r}: a multi-server center is NAME=DEMAND:multi:M")
        servers = int(parts[2])
    elif len(parts) > 2:
        raise ModelError(f"center {text!r}: only multi takes a server count")
    return Center(name, demand, kind, servers)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="queueing models: mva, bounds, mm1, mmm, mmmb, mg1, factorial")
    msub = p.add_subparsers(dest="model", required=True)
    for name in ("mva", "bounds"):
        q = msub.add_parser(name, help="closed network: " + ("MVA" if name == "mva" else "bounds and knee"))
        q.add_argument(
            "--center",
            action="append",
            required=True,
            metavar="NAME=DEMAND[:queue|delay|multi:M]",
            help="a service center; demands in seconds per request",
        )
        q.add_argument("--think", type=float, default=0.0, help="think time Z in seconds")
        q.add_argument("--users", type=int, required=True, help="population N")
        if name == "mva":
            q.add_argument("--approx", action="store_true", help="Schweitzer's approximate MVA")
        q.add_argument("--json", action="store_true")
    for name in ("mm1", "mmm", "mmmb", "mg1"):
        q = msub.add_parser(name, help=f"single queue {name.upper()}")
        q.add_argument("--arrival-rate", type=float, required=True)
        q.add_argument("--service-rate", type=float, required=True, help="per server")
        q.add_argument("--servers", type=int, default=1)
        q.add_argument("--capacity", type=int, help="M/M/m/B: jobs the system holds")
        q.add_argument("--scv", type=float, default=1.0, help="M/G/1: squared coefficient of variation")
        q.add_argument("--json", action="store_true")
    q = msub.add_parser("factorial", help="2^k r factorial analysis of a CSV file")
    q.add_argument("file")
    q.add_argument("--response", required=True, help="the column observed; every other column is a factor")
    q.add_argument("--confidence", type=float, default=0.90)
    q.add_argument("--json", action="store_true")


def _factorial(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.file)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or args.response not in reader.fieldnames:
            raise ModelError(f"{path}: no column {args.response!r}")
        names = [c for c in reader.fieldnames if c != args.response]
        rows, y = [], []
        for i, row in enumerate(reader, start=2):
            try:
                y.append(float(row[args.response]))
            except ValueError as e:
                raise ModelError(
                    f"{path}:{i}: {args.response} = {row[args.response]!r} is not a number"
                ) from e
            rows.append(tuple(row[n] for n in names))
    return analyze(names, rows, y, args.confidence).to_dict()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The chosen model's result as a JSON-ready dict."""
    m = args.model
    if m in ("mva", "bounds"):
        centers = [parse_center(c) for c in args.center]
        if m == "bounds":
            return bounds(centers, args.think, args.users).__dict__
        solve = schweitzer if args.approx else mva
        return solve(centers, args.think, args.users).to_dict()
    if m == "factorial":
        return _factorial(args)
    lam, mu = args.arrival_rate, args.service_rate
    if m == "mm1":
        res = mm1(lam, mu)
    elif m == "mmm":
        res = mmm(lam, mu, args.servers)
    elif m == "mmmb":
        if args.capacity is None:
            raise ModelError("mmmb needs --capacity B")
        res = mmmb(lam, mu, args.servers, args.capacity)
    else:
        res = mg1(lam, mu, args.scv)
    return {k: v for k, v in res.to_dict().items() if v is not None}


def _human(args: argparse.Namespace, result: dict[str, Any]) -> str:
    if args.model in ("mva",):
        lines = [f"{'N':>5}{'X':>14}{'R':>14}"]
        for n, x, r in zip(result["users"], result["throughput"], result["response_time"], strict=True):
            lines.append(f"{n:>5}{x:>14.6g}{r:>14.6g}")
        last = len(result["users"]) - 1
        lines.append("")
        lines.append(f"{'center':<12}{'U':>10}{'Q':>10}{'R_k':>12}   (at N={result['users'][last]})")
        for name, c in result["centers"].items():
            lines.append(
                f"{name:<12}{c['utilization'][last]:>10.4f}{c['queue_length'][last]:>10.4f}"
                f"{c['residence_time'][last]:>12.6g}"
            )
        return "\n".join(lines)
    if args.model == "factorial":
        lines = ["factors: " + ", ".join(f"{k}={v}" for k, v in result["factors"].items())]
        lines.append(
            f"{'effect':<8}{'value':>12}{'variation':>12}  {int(result['confidence'] * 100)}% interval"
        )
        for name, q in result["effects"].items():
            var = result["variation"].get(name)
            ci = result["ci"].get(name) if result["ci"] else None
            lines.append(
                f"{name:<8}{q:>12.4g}{'' if var is None else f'{var:>11.1%}':>12}  "
                + (f"({ci[0]:.4g}, {ci[1]:.4g})" if ci else "-")
            )
        lines.append(f"{'error':<8}{'':>12}{result['variation']['error']:>11.1%}")
        return "\n".join(lines)
    return "\n".join(f"{k:<24}{v}" for k, v in result.items())


def main(args: argparse.Namespace) -> int:
    try:
        result = run(args)
    except (ModelError, OSError) as e:
        if getattr(args, "json", False):
            print(json_text({"error": str(e)}))
        print(f"mwlab model: {e}", file=sys.stderr)
        return 2
    print(json_text(result) if args.json else _human(args, result))
    return 0

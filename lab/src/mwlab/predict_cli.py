"""`mwlab predict DIR`: throughput, response time and bottleneck for
populations and configurations a result did not measure. With `--json` it
prints exactly one JSON value: a list of predicted points, or an object with
`error`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from mwlab.analysis import read_experiment, summarize
from mwlab.nearest import predict
from mwlab.predict import PredictError, Prediction, parse_changes
from mwlab.procs import LabError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="predict throughput, response time and the bottleneck where nothing was measured",
    )
    p.add_argument("result", help="a result directory of `mwlab run`")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a configuration change: a spec key or seed alias (tmw=8, nsvr=4, nmw=2, "
        "middleware.replication=3, workload.value_size=4096); repeatable",
    )
    p.add_argument(
        "--clients", metavar="N1,N2,...", help="total clients N (as in model.csv); default: those measured"
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of predicted points")


def _clients(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        ns = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PredictError(
            f"--clients {text!r}: expected whole numbers separated by commas, e.g. 8,16,64"
        ) from None
    if not ns or any(n < 1 for n in ns):
        raise PredictError(f"--clients {text!r}: every population must be at least 1")
    return ns


def aggregate_of(result: Path) -> pd.DataFrame:
    """The per-point table of a result (aggregate.csv, computed when missing)."""
    read_experiment(result)  # a clear message for a directory that is not a result
    path = result / "aggregate.csv"
    return pd.read_csv(path) if path.is_file() else summarize(result)[1]


def _human(preds: list[Prediction]) -> str:
    lines = []
    last = None
    for p in preds:
        config = ", ".join(f"{k}={v}" for k, v in p.config.items()) or "(as measured)"
        if config != last:
            if lines:
                lines.append("")
            lines.append(f"{config}   (calibrated on {p.basis})")
            same = [q for q in preds if q.config == p.config]
            for note in dict.fromkeys(n for q in same for n in q.notes if not _bound_note(n)):
                lines.append(f"  note: {note}")
            bound = _bounds_line(same)
            if bound:
                lines.append(f"  note: {bound}")
            lines.append(
                f"  {'N':>5} {'ops/s':>10} {'90% interval':>21} {'R ms':>8} {'90% interval':>17} "
                f"{'p50 ms':>8} {'p99 ms':>8} {'p99 90% interval':>17}  bottleneck"
            )
            last = config
        p99 = "" if math.isnan(p.p99_us) else f"{p.p99_us / 1e3:.3f}"
        p50 = "" if math.isnan(p.p50_us) else f"{p.p50_us / 1e3:.3f}"
        xi = (
            ""
            if math.isnan(p.x_lo)
            else f"{p.x_lo:,.0f} .. {p.x_hi:,.0f}" + ("*" if "x" in p.clipped else " ")
        )
        ri = (
            ""
            if math.isnan(p.r_lo)
            else f"{p.r_lo / 1e3:.3f} .. {p.r_hi / 1e3:.3f}" + ("*" if "r" in p.clipped else " ")
        )
        qi = "" if math.isnan(p.p99_lo) else f"{p.p99_lo / 1e3:.3f} .. {p.p99_hi / 1e3:.3f}"
        lines.append(
            f"  {p.n:>5} {p.x:>10,.0f} {xi:>21} {p.r_us / 1e3:>8.3f} {ri:>17} {p50:>8} {p99:>8} {qi:>17}"
            f"  {p.bottleneck}"
        )
    if preds:
        lines.append("")
        lines.append(
            "Intervals: 90%, from the run-to-run noise, the calibration points' noise carried through "
            "the model, the demand curves' own error and 10% per doubling a rule carries them; "
            "* where the operational bounds of the lightest demands measured clip them "
            "(--json: x_lo x_hi r_lo r_hi, uncertainty, bounds)."
        )
    return "\n".join(lines)


def _bound_note(note: str) -> bool:
    return note.startswith(("X's interval ends at", "R's interval starts at"))


def _bounds_line(preds: list[Prediction]) -> str:
    """One line for a configuration's bounds: the throughput bound and what
    gives it, at each population where it clipped an interval."""
    hit = [p for p in preds if p.clipped and p.bounds is not None]
    if not hit:
        return ""
    parts = ", ".join(f"N={p.n}: X <= {p.bounds.x_top:,.0f}" for p in hit)
    return f"* clipped by the bounds ({hit[0].bounds.limit()}; R >= N / X_max): {parts}"


def main(args: argparse.Namespace) -> int:
    try:
        result = Path(args.result)
        if not result.is_dir():
            raise LabError(f"{result}: no such result directory")
        preds = predict(
            aggregate_of(result), read_experiment(result), parse_changes(args.set), _clients(args.clients)
        )
    except (PredictError, LabError, OSError) as e:
        if args.json:
            print(json.dumps({"error": str(e)}))
        print(f"mwlab predict: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([p.to_dict() for p in preds], default=lambda v: None if v != v else v))
    else:
        print(_human(preds))
    return 0

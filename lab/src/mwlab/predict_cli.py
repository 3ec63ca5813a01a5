"""`mwlab predict DIR`: throughput, response time and bottleneck for
populations and configurations a result did not measure. With `--json` it
prints exactly one JSON value: a list of predicted points, or an object with
`error`."""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import pandas as pd

from mwlab.analysis import compute_tables, read_experiment
from mwlab.display import json_text
from mwlab.drift import TRANSFER, Against, DriftError, Ratio, against, ratio
from mwlab.nearest import predict
from mwlab.predict import PredictError, Prediction, parse_changes, unusable
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
    p.add_argument(
        "--against",
        metavar="RESULT",
        help="carry the predictions to RESULT's machine state by the two results' reference points, "
        "and set them beside RESULT's measured points",
    )


def _clients(text: str | None) -> list[int] | None:
    if text is None:
        return None
    parts = [v.strip() for v in text.split(",") if v.strip()]
    if not all(re.fullmatch(r"[0-9]+", v) for v in parts):
        raise PredictError(f"--clients {text!r}: expected whole numbers separated by commas, e.g. 8,16,64")
    ns = [int(v) for v in parts]
    if not ns or any(n < 1 for n in ns):
        raise PredictError(f"--clients {text!r}: every population must be at least 1")
    return ns


def aggregate_of(result: Path) -> pd.DataFrame:
    """The per-point table of a result (aggregate.csv, computed when missing)."""
    read_experiment(result)  # a clear message for a directory that is not a result
    path = result / "aggregate.csv"
    # Computed in memory where missing: reading a result never writes into it.
    if not path.is_file():
        return compute_tables(result)[1]
    try:
        agg = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise LabError(
            f"{path} is damaged ({str(e).strip().splitlines()[0]}): `mwlab analyze {result}` "
            "writes it again from the runs"
        ) from None
    if "N" not in agg or "client_tput" not in agg:
        raise LabError(f"{path} has no N or client_tput column: `mwlab analyze {result}` writes it again")
    return agg


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
        xi, ri = _x_text(p), _r_text(p)
        qi = _interval_text(p.p99_lo, p.p99_hi, p.p99_us, 1e-3, "{:.3f}")
        lines.append(
            f"  {p.n:>5} {p.x:>10,.0f} {xi:>21} {p.r_us / 1e3:>8.3f} {ri:>17} {p50:>8} {p99:>8} {qi:>17}"
            f"  {p.bottleneck}"
        )
    if preds:
        lines.append("")
        lines.append(
            "Intervals: 90%, from the run-to-run noise, the calibration points' noise carried through "
            "the model, the demand curves' own error and 10% per doubling a rule carries them; "
            "* where the operational bounds of the lightest demands measured (each less its 90% noise) "
            "clip them. N: the clients in total (each load generator's connections x vcli, added up) "
            "(--json: x_lo x_hi r_lo r_hi, uncertainty, bounds)."
        )
    return "\n".join(lines)


# An interval reaching past this many times its prediction says nothing a
# number would: it is printed as unbounded on that side.
UNBOUNDED = 100.0


def _interval_text(lo: float, hi: float, value: float, scale: float, fmt: str, mark: str = "") -> str:
    """An interval as text: "lo .. hi", a side past UNBOUNDED times the
    prediction as "0" or "unbounded", a "*" on the end a bound moved (`mark`
    "lo" or "hi"; a space keeps the columns when none did)."""
    if math.isnan(lo) or math.isnan(hi):
        return ""
    low = "0" if value > 0 and lo < value / UNBOUNDED else fmt.format(lo * scale)
    high = "unbounded" if value > 0 and hi > value * UNBOUNDED else fmt.format(hi * scale)
    if mark == "lo":
        return f"{low}* .. {high} "
    return f"{low} .. {high}" + ("*" if mark == "hi" else " ")


def _x_text(p: Prediction) -> str:
    return _interval_text(p.x_lo, p.x_hi, p.x, 1.0, "{:,.0f}", "hi" if "x" in p.clipped else "")


def _r_text(p: Prediction) -> str:
    # R is bounded from below: the mark goes on its lower end.
    return _interval_text(p.r_lo, p.r_hi, p.r_us, 1e-3, "{:.3f}", "lo" if "r" in p.clipped else "")


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
        agg = aggregate_of(result)
        preds = predict(agg, read_experiment(result), parse_changes(args.set), _clients(args.clients))
        for why in unusable(agg):
            print(f"mwlab predict: left out: {why}", file=sys.stderr)
        if args.against:
            return _against(args, result, preds)
    except BrokenPipeError:
        raise  # the reader went away: `mwlab` ends quietly, as for every command
    except (PredictError, LabError, OSError, DriftError) as e:
        if args.json:
            print(json_text({"error": str(e)}))
        print(f"mwlab predict: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json_text([p.to_dict() for p in preds]))
    else:
        print(_human(preds))
    return 0


def _against(args: argparse.Namespace, a: Path, preds: list[Prediction]) -> int:
    """`--against B`: the predictions carried to B's machine, beside B's measurements."""
    b = Path(args.against)
    if not b.is_dir():
        raise LabError(f"{b}: no such result directory")
    if b.resolve() == a.resolve():
        raise LabError(f"--against {b}: that is the result predicted from; name another one to carry to")
    rho = ratio(a, b)
    rows = against(preds, rho, read_experiment(a), aggregate_of(b), read_experiment(b))
    if args.json:
        out = []
        for r in rows:
            d = r.carried.to_dict()
            d["reference_ratio"] = {"value": rho.value, "lo": rho.lo, "hi": rho.hi, "sigma": rho.sigma}
            d["unscaled"] = {k: getattr(r.unscaled, k) for k in ("x", "x_lo", "x_hi", "r_us", "r_lo", "r_hi")}
            d["measured"] = {"x": r.x, "r_us": r.r_us} if r.measured else None
            d["covered"] = r.covered if r.measured else None
            d["unscaled_covered"] = r.unscaled_covered if r.measured else None
            out.append(d)
        print(json_text(out))
    else:
        print(against_text(rows, rho, a, b))
    return 0


def against_text(rows: list[Against], rho: Ratio, a: Path, b: Path) -> str:
    """The table of `predict A --against B`."""
    lines = [
        f"A: {a}",
        f"B: {b}",
        "reference: " + rho.text(),
        f"Predictions calibrated on A, carried to B: X x {rho.value:.3f}, R / {rho.value:.3f}, intervals "
        f"widened by the ratio's uncertainty and {TRANSFER:.0%} for carrying it to another system.",
    ]
    last = None
    for r in rows:
        p, u = r.carried, r.unscaled
        config = ", ".join(f"{k}={v}" for k, v in p.config.items()) or "(as measured)"
        if config != last:
            lines += ["", f"{config}   (calibrated on {p.basis})"]
            lines.append(
                f"  {'N':>5} {'ops/s':>9} {'90% interval':>19} {'B ops/s':>9} {'R ms':>7} "
                f"{'90% interval':>15} {'B R ms':>7}  covered  unscaled: {'ops/s':>9} {'90% interval':>19}"
                "  covered"
            )
            last = config
        bx = f"{r.x:,.0f}" if r.measured else "-"
        br = f"{r.r_us / 1e3:.3f}" if r.measured else "-"
        cov = ("yes" if r.covered else "no") if r.measured else "-"
        ucov = ("yes" if r.unscaled_covered else "no") if r.measured else "-"
        lines.append(
            f"  {p.n:>5} {p.x:>9,.0f} {_x_text(p):>19} {bx:>9} {p.r_us / 1e3:>7.3f} "
            f"{_r_text(p):>15} {br:>7}  {cov:>7}            "
            f"{u.x:>9,.0f} {_x_text(u):>19}  {ucov:>7}"
        )
    measured = [r for r in rows if r.measured]
    lines.append("")
    if measured:
        carried, unscaled = sum(r.covered for r in measured), sum(r.unscaled_covered for r in measured)
        lines.append(
            f"B measured {len(measured)} of these points: {carried} covered carried, {unscaled} covered "
            "unscaled (both X and R inside the 90% intervals)."
        )
    else:
        lines.append("B measured none of these points (same configuration and N).")
    return "\n".join(lines)

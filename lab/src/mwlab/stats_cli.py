"""`mwlab stats`: the trust checks of `mwlab.stats` on any CSV column.

mwlab stats warmup FILE.csv --column C [--json]
mwlab stats ci FILE.csv --column C [--confidence 0.95] [--percentile P] [--independent] [--json]
mwlab stats stationarity FILE.csv --column C [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from mwlab import stats


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="trust checks on a CSV column: warmup, ci, stationarity")
    ssub = p.add_subparsers(dest="stat", required=True)
    for name, text in (
        ("warmup", "warm-up cut (MSER-5, accepted where the rows cut differ): the first row to keep"),
        ("ci", "confidence interval of the mean (batch means) or of a percentile (order statistics)"),
        ("stationarity", "KPSS and ADF tests, and a Mann-Kendall trend test, on the column"),
    ):
        q = ssub.add_parser(name, help=text)
        q.add_argument("file", help="a CSV file with a header row")
        q.add_argument("--column", required=True, help="the column to analyse, in row order")
        q.add_argument("--json", action="store_true", help="print JSON instead of a line of text")
        if name == "ci":
            q.add_argument("--confidence", type=float, default=0.95, help="confidence level (default 0.95)")
            q.add_argument("--percentile", type=float, help="a percentile (e.g. 99) instead of the mean")
            q.add_argument(
                "--independent",
                action="store_true",
                help="the rows are independent (repetitions): Student-t / plain order statistics",
            )


class StatsError(Exception):
    pass


def _column(path: str, column: str) -> list[float]:
    try:
        df = pd.read_csv(Path(path))
    except FileNotFoundError:
        raise StatsError(f"no such file: {path}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise StatsError(f"{path} is not a CSV file with a header row: {e}") from None
    if column not in df.columns:
        raise StatsError(f"{path} has no column {column!r}; it has: {', '.join(map(str, df.columns))}")
    values = pd.to_numeric(df[column], errors="coerce")
    if values.isna().all():
        raise StatsError(f"column {column!r} of {path} has no numbers")
    return [float(v) for v in values if not math.isnan(v)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    values = _column(args.file, args.column)
    if args.stat == "warmup":
        w = stats.warmup(values)
        kept = values[w.cut :]
        return {
            "cut": w.cut,
            "mser5_cut": w.mser_cut,
            "p": w.p,
            "judged": w.judged,
            "rows": len(values),
            "kept": len(kept),
            "mean_all": sum(values) / len(values),
            "mean_kept": sum(kept) / len(kept) if kept else float("nan"),
            "method": w.method,
        }
    if args.stat == "ci":
        if not 0 < args.confidence < 1:
            raise StatsError(f"--confidence must be between 0 and 1, not {args.confidence}")
        if args.percentile is not None:
            if not 0 < args.percentile < 100:
                raise StatsError(f"--percentile must be between 0 and 100, not {args.percentile}")
            iv = stats.percentile_ci(
                values, args.percentile / 100, args.confidence, ordered=not args.independent
            )
        else:
            iv = stats.mean_ci(values, args.confidence, independent=args.independent)
        return iv.as_dict()
    st = stats.stationarity(values)
    tr = stats.trend(values)
    return {"stationarity": st.as_dict(), "trend": tr.as_dict(), "rows": len(values)}


def _text(args: argparse.Namespace, r: dict[str, Any]) -> str:
    if args.stat == "warmup":
        if not r["judged"]:
            return f"{r['method']}: nothing cut"
        why = (
            f" (MSER-5 would cut {r['mser5_cut']}, p = {r['p']:.2g})"
            if r["mser5_cut"] and not r["cut"]
            else ""
        )
        return (
            f"warm-up: cut the first {r['cut']} of {r['rows']} rows{why}; "
            f"mean {r['mean_all']:.6g} -> {r['mean_kept']:.6g} ({r['method']})"
        )
    if args.stat == "ci":
        what = f"p{args.percentile:g}" if args.percentile is not None else "mean"
        est = r.get("percentile", r.get("mean"))
        lo, hi = r["ci"]
        extra = f", batch size {r['batch_size']} x {r['batches']}" if r["method"] == "batch means" else ""
        if r["method"] == "order statistics":
            extra = f", effective n {r['effective_n']:.0f} of {r['n']}"
        return f"{what} {est:.6g}, {r['confidence']:.0%} CI [{lo:.6g}, {hi:.6g}] ({r['method']}{extra})"
    s, t = r["stationarity"], r["trend"]
    verdict = "stationary" if s["stationary"] and not t["trending"] else "NOT stationary"
    return (
        f"{verdict}: KPSS p={s['kpss_p']:.3g}, ADF p={s['adf_p']:.3g}; "
        f"trend tau={t['tau']:.3f} p={t['p']:.3g} over {r['rows']} rows"
    )


def main(args: argparse.Namespace) -> int:
    try:
        r = run(args)
    except StatsError as e:
        print(f"mwlab stats: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r, allow_nan=True) if args.json else _text(args, r))
    return 0

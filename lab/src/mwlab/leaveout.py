"""Leave one out: every measured point of a result, left out in turn and
predicted from the rest, against its 90% intervals (the report's
Predictions section, `leave-one-out.csv`).

A point whose configuration has other measured populations is predicted
from that configuration's calibration on them (an end point is an
extrapolation in N, an inner one an interpolation); a configuration
measured at one population only is predicted from the nearest other
measured configuration(s), as `mwlab predict` would ([`mwlab.nearest`]). A
point is *covered* when its measured throughput and mean response time both
lie inside their intervals; at the stated 90% (two figures that move
together) at least 85% should be.

Each point of a result is a mean over its repetitions, and the noise that
widens an interval is the noise floor of the configuration measured in the
same run (`mwlab.noise`); a point left out keeps the repetitions it had.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from mwlab.fit import num
from mwlab.nearest import predict_at, widened
from mwlab.predict import (
    Calibration,
    PredictError,
    Prediction,
    calibrate,
    configurations,
    on_machine,
    predict_one,
    unusable,
)
from mwlab.spec import ExperimentInfo

# At least this share of the points should be covered by their 90% intervals.
COVERAGE_GOAL = 0.85


@dataclass
class LeaveOneOut:
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    covered: int = 0
    # Points that could not be predicted from the rest, with the reason.
    refused: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.covered / len(self.table) if len(self.table) else float("nan")

    @property
    def meets_goal(self) -> bool:
        return len(self.table) > 0 and self.share >= COVERAGE_GOAL


def _bound_text(p: Prediction) -> str:
    if not p.clipped or p.bounds is None:
        return ""
    parts = []
    if "x" in p.clipped:
        parts.append(f"X <= {p.bounds.x_top:,.0f} ({p.bounds.limit()})")
    if "r" in p.clipped:
        parts.append(f"R >= {p.bounds.r_floor / 1e3:.3f} ms")
    return "; ".join(parts)


def against_measured(p: Prediction, measured: pd.Series) -> dict:
    """A prediction beside the point it predicts: both figures measured and
    predicted, the errors, the 90% intervals and whether they cover it (the
    columns every check of predictions shares)."""
    x, r = num(measured, "client_tput"), num(measured, "client_rt_mean_us")
    return {
        "X measured (ops/s)": x,
        "X predicted (ops/s)": p.x,
        "X error": (p.x - x) / x if x else math.nan,
        "X 90% interval": f"{p.x_lo:,.0f} .. {p.x_hi:,.0f}",
        "R measured (ms)": r / 1e3,
        "R predicted (ms)": p.r_us / 1e3,
        "R error": (p.r_us - r) / r if r else math.nan,
        "R 90% interval (ms)": f"{p.r_lo / 1e3:.3f} .. {p.r_hi / 1e3:.3f}",
        "covered": "yes" if p.covers(x, r) else "no",
    }


def row_of(label: str, basis: str, p: Prediction, measured: pd.Series) -> dict:
    """One line of the table: the point, what predicted it, the figures
    against the measurement, the half-width and the bound that bound it."""
    return {
        "configuration": label or "(the only one)",
        "N": p.n,
        "calibrated on": basis,
        **against_measured(p, measured),
        "X half-width": (p.x_hi - p.x_lo) / 2 / p.x if p.x else math.nan,
        "bound": _bound_text(p),
    }


def leave_one_out(agg: pd.DataFrame, info: ExperimentInfo) -> LeaveOneOut:
    """Every point of `agg` predicted from the others."""
    out = LeaveOneOut(refused=unusable(agg))
    groups = configurations(agg, info)
    whole: dict[str, Calibration] = {}
    for label, members in groups.items():
        try:
            whole[label] = calibrate(members, info, label)
        except PredictError:
            continue
    rows = []
    for label, members in groups.items():
        for i, point in enumerate(members):
            n = int(num(point, "N"))
            rest = members[:i] + members[i + 1 :]
            try:
                if rest:
                    cal = calibrate(rest, info, label)
                    others = [c for lb, c in whole.items() if lb != label]
                    cal = on_machine(widened(cal, others), others)
                    used = ", ".join(str(int(num(r, "N"))) for r in sorted(rest, key=lambda r: num(r, "N")))
                    basis = f"{label or 'N'} at N = {used}" + (
                        f", shaped by {cal.borrowed}" if cal.borrowed else ""
                    )
                    p = predict_one(cal, n)
                else:
                    others = [c for lb, c in whole.items() if lb != label]
                    if not others:
                        raise PredictError("no other point measured")
                    levels = dict(whole[label].levels) if label in whole else {}
                    (p,) = predict_at(others, info, levels, [n])
                    basis = p.basis
            except PredictError as e:
                out.refused.append(f"{label or 'the point'} at N = {n}: {e}")
                continue
            if math.isnan(p.x_lo) or math.isnan(p.r_lo):
                out.refused.append(
                    f"{label or 'the point'} at N = {n}: no interval (the noise was not measured)"
                )
                continue
            rows.append(row_of(label, basis, p, point))
    out.table = pd.DataFrame(rows)
    if rows:
        out.covered = int((out.table["covered"] == "yes").sum())
    return out

"""The report's Predictions section: the lab's predictions checked on points
it did not calibrate on, and what-if curves for the next steps.

- **Held-out populations**: in each configuration with at least three
  populations, the demands are calibrated on every other population (the
  lowest and the highest always among them) and the others are predicted.
- **Held-out configurations**: for two configurations that differ in one
  setting with a rule (workers, servers, middlewares, replication), one
  calibrates and the other is predicted at every population it measured.
- Beside them, the seed reports' single queue: the service time from the
  run with the fewest clients, then M/M/1 at the measured arrival rate.
- **What if**: the configuration with the most populations, predicted with
  twice the clients, twice the workers, one more server and one more
  middleware (where the result has what each needs; otherwise the reason).

Errors are (predicted - measured) / measured; every prediction carries its
90% intervals (`mwlab.predict.uncertainty`) and a held-out point is
*covered* when both measured figures lie inside them. `predictions.csv`
holds every held-out row, `noise.csv` the noise floor per configuration
(`mwlab.noise`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mwlab.fit import bottleneck, devices, num, sweep_label
from mwlab.leaveout import LeaveOneOut, against_measured, leave_one_out
from mwlab.nearest import predict_at, widened
from mwlab.noise import noise_table
from mwlab.plots import save_figure, save_panels
from mwlab.predict import (
    STRUCTURAL,
    Calibration,
    PredictError,
    Prediction,
    calibrate,
    column,
    config_settings,
    configurations,
    on_machine,
    predict_one,
    seed_view,
    with_changes,
)
from mwlab.spec import ExperimentInfo, SpecError, canonical, factor_columns

X_GOAL, R_GOAL = 0.10, 0.15


@dataclass
class Predictions:
    """What the section shows."""

    heldout: pd.DataFrame = field(default_factory=pd.DataFrame)
    whatif: pd.DataFrame = field(default_factory=pd.DataFrame)
    refused: list[str] = field(default_factory=list)
    figure: Path | None = None
    x_worst: float = float("nan")
    r_worst: float = float("nan")
    within: int = 0
    bottleneck_agrees: int = 0
    # Held-out points whose measured X and R both lie in the 90% intervals.
    covered: int = 0
    # The run-to-run noise per configuration (noise.csv).
    noise_floor: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Predicted throughput and response time over the populations with their
    # 90% intervals, beside the measured points.
    surface: Path | None = None
    # What the two figures draw, computed by `compute_predictions` and drawn
    # (with their CSVs) by `write_predictions`.
    whatif_label: str = ""
    whatif_curves: list[tuple[str, list[int], list[float]]] = field(default_factory=list)
    surface_curves: list[tuple[str, list[Prediction], list[tuple[int, pd.Series]], list[Prediction]]] = field(
        default_factory=list
    )
    surface_rows: list[dict[str, Any]] = field(default_factory=list)
    # Every measured point predicted from the others (leave-one-out.csv).
    loo: LeaveOneOut = field(default_factory=LeaveOneOut)

    @property
    def empty(self) -> bool:
        return self.heldout.empty and self.whatif.empty and self.loo.table.empty


def _measured_bottleneck(row: pd.Series, info: ExperimentInfo) -> str:
    """The bottleneck the point's own measured demands name."""
    devs = devices(row, info.settings)
    return bottleneck(devs) if devs else ""


def _row(
    kind: str, calibrated: str, predicted_for: str, p, row: pd.Series, info: ExperimentInfo, seed
) -> dict:
    return {
        "check": kind,
        "calibrated on": calibrated,
        "predicted": predicted_for,
        "N": p.n,
        **against_measured(p, row),
        "bottleneck predicted": p.bottleneck,
        "bottleneck measured": _measured_bottleneck(row, info),
        "seed M/M/1 R": _seed_text(seed),
    }


def _seed_text(seed: dict | None) -> str:
    if not seed:
        return ""
    if math.isinf(seed["r_us"]):
        return f"unstable (ρ = {seed['rho']:.2f})"
    return f"{seed['r_us'] / 1e3:.3f} ms ({seed['r_error']:+.0%})"


def _held_out_populations(groups, cals: dict[str, Calibration], info) -> list[dict]:
    """Every other population of a configuration calibrates, the rest are
    predicted (shaped by another configuration where it measured them, as
    `mwlab predict` and the leave-one-out table do)."""
    rows = []
    for label, members in groups.items():
        ns = sorted({int(num(r, "N")) for r in members})
        if len(ns) < 3:
            continue
        calib = {ns[i] for i in range(0, len(ns), 2)} | {ns[-1]}
        try:
            cal = calibrate([r for r in members if int(num(r, "N")) in calib], info, label)
        except PredictError:
            continue
        seeds = {s["N"]: s for s in seed_view(members)}
        used = ", ".join(str(n) for n in sorted(calib))
        for r in members:
            n = int(num(r, "N"))
            if n in calib:
                continue
            others = [c for lb, c in cals.items() if lb != label]
            shaped = widened(cal, others)
            p = predict_one(on_machine(shaped, others), n)
            basis = f"{label or 'N'} at N = {used}" + (
                f", shaped by {shaped.borrowed}" if shaped.borrowed else ""
            )
            rows.append(_row("populations", basis, f"N = {n}", p, r, info, seeds.get(n)))
    return rows


def _one_change(a: Calibration, b: Calibration) -> str | None:
    """The one factor two configurations differ in, if it has a rule."""
    diff = [k for k in a.levels if a.levels.get(k) != b.levels.get(k)]
    if len(diff) != 1:
        return None
    try:
        key = canonical(diff[0])
    except SpecError:
        return None
    return diff[0] if key in STRUCTURAL else None


def _held_out_configurations(groups, cals: dict[str, Calibration], info) -> list[dict]:
    rows = []
    labels = list(cals)
    for i, la in enumerate(labels):
        for lb in labels[i + 1 :]:
            a, b = cals[la], cals[lb]
            factor = _one_change(a, b)
            if factor is None:
                continue
            for src, dst, dst_label in ((a, b, lb), (b, a, la)):
                seeds = {s["N"]: s for s in seed_view(groups[dst_label])}
                for r in groups[dst_label]:
                    n = int(num(r, "N"))
                    try:
                        near = on_machine(src, [c for c in cals.values() if c is not dst])
                        p = predict_one(near, n, dst.settings, dict(dst.levels))
                    except PredictError:
                        break
                    rows.append(_row(f"{factor}", src.sweep, dst.sweep, p, r, info, seeds.get(n)))
    return rows


WHATIF = (
    ("2 x workers", "middleware.workers", lambda s: s.middleware.workers * 2),
    ("+1 server", "topology.servers", lambda s: s.topology.servers + 1),
    ("+1 middleware", "topology.middlewares", lambda s: s.topology.middlewares + 1),
)


def _whatif(cals: list[Calibration], info: ExperimentInfo, pred: Predictions) -> None:
    """The what-if table and curves: the calibration with the most
    populations, predicted at twice its clients and with one change each."""
    if not cals:
        return
    base = max(cals, key=lambda c: (len(c.ns), c.ns[-1]))
    top = base.ns[-1]
    grid = sorted(set(base.ns) | {top * 2})
    rows = []

    def add(name: str, config: dict[str, Any]) -> None:
        try:
            preds = predict_at(cals, info, config, grid)
        except PredictError as e:
            pred.refused.append(f"{name}: {e}")
            return
        pred.whatif_curves.append((name, grid, [p.x for p in preds]))
        for p in (preds[grid.index(top)], preds[-1]):
            rows.append(
                {
                    "what if": name,
                    "N": p.n,
                    "X predicted (ops/s)": p.x,
                    "R predicted (ms)": p.r_us / 1e3,
                    "p99 predicted (ms)": p.p99_us / 1e3,
                    "bottleneck": p.bottleneck,
                    "calibrated on": p.basis,
                }
            )

    pred.whatif_label = base.sweep or "as measured"
    add(f"{pred.whatif_label} (2 x clients: N = {top * 2})", dict(base.levels))
    for name, key, change in WHATIF:
        value = change(base.settings)
        levels = with_changes(base.levels, {key: value})
        try:
            config_settings(info.settings, levels)
        except PredictError as e:
            pred.refused.append(f"{name}: {e}")
            continue
        add(f"{name} ({column(key)}={value})", levels)
    pred.whatif = pd.DataFrame(rows)


def _draw_whatif(pred: Predictions, out: Path) -> None:
    """predictions.svg and its data, plots/predictions.csv."""
    if not pred.whatif_curves:
        return

    def draw(ax):
        for name, ns, xs in pred.whatif_curves:
            ax.plot(ns, xs, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("clients N")
        ax.set_ylabel("predicted throughput (ops/s)")
        ax.set_title(f"What if (calibrated on {pred.whatif_label})")

    pred.figure = save_figure(out / "plots", "predictions", draw)[0]
    pd.DataFrame(
        [
            {"what if": name, "N": n, "X predicted (ops/s)": x}
            for name, ns, xs in pred.whatif_curves
            for n, x in zip(ns, xs, strict=True)
        ]
    ).to_csv(out / "plots" / "predictions.csv", index=False)


def spec_populations(info: ExperimentInfo) -> dict[str, set[int]]:
    """Per configuration, the populations (N) its spec covers, measured or
    not (a planned run measures some of them and predicts the others)."""
    out: dict[str, set[int]] = {}
    try:
        points = info.experiment().all_points()
    except SpecError:
        return out
    for p in points:
        label = sweep_label(pd.Series(factor_columns(p.factors)), info.columns)
        out.setdefault(label, set()).add(p.total_clients)
    return out


def _surface(groups, cals: dict[str, Calibration], pred: Predictions, spec_ns) -> None:
    """Each configuration predicted from all its points over the populations
    of its spec and a step past them, with the 90% band, the measured means,
    and the spec's populations that were not measured (a plan's) marked on
    the prediction."""
    for label, cal in cals.items():
        wanted = spec_ns.get(label, set())
        lo, hi = min(cal.ns[0], *wanted), max(cal.ns[-1], *wanted)
        grid = sorted({*cal.ns, *wanted, *(round(lo * (2 * hi / lo) ** (i / 24)) for i in range(25))} - {0})
        try:
            preds = [predict_one(cal, n) for n in grid]
        except PredictError:
            continue
        measured = sorted(((int(num(r, "N")), r) for r in groups[label]), key=lambda t: t[0])
        skipped = [p for p in preds if p.n in wanted - set(cal.ns)]
        pred.surface_curves.append((label or "as measured", preds, measured, skipped))
        pred.surface_rows += [
            {
                "configuration": label,
                "N": p.n,
                "in spec": "measured" if p.n in cal.ns else ("predicted" if p.n in wanted else ""),
                "X predicted": p.x,
                "X lo": p.x_lo,
                "X hi": p.x_hi,
                "R predicted (ms)": p.r_us / 1e3,
                "R lo (ms)": p.r_lo / 1e3,
                "R hi (ms)": p.r_hi / 1e3,
            }
            for p in preds
        ]


def _draw_surface(pred: Predictions, out: Path) -> None:
    """predicted-surface.svg and its data, plots/predicted-surface.csv."""
    curves = pred.surface_curves
    if not curves:
        return

    def panel(which: str):
        scale, col = (1.0, "client_tput") if which == "x" else (1e-3, "client_rt_mean_us")

        def draw(ax):
            for i, (label, preds, measured, skipped) in enumerate(curves):
                ns = [p.n for p in preds]
                mid, low, high = (
                    [v * scale for v in vals]
                    for vals in zip(
                        *[(p.x, p.x_lo, p.x_hi) if which == "x" else (p.r_us, p.r_lo, p.r_hi) for p in preds],
                        strict=True,
                    )
                )
                ax.plot(ns, mid, color=f"C{i}", label=f"{label}: predicted, 90% band")
                ax.fill_between(ns, low, high, color=f"C{i}", alpha=0.15)
                ax.plot(
                    [n for n, _ in measured],
                    [num(r, col) * scale for _, r in measured],
                    "o",
                    color=f"C{i}",
                    label=f"{label}: measured",
                )
                if skipped:
                    band = [
                        (p.x, p.x_lo, p.x_hi) if which == "x" else (p.r_us, p.r_lo, p.r_hi) for p in skipped
                    ]
                    ax.errorbar(
                        [p.n for p in skipped],
                        [m * scale for m, _, _ in band],
                        yerr=[[(m - a) * scale for m, a, _ in band], [(b - m) * scale for m, _, b in band]],
                        fmt="D",
                        mfc="none",
                        color=f"C{i}",
                        capsize=3,
                        label=f"{label}: in the spec, not measured",
                    )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("clients N")
            ax.set_ylabel("throughput (ops/s)" if which == "x" else "mean response time (ms)")

        return draw

    pred.surface = save_panels(out / "plots", "predicted-surface", [("", panel("x")), ("", panel("r"))])[0]
    pd.DataFrame(pred.surface_rows).to_csv(out / "plots" / "predicted-surface.csv", index=False)


def compute_predictions(agg: pd.DataFrame, info: ExperimentInfo) -> Predictions:
    """The section's tables and what its figures draw (nothing written)."""
    pred = Predictions()
    if agg.empty or "N" not in agg:
        return pred
    groups = configurations(agg, info)
    # Every configuration calibrated once, on all its points (the held-out
    # configurations and the what-ifs start from these); the what-ifs are
    # refused as a whole when one cannot be.
    cals: dict[str, Calibration] = {}
    refusal = ""
    for label, members in groups.items():
        try:
            cals[label] = calibrate(members, info, label)
        except PredictError as e:
            refusal = refusal or str(e)
    rows = _held_out_populations(groups, cals, info) + _held_out_configurations(groups, cals, info)
    if rows:
        pred.heldout = pd.DataFrame(rows)
        h = pred.heldout
        pred.x_worst = float(h["X error"].abs().max())
        pred.r_worst = float(h["R error"].abs().max())
        pred.within = int(((h["X error"].abs() <= X_GOAL) & (h["R error"].abs() <= R_GOAL)).sum())
        pred.bottleneck_agrees = int((h["bottleneck predicted"] == h["bottleneck measured"]).sum())
        pred.covered = int((h["covered"] == "yes").sum())
    pred.noise_floor = noise_table(groups)
    pred.loo = leave_one_out(agg, info)
    if refusal:
        pred.refused.append(refusal)
    else:
        _whatif(list(cals.values()), info, pred)
    _surface(groups, cals, pred, spec_populations(info))
    return pred


def write_predictions(pred: Predictions, result: Path) -> None:
    """predictions.csv and noise.csv into `result`, the figures and their
    data into its plots/ (which sets `pred.figure` and `pred.surface`)."""
    if not pred.heldout.empty:
        pred.heldout.to_csv(result / "predictions.csv", index=False)
    if not pred.noise_floor.empty:
        pred.noise_floor.to_csv(result / "noise.csv", index=False)
    if not pred.loo.table.empty:
        pred.loo.table.to_csv(result / "leave-one-out.csv", index=False)
    _draw_whatif(pred, result)
    _draw_surface(pred, result)


def predictions(result: Path, agg: pd.DataFrame, info: ExperimentInfo) -> Predictions:
    """The section's tables and figures, computed and written into `result`."""
    pred = compute_predictions(agg, info)
    write_predictions(pred, result)
    return pred

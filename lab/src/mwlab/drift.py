"""Drift between runs: how far the machine moved, read from the reference
point every run measures at its start and end (`mwlab.reference`), and
predictions of one result carried to another's machine state.

**A result's level** is the mean throughput of its reference measurements.
Its uncertainty (a relative standard deviation) has two parts, added in
quadrature: the measurements' own standard errors (batch means over their
windows), and their spread — the machine moved while the experiment ran, so
a point measured in the middle of it saw anything between the start and the
end; for a start and an end the spread is half their difference.

**The reference ratio** of B to A is B's level over A's: how much of A's
machine B had. Its uncertainty is both levels' in quadrature (of the
logarithms). A prediction calibrated on A is carried to B by it
(`carry`): the response time divided by the ratio (every demand is that much
longer), the throughput from the interactive response time law at the same
population and think time (X times the ratio when nobody thinks), and each
half-width of the 90% intervals widened in quadrature by the ratio's
uncertainty and by TRANSFER, the error of carrying a ratio measured on the
reference point to another system, so an interval already clipped on one
side stays asymmetric.

**Within a run**, the movement is the end's throughput over the start's;
it is more than the reference's own noise when its logarithm is more than
the 90% quantile times the two measurements' standard errors in quadrature.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mwlab.bounds import clip
from mwlab.procs import LabError
from mwlab.reference import DESCRIPTION, Reference, read

# The two-sided 90% quantile of the normal distribution (as predict.Z90).
Z90 = 1.6448536269514722
# The relative error (a standard deviation of ln X) of carrying the ratio
# to a system other than the reference point, beyond the ratio's own
# uncertainty: a change of the machine moves two systems differently. On
# this 2-core machine, with half of a core taken by a busy loop, three
# systems unlike the reference point (a pool of 4 workers at N = 8, the async
# engine at N = 16, no middleware at N = 4) moved by the reference's ratio
# within -13% .. +17% over five pairs of runs each, root mean square 8.5%
# (the runs' own noise included).
TRANSFER = 0.08


class DriftError(ValueError):
    """Two results that cannot be compared by their reference points."""


@dataclass
class Level:
    """A result's reference level: mean throughput and its relative uncertainty."""

    x: float
    sigma: float  # of ln x: the measurements' standard errors and their spread
    noise: float  # the standard errors' part only
    spread: float  # the spread's part only
    refs: list[Reference] = field(default_factory=list)


def level(refs: list[Reference]) -> Level:
    """The level of a result from its reference measurements (at least one)."""
    ok = [r for r in refs if r.x > 0]
    if not ok:
        raise DriftError("no reference measurement")
    k = len(ok)
    x = sum(r.x for r in ok) / k
    ses = [r.x_se if not math.isnan(r.x_se) else 0.0 for r in ok]
    noise = math.sqrt(sum(s * s for s in ses)) / k / x
    spread = math.sqrt(sum((r.x - x) ** 2 for r in ok) / k) / x
    return Level(x, math.hypot(noise, spread), noise, spread, ok)


@dataclass
class Ratio:
    """B's reference level over A's, with the standard deviation of its logarithm."""

    value: float
    sigma: float
    a: Level
    b: Level

    @property
    def lo(self) -> float:
        return self.value * math.exp(-Z90 * self.sigma)

    @property
    def hi(self) -> float:
        return self.value * math.exp(Z90 * self.sigma)

    def verdict(self) -> str:
        """ "" when the ratio is told from 1; else that it is not."""
        return "" if not self.lo <= 1 <= self.hi else ": no change the reference points can tell"

    def text(self, a: str = "A", b: str = "B") -> str:
        return (
            f"{b}'s reference point ran at {self.value:.3f} x {a}'s (90%: {self.lo:.3f} .. {self.hi:.3f}"
            f"{self.verdict()}; "
            f"{b} {self.b.x:,.0f} ops/s, {a} {self.a.x:,.0f} ops/s)"
        )


def ratio_of(a: list[Reference], b: list[Reference]) -> Ratio:
    """The reference ratio of B to A."""
    la, lb = level(a), level(b)
    return Ratio(lb.x / la.x, math.hypot(la.sigma, lb.sigma), la, lb)


def ratio(a: Path, b: Path) -> Ratio:
    """The reference ratio of result B to result A; a DriftError naming the
    result that has no reference point (or another one)."""
    refs = {}
    for name, path in (("A", a), ("B", b)):
        refs[name] = read(path)
        if not any(r.x > 0 for r in refs[name]):
            raise DriftError(
                f"{path} has no reference point (reference.csv): it was run with `run: {{reference: false}}` "
                "or by a version of the lab that did not measure one"
            )
    points = {r.point for rs in refs.values() for r in rs}
    if len(points) > 1:
        raise DriftError(f"the two results measured different reference points ({', '.join(sorted(points))})")
    return ratio_of(refs["A"], refs["B"])


@dataclass
class Movement:
    """How far the reference point moved between a run's first and last measurement."""

    start: Reference
    end: Reference
    change: float  # end / start - 1
    sigma: float  # of ln(end / start), from the two standard errors

    @property
    def beyond_noise(self) -> bool:
        return abs(math.log1p(self.change)) > Z90 * self.sigma

    def sentence(self) -> str:
        """The text as a sentence of its own."""
        t = self.text()
        return t[0].upper() + t[1:] + "."

    def text(self) -> str:
        verdict = "more than" if self.beyond_noise else "within"
        return (
            f"the reference point moved {100 * self.change:+.1f}% within the run "
            f"({self.start.x:,.0f} ops/s at the start, {self.end.x:,.0f} at the end; "
            f"{verdict} its own noise of ±{100 * Z90 * self.sigma:.1f}%)"
        )


def movement(refs: list[Reference]) -> Movement | None:
    """The first start against the last end; None without both."""
    starts = [r for r in refs if r.phase == "start" and r.x > 0]
    ends = [r for r in refs if r.phase == "end" and r.x > 0]
    if not starts or not ends:
        return None
    s, e = starts[0], ends[-1]
    rel = [r.x_se / r.x if not math.isnan(r.x_se) else 0.0 for r in (s, e)]
    return Movement(s, e, e.x / s.x - 1, math.hypot(*rel))


def summary(refs: list[Reference]) -> dict[str, Any]:
    """What experiment.json records of the reference point."""
    if not refs:
        return {}
    lv = level(refs)
    mv = movement(refs)
    out: dict[str, Any] = {
        "point": refs[0].point,
        "x": lv.x,
        "x_sigma": lv.sigma,
        "measurements": [{"phase": r.phase, "x": r.x, "x_se": r.x_se, "r_us": r.r_us} for r in refs],
    }
    if mv is not None:
        out["movement"] = mv.change
        out["movement_sigma"] = mv.sigma
    return out


def carry(pred, rho: Ratio):
    """A prediction (`mwlab.predict.Prediction`) carried to the machine state
    of the ratio: a new Prediction, the original untouched."""
    p = copy.deepcopy(pred)
    q, s = rho.value, math.hypot(rho.sigma, TRANSFER)
    # X moves as the interactive law says at the same N and think time
    # (X (R + Z) = N before and after): by the ratio when nobody thinks.
    think = p.think_us
    r = p.r_us / q
    x = p.x * (p.r_us + think) / (r + think) if r + think > 0 else p.x * q
    # How much ln X moves with ln of the ratio.
    kx = r / (r + think) if r + think > 0 else 1.0
    p.x_lo, p.x_hi = _widened(p.x, p.x_lo, p.x_hi, x, Z90 * kx * s)
    p.x = x
    for name in ("r", "p50", "p99"):
        value = getattr(p, "r_us" if name == "r" else f"{name}_us")
        lo, hi = getattr(p, f"{name}_lo"), getattr(p, f"{name}_hi")
        lo, hi = _widened(value, lo, hi, value / q, Z90 * s)
        setattr(p, f"{name}_lo", lo)
        setattr(p, f"{name}_hi", hi)
        setattr(p, "r_us" if name == "r" else f"{name}_us", value / q)
    for d in p.devices:
        d.demand_us /= q
    if p.bounds is not None:
        # The bounds move with the demands, as far as the ratio's 90%
        # interval allows (the ratio that moves them is itself uncertain):
        # the carried intervals are held to them as the uncarried ones are.
        p.bounds.x_max *= rho.hi
        p.bounds.r_min /= rho.hi
        p.bounds.by_demand_us /= rho.hi
        p.x_lo, p.x_hi, cx = clip(p.x_lo, p.x_hi, p.bounds, "x")
        p.r_lo, p.r_hi, cr = clip(p.r_lo, p.r_hi, p.bounds, "r")
        p.clipped = [w for w, c in (("x", cx), ("r", cr)) if c]
        p.x = min(p.x, p.bounds.x_top)
        p.r_us = max(p.r_us, p.bounds.r_floor)
    p.uncertainty = {
        k: {**v, "reference": w * rho.sigma, "transfer": w * TRANSFER}
        for k, v in p.uncertainty.items()
        for w in [kx if k == "x" else 1.0]
    }
    p.notes = [*p.notes, f"carried by the reference ratio {q:.3f} (90%: {rho.lo:.3f} .. {rho.hi:.3f})"]
    return p


def _widened(old: float, lo: float, hi: float, new: float, extra: float) -> tuple[float, float]:
    """The interval (lo, hi) around `old` moved to `new`, each half-width
    (in logarithms) widened in quadrature by `extra`."""
    if any(math.isnan(v) for v in (old, lo, hi)) or old <= 0 or lo <= 0:
        return math.nan, math.nan
    down = math.hypot(math.log(old / lo), extra)
    up = math.hypot(math.log(hi / old), extra) if not math.isinf(hi) else math.inf
    return new * math.exp(-down), new * math.exp(up) if not math.isinf(up) else math.inf


def measured_match(pred, info_a, agg_b: pd.DataFrame, info_b) -> pd.Series | None:
    """B's measured point of the same configuration and population as the
    prediction: every setting equal (the run section aside, and how the
    clients are spread: only their number N counts)."""
    from mwlab.fit import CLIENT_FACTORS, num
    from mwlab.predict import PredictError, config_settings

    try:
        want = _comparable(config_settings(info_a.settings, pred.config))
    except PredictError:
        return None
    for _, row in agg_b.iterrows():
        if round(num(row, "N", 0)) != pred.n:
            continue
        levels = {f: _plain(row[f]) for f in info_b.columns if f not in CLIENT_FACTORS and f in row}
        try:
            have = _comparable(config_settings(info_b.settings, levels))
        except PredictError:
            continue
        if have == want:
            return row
    return None


def _plain(v: Any) -> Any:
    """A table's value as the spec wrote it (8.0 -> 8)."""
    v = v.item() if hasattr(v, "item") else v
    return int(v) if isinstance(v, float) and v.is_integer() else v


# Settings that say how the clients are spread or how long a run lasts, not what is measured.
_NOT_CONFIG = (
    "run.",
    "topology.client_machines",
    "topology.instances",
    "topology.threads",
    "topology.virtual_clients",
)


def _comparable(settings) -> dict[str, Any]:
    from mwlab.spec import flatten

    return {k: v for k, v in flatten(settings).items() if not k.startswith(_NOT_CONFIG)}


@dataclass
class Against:
    """A prediction of A carried to B's machine, beside B's measurement of the same point."""

    carried: Any  # mwlab.predict.Prediction, scaled
    unscaled: Any  # the same prediction as A's machine would give it
    x: float = math.nan  # B's measured throughput (NaN: B did not measure the point)
    r_us: float = math.nan

    @property
    def measured(self) -> bool:
        return not math.isnan(self.x)

    @property
    def covered(self) -> bool:
        return self.measured and self.carried.covers(self.x, self.r_us)

    @property
    def unscaled_covered(self) -> bool:
        return self.measured and self.unscaled.covers(self.x, self.r_us)


def against(preds: list, rho: Ratio, info_a, agg_b: pd.DataFrame, info_b) -> list[Against]:
    """Every prediction carried by `rho`, with B's measurement where B measured that point."""
    from mwlab.fit import num

    out = []
    for p in preds:
        row = measured_match(p, info_a, agg_b, info_b)
        a = Against(carry(p, rho), p)
        if row is not None:
            a.x, a.r_us = num(row, "client_tput"), num(row, "client_rt_mean_us")
        out.append(a)
    return out


@dataclass
class View:
    """What the report's Drift section shows."""

    table: pd.DataFrame
    movement: Movement | None = None
    since: Ratio | None = None
    since_path: Path | None = None
    # Why there is no comparison with the earlier result.
    since_error: str = ""
    description: str = DESCRIPTION

    def since_text(self) -> str:
        if self.since is None:
            return ""
        r = self.since
        return (
            f"the machine ran the reference point at {r.value:.3f} x what it did in {self.since_path} "
            f"({100 * (r.value - 1):+.1f}%; 90%: {r.lo:.3f} .. {r.hi:.3f}{r.verdict()})"
        )


def view(result: Path, since: Path | None = None) -> View | None:
    """The Drift section of a result (None: no reference point and no earlier result named)."""
    try:
        refs = read(result)
    except LabError as e:
        out = View(pd.DataFrame())
        out.since_error = str(e)
        out.since_path = since
        return out
    if not refs and since is None:
        return None
    table = pd.DataFrame(
        [
            {
                "measured": r.phase,
                "at": pd.Timestamp(r.started_unix, unit="s").strftime("%H:%M:%S"),
                "X (ops/s)": r.x,
                "X ± (%)": 100 * r.x_cv,
                "R (ms)": r.r_us / 1e3,
                "R ± (%)": 100 * r.r_se_us / r.r_us if r.r_us > 0 else math.nan,
                "windows": r.windows,
            }
            for r in refs
        ]
    )
    out = View(table, movement(refs))
    if since is not None:
        out.since_path = since
        try:
            out.since = ratio(since, result)
        except (DriftError, LabError, OSError) as e:
            out.since_error = str(e)
    return out


def run_lines(result: Path, since: Path | None = None) -> list[str]:
    """What `mwlab run` prints of the drift: the movement within the run
    when it is more than the reference's noise, and the ratio to an earlier
    result when one is named."""
    v = view(result, since)
    if v is None:
        return []
    lines = []
    if since is None and v.since_error:
        lines.append("drift: " + v.since_error)
    if v.movement is not None and v.movement.beyond_noise:
        lines.append("drift: " + v.movement.text())
    if since is not None:
        lines.append("drift: " + (v.since_text() or f"not compared with {since}: {v.since_error}"))
    return lines

"""Which measured configuration a prediction starts from, and how: the
nearest along every factor, or the two around it.

A configuration the result measured is predicted from its own calibration.
Any other is reached from the measured configuration **nearest** to it: the
distance is the sum over the factors of |ln(a / b)| for numeric levels (so
tmw=16 is one doubling from tmw=8 and three from tmw=2) and a large constant
for a level of another kind. Ties go to the configuration listed first.

- If the target differs from the nearest in one setting with a rule
  (workers, middlewares, servers, event loops, copies, database
  connections) and the result measured that setting on **both sides** of
  the target (tmw=4 between tmw=2 and tmw=8, all else equal), it is
  predicted from both, each carried by the rules, and the two are
  interpolated in ln of the setting: ln X, ln R and the tails, and each
  source of uncertainty, weighted by the position; half their
  disagreement (most at the middle) is added as the `between` part of the
  uncertainty.
- Otherwise it is carried by the rules from the nearest end, and the
  rules' error grows with the distance (`mwlab.predict.rule_steps`).
- A setting without a rule (value size, message size) is interpolated
  between its two nearest measured levels (`_interpolated`).

Every prediction says which configuration(s) it used and why (its first
note), and its intervals are clipped by the operational bounds
(`mwlab.bounds`) after the blend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from mwlab.curves import PAST_TREND, Curve, PredictError
from mwlab.predict import (
    MAX_CLIENTS,
    STRUCTURAL,
    Calibration,
    Prediction,
    calibrations,
    column,
    config_settings,
    finish_intervals,
    machine_floor,
    predict_one,
    with_changes,
)
from mwlab.spec import ExperimentInfo, Settings, SpecError, canonical

# The distance of two levels of different kinds (an engine, a workload): far
# more than any numeric one, so a configuration of the target's kind is
# always nearer.
FAR = 1e3


@dataclass
class Source:
    """A calibration a prediction is made from, the settings the rules
    carry it to (None: the configuration was measured), and its weight."""

    cal: Calibration
    target: Settings | None
    weight: float = 1.0


@dataclass
class Route:
    sources: list[Source]
    # Which configuration(s) and why, said as the prediction's first note
    # ("" for a measured configuration).
    why: str = ""


def _setting(s: Settings, key: str) -> Any:
    section, name = key.split(".", 1)
    return getattr(getattr(s, section), name)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _distance(a: Any, b: Any) -> float:
    if a == b:
        return 0.0
    if _number(a) and _number(b) and a > 0 and b > 0:
        return abs(math.log(a / b))
    return FAR


def _keys(levels: dict[str, Any]) -> list[str]:
    out = []
    for k in levels:
        try:
            out.append(canonical(k))
        except SpecError:
            continue
    return out


def _label(key: str, value: Any) -> str:
    return f"{column(key)}={value}"


def route(cals: list[Calibration], levels: dict[str, Any], info: ExperimentInfo) -> Route:
    """How the configuration `levels` (factor columns) is predicted."""
    target = config_settings(info.settings, levels)
    for c in cals:
        if c.settings == target:
            return Route([Source(c, None)])
    keys = _keys(levels)

    def away(c: Calibration) -> float:
        return sum(_distance(_setting(c.settings, k), _setting(target, k)) for k in keys)

    start = min(cals, key=away)
    differ = [k for k in keys if _setting(start.settings, k) != _setting(target, k)]
    free = [k for k in differ if k not in STRUCTURAL]
    if len(free) > 1:
        raise PredictError(
            f"{', '.join(free)}: only one setting without a rule can be interpolated at a time"
        )
    if free:
        key = free[0]
        value = _setting(target, key)
        if not _number(value):
            raise PredictError(
                f"{key}={value}: a change of kind (not of size) was never observed in this result"
            )
        start = _interpolated(cals, key, float(value), start)
        start.settings = config_settings(start.settings, {key: value})
        return Route([Source(start, target)], f"calibrated on {start.sweep}")
    why = f"calibrated on {start.sweep}: the nearest measured configuration"

    def shown(key: str) -> str:
        measured = sorted(
            {_setting(c.settings, key) for c in cals if _number(_setting(c.settings, key))}, key=float
        )
        return ", ".join(str(v) for v in measured)

    # A setting the target lies between two measured levels of is
    # interpolated between them, whatever else the rules carry.
    for key in differ:
        want, have = _setting(target, key), _setting(start.settings, key)
        partner = _partner(cals, start, key, want)
        if partner is None or not _number(want):
            continue
        other = _setting(partner.settings, key)
        w = math.log(want / have) / math.log(other / have)
        rest = [_label(k, _setting(target, k)) for k in differ if k != key]
        carried = f"; {', '.join(rest)} carried by the rules" if rest else ""
        return Route(
            [Source(start, target, 1 - w), Source(partner, target, w)],
            f"between {start.sweep} and {partner.sweep} (measured {column(key)}: {shown(key)}): "
            f"predicted from both and interpolated in ln {column(key)}, weights {1 - w:.2f} and {w:.2f}"
            + carried,
        )
    if len(differ) == 1:
        key = differ[0]
        want, have = _setting(target, key), _setting(start.settings, key)
        side = "largest" if _number(want) and _number(have) and want > have else "smallest"
        why += (
            f" (measured {column(key)}: {shown(key)}; {_label(key, want)} is past the {side}, "
            "carried by the rules)"
        )
    return Route([Source(start, target)], why)


def _partner(cals: list[Calibration], start: Calibration, key: str, want: Any) -> Calibration | None:
    """The measured configuration equal to `start` but in `key`, whose level
    lies on the other side of `want`, nearest to it."""
    have = _setting(start.settings, key)
    if not (_number(want) and _number(have)) or want <= 0 or have <= 0:
        return None
    best = None
    for c in cals:
        v = _setting(c.settings, key)
        if not _number(v) or v <= 0 or (v - want) * (have - want) >= 0:
            continue
        nearer = best is None or abs(math.log(v / want)) < abs(math.log(_setting(best.settings, key) / want))
        if c is not start and _same_but(c, start, key) and nearer:
            best = c
    return best


def _same_but(a: Calibration, b: Calibration, key: str) -> bool:
    col = column(key)
    return all(a.levels.get(k) == b.levels.get(k) for k in {*a.levels, *b.levels} if k != col)


def _mean_log(a: float, b: float, w: float) -> float:
    if a <= 0 or b <= 0 or math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
        return a if w < 0.5 else b
    return math.exp((1 - w) * math.log(a) + w * math.log(b))


def blend(a: Prediction, b: Prediction, w: float) -> Prediction:
    """The prediction between two (`w` toward `b`), intervals not yet made."""
    near = a if w <= 0.5 else b
    x, r = _mean_log(a.x, b.x, w), _mean_log(a.r_us, b.r_us, w)
    shape = 4 * w * (1 - w)
    sigma: dict[str, dict[str, float]] = {}
    for which, va, vb in (("x", a.x, b.x), ("r", a.r_us, b.r_us)):
        parts = {
            k: (1 - w) * a.uncertainty[which].get(k, 0.0) + w * b.uncertainty[which].get(k, 0.0)
            for k in {*a.uncertainty[which], *b.uncertainty[which]}
        }
        parts["between"] = 0.5 * abs(math.log(va / vb)) * shape if va > 0 and vb > 0 else 0.0
        sigma[which] = parts
    ba, bb = a.bounds, b.bounds
    bounds = None
    if ba is not None and bb is not None:
        wide = ba if ba.x_max >= bb.x_max else bb
        bounds = replace(wide, think_us=(1 - w) * a.think_us + w * b.think_us, r_min=min(ba.r_min, bb.r_min))
    return Prediction(
        config=a.config,
        n=a.n,
        x=x,
        r_us=r,
        p50_us=_mean_log(a.p50_us, b.p50_us, w),
        p99_us=_mean_log(a.p99_us, b.p99_us, w),
        bottleneck=near.bottleneck,
        basis=f"{a.basis} and {b.basis}",
        notes=list(
            dict.fromkeys(
                [f"from {a.basis}: {n}" for n in a.notes] + [f"from {b.basis}: {n}" for n in b.notes]
            )
        ),
        devices=near.devices,
        uncertainty=sigma,
        think_us=(1 - w) * a.think_us + w * b.think_us,
        tail_sigma=(1 - w) * a.tail_sigma + w * b.tail_sigma,
        bounds=bounds,
    )


def widened(cal: Calibration, others: list[Calibration]) -> Calibration:
    """`cal` shaped by the nearest other configuration that measured
    populations it did not: past its own ends, each demand curve gets knots
    at the other's populations, its end value moved by half the other's
    change from that end (in ln; the offset by half its change in µs); inside
    a gap between its own populations, a knot where the other measured one,
    moved by half the other's departure there from a straight line in ln N
    across the same gap. The tails come as the other measured them, and the
    curves keep their own so the doubt where they were moved is the whole
    move (`Curve.borrowed_doubt`). Unchanged when no other configuration
    measured a population this one did not."""
    keys = _keys(cal.levels)

    def away(c: Calibration) -> float:
        return sum(_distance(_setting(c.settings, k), _setting(cal.settings, k)) for k in keys)

    def lent(c: Calibration) -> list[int]:
        return [n for n in c.ns if n not in cal.ns and (n < cal.ns[0] or n > cal.ns[-1] or _inside(c, n))]

    def _inside(c: Calibration, n: int) -> bool:
        a, b = _gap(n)
        return c.ns[0] <= a and b <= c.ns[-1]

    def _gap(n: int) -> tuple[int, int]:
        return max(k for k in cal.ns if k < n), min(k for k in cal.ns if k > n)

    sibs = [c for c in others if c is not cal and c.levels != cal.levels and lent(c)]
    if not sibs:
        return cal
    sib = min(sibs, key=away)
    extra = lent(sib)

    def moved(own: Curve, shape: Curve, n: int, additive: bool) -> float | None:
        if n < cal.ns[0] or n > cal.ns[-1]:
            end = cal.ns[0] if n < cal.ns[0] else cal.ns[-1]
            here, there, mine = shape.at(end), shape.at(n), own.at(end)
        else:
            a, b = _gap(n)
            t = math.log(n / a) / math.log(b / a)
            here = (1 - t) * shape.at(a) + t * shape.at(b)
            there, mine = shape.at(n), own.at(n)
        if additive:
            return mine + PAST_TREND * (there - here)
        if here > 0 and there > 0:
            return mine * (there / here) ** PAST_TREND
        return None

    def carried(own: Curve, shape: Curve | None, additive: bool) -> Curve:
        knots = list(own.knots)
        if shape is not None:
            for n in extra:
                v = moved(own, shape, n, additive)
                if v is not None:
                    knots.append((n, v))
        return Curve(sorted(knots), floor=own.floor, base=own)

    holding = cal.holding
    if len(holding) == 1 and len(sib.holding) >= 2:
        # One busy level measured here: the contention each busy worker adds
        # (the slope of holding time on busy workers) is the machine's, taken
        # from the other configuration.
        (k0, h0), (k1, h1) = sib.holding[0], sib.holding[-1]
        k, h = holding[0]
        holding = sorted([(k, h), (k + 1.0, h + (h1 - h0) / (k1 - k0))]) if k1 != k0 else holding
    return replace(
        cal,
        holding=holding,
        curves={name: carried(c, sib.curves.get(name), False) for name, c in cal.curves.items()},
        offset=carried(cal.offset, sib.offset, True),
        tails=sorted(cal.tails + [t for t in sib.tails if t[0] in extra and t[0] not in cal.ns]),
        borrowed=sib.sweep,
    )


def predict_at(
    cals: list[Calibration], info: ExperimentInfo, levels: dict[str, Any], clients: list[int] | None = None
) -> list[Prediction]:
    """The configuration `levels` predicted at the populations `clients`
    (default: those of the calibration it starts from)."""
    rt = route(cals, levels, info)
    # The machine's lightest demands: the same for every population (a
    # source is one of `cals`, or between two of them).
    floor = machine_floor(cals)

    def part(s: Source, n: int) -> Prediction:
        cal = replace(_reach_n(s.cal, n, cals), machine=floor)
        return predict_one(cal, n, s.target, dict(levels), finish=False)

    out = []
    for n in clients or sorted(set(rt.sources[0].cal.ns)):
        parts = [part(s, n) for s in rt.sources]
        p = parts[0] if len(parts) == 1 else blend(parts[0], parts[1], rt.sources[1].weight)
        if rt.why:
            p.notes.insert(0, rt.why)
        finish_intervals(p)
        out.append(p)
    return out


def _reach_n(cal: Calibration, n: int, cals: list[Calibration]) -> Calibration:
    """The calibration to predict n from: shaped by another configuration
    where n is a population it did not measure."""
    return widened(cal, cals) if n not in cal.ns else cal


def predict(
    agg: pd.DataFrame,
    info: ExperimentInfo,
    changes: dict[str, Any] | None = None,
    clients: list[int] | None = None,
    only_n: set[int] | None = None,
) -> list[Prediction]:
    """Predictions for every configuration of the result with `changes`
    applied, at the populations `clients` (default: those calibrated on)."""
    changes = changes or {}
    if clients is not None and any(n < 1 for n in clients):
        raise PredictError("--clients: every population must be at least 1")
    if clients is not None and any(n > MAX_CLIENTS for n in clients):
        raise PredictError(f"--clients: at most {MAX_CLIENTS:,} (the exact solution grows with N squared)")
    if clients is not None:
        clients = sorted(set(clients), key=clients.index)
    cals = calibrations(agg, info, only_n)
    if not cals:
        raise PredictError("the result has no measured point")
    out: list[Prediction] = []
    done: set[str] = set()
    for cal in cals:
        levels = with_changes(cal.levels, changes)
        label = ", ".join(f"{k}={v}" for k, v in sorted(levels.items()))
        if label in done:
            continue
        done.add(label)
        out += predict_at(cals, info, levels, clients)
    return out


def _interpolated(cals: list[Calibration], key: str, value: float, cal: Calibration) -> Calibration:
    """A calibration at `key = value` from the two nearest measured levels (everything else as in `cal`)."""
    col = column(key)
    same = [
        c
        for c in cals
        if all(v == cal.levels.get(k) for k, v in c.levels.items() if k != col)
        and isinstance(c.levels.get(col), (int, float))
    ]
    levels = sorted({c.levels[col] for c in same})
    if len(levels) < 2:
        measured = levels[0] if levels else _setting(cal.settings, key)
        raise PredictError(
            f"{key}={value:g}: this result measured {col}={measured} only; what depends on it "
            f"was never observed (measure at least two levels of {col} to predict others)"
        )
    near = sorted(levels, key=lambda v: (abs(v - value), v))[:2]
    lo, hi = sorted(near)
    a = next(c for c in same if c.levels[col] == lo)
    b = next(c for c in same if c.levels[col] == hi)
    w = (value - lo) / (hi - lo)
    common = [k for k in a.curves if k in b.curves]
    ns = sorted(set(a.ns) & set(b.ns)) or a.ns

    def mix(ca: Curve, cb: Curve) -> Curve:
        return Curve([(n, (1 - w) * ca.at(n) + w * cb.at(n)) for n in ns])

    def clamp(c: Curve) -> Curve:
        return Curve([(n, max(v, 0.0)) for n, v in c.knots])

    levels_new = dict(cal.levels)
    levels_new[col] = value
    return Calibration(
        sweep=f"{a.sweep} .. {b.sweep} (interpolated in {col})",
        levels=levels_new,
        settings=a.settings,
        ns=ns,
        think_us=(1 - w) * a.think_us + w * b.think_us,
        curves={k: clamp(mix(a.curves[k], b.curves[k])) for k in common},
        servers={k: a.servers[k] for k in common},
        in_network={k: a.in_network[k] for k in common},
        offset=mix(a.offset, b.offset),
        tails=a.tails if w < 0.5 else b.tails,
        noise=max(a.noise, b.noise, key=lambda nz: nz.x_cv if not math.isnan(nz.x_cv) else -1.0),
    )

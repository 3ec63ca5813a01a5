"""Demand curves: a quantity per request as a function of the population N
(a device's demand, the offset), and how far each may be trusted at a
population it was not measured at (`mwlab.predict` calibrates and predicts
with them; `mwlab.nearest` shapes them by another configuration's).

Between the calibration points a curve is a straight line in ln N; past
them it continues half the last segment's trend (PAST_TREND), and its doubt
there is the whole trend; with one calibrated population, ONE_POINT_TREND
per e-fold. Its own error is the leave-one-out error at the interior
calibration points.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


class PredictError(Exception):
    """A prediction that cannot be made, with the reason."""


# How much of a curve's last trend is carried past its calibrated
# populations: the prediction sits halfway between holding the end value and
# continuing the trend, and its doubt there is the whole trend
# (`_curve_doubt`), so the 90% interval reaches from before the end value to
# well past the trend continued (demands measured at 2 and 8 clients, carried
# to 24, and at 8 and 24, carried down to 2, fell on both sides of a straight
# continuation).
PAST_TREND = 0.5


def _between(points: list[tuple[float, float]], x: float) -> float:
    """Straight lines between `points` (sorted by x), held at the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return points[-1][1]


def _line(points: list[tuple[float, float]], x: float) -> float:
    """The straight line through the two of `points` (sorted by x) nearest
    x, continued past the ends."""
    if x <= points[0][0]:
        (x0, y0), (x1, y1) = points[0], points[1]
    elif x >= points[-1][0]:
        (x0, y0), (x1, y1) = points[-2], points[-1]
    else:
        return _between(points, x)
    return y0 + (x - x0) / (x1 - x0) * (y1 - y0) if x1 != x0 else y0


@dataclass
class Curve:
    """A quantity per request as a function of the population N: straight
    lines in ln N between the calibration points, held at the ends."""

    knots: list[tuple[int, float]]
    # A leave-one-out error known from elsewhere (a denser calibration of the
    # same configuration: `mwlab plan`), used where this curve's own is larger
    # or unknown.
    floor: float = float("nan")
    # The curve through the knots this configuration measured itself (None:
    # every knot is its own); the other knots were carried from another
    # configuration's shape (`mwlab.nearest.widened`) and carry that doubt.
    base: Curve | None = None

    @classmethod
    def fit(cls, pairs: list[tuple[int, float]]) -> Curve:
        """The curve through (N, value) pairs, values at the same N averaged."""
        by_n: dict[int, list[float]] = {}
        for n, v in pairs:
            if n >= 1 and not math.isnan(v):
                by_n.setdefault(n, []).append(v)
        if not by_n:
            raise PredictError("no calibration point measured this quantity")
        return cls(sorted((n, sum(v) / len(v)) for n, v in by_n.items()))

    def at(self, n: float) -> float:
        """The value at n: the straight line in ln N between the knots
        around it; past the ends, the end value moved by PAST_TREND of the
        last segment's trend (no more than halved or doubled)."""
        pts = [(math.log(k), v) for k, v in self.knots]
        ln = math.log(n)
        if len(pts) < 2 or pts[0][0] <= ln <= pts[-1][0]:
            return _between(pts, ln)
        (a, va), (b, vb) = pts[:2] if ln < pts[0][0] else pts[-2:]
        end, value = (a, va) if ln < a else (b, vb)
        v = value + PAST_TREND * (vb - va) / (b - a) * (ln - end)
        if all(k > 0 for _, k in pts):
            v = min(max(v, value / 2), value * 2)
        return v

    @property
    def error(self) -> float:
        """The fit's own error: the mean relative error at each interior
        calibration point when it is left out (nan with fewer than 3)."""
        errs = []
        knots = self.own_knots
        for i in range(1, len(knots) - 1):
            n, v = knots[i]
            rest = Curve(knots[:i] + knots[i + 1 :])
            if v:
                errs.append(abs(rest.at(n) - v) / abs(v))
        own = sum(errs) / len(errs) if errs else float("nan")
        if math.isnan(own):
            return self.floor
        return own if math.isnan(self.floor) else max(own, self.floor)

    @property
    def own_knots(self) -> list[tuple[int, float]]:
        return self.knots if self.base is None else self.base.knots

    def borrowed_doubt(self, n: float) -> float:
        """Where another configuration's shape moved the curve: the whole
        move at n (the knots carry half of it), relative."""
        if self.base is None:
            return 0.0
        a, b = self.base.at(n), self.at(n)
        return 2 * abs(math.log(b / a)) if a > 0 and b > 0 else 0.0

    def borrowed_shift(self, n: float) -> float:
        """The same for a quantity that may be negative or zero (the offset,
        carried by its change in µs): the whole move relative to the value."""
        if self.base is None:
            return 0.0
        here = abs(self.at(n))
        return 2 * abs(self.at(n) - self.base.at(n)) / here if here > 0 else 0.0

    def error_at(self, n: float) -> float:
        """The leave-one-out error scaled to where n falls: it was measured
        over two segments (the left-out knot's neighbours), and a curve's
        miss grows with the stretch it interpolates, so a point in a narrower
        gap gets the share of its gap, most at the gap's middle and none at a
        calibrated population (nan when unknown)."""
        err = self.error
        if math.isnan(err) or len(self.own_knots) < 2:
            return err
        logs = [math.log(k) for k, _ in self.own_knots]
        spans = [logs[i + 1] - logs[i - 1] for i in range(1, len(logs) - 1)]
        span = sum(spans) / len(spans) if spans else logs[-1] - logs[0]
        ln = min(max(math.log(n), logs[0]), logs[-1])
        a, b = next(((a, b) for a, b in itertools.pairwise(logs) if a <= ln <= b), (logs[0], logs[-1]))
        gap = b - a
        # Nothing to interpolate at a calibrated population; most mid-gap.
        shape = 4 * (ln - a) * (b - ln) / (gap * gap) if gap > 0 else 0.0
        return err * min(1.0, gap / span) * shape if span > 0 else err


# Relative error per e-fold of N assumed past the calibrated range when only
# one population was calibrated (no trend to carry).
ONE_POINT_TREND = 0.10


def _position(knots: list[tuple[int, float]], n: float) -> tuple[float, float]:
    """Where n lies for the curve through `knots`: (distance past the
    calibrated range in ln N, 0 inside; 4 t (1 - t) of its place t between
    the two knots around it, 0 at a knot and outside)."""
    ln = math.log(n)
    lo, hi = math.log(knots[0][0]), math.log(knots[-1][0])
    if ln < lo or ln > hi:
        return (lo - ln if ln < lo else ln - hi), 0.0
    for (a, _), (b, _) in itertools.pairwise(knots):
        la, lb = math.log(a), math.log(b)
        if la <= ln <= lb and lb > la:
            t = (ln - la) / (lb - la)
            return 0.0, 4 * t * (1 - t)
    return 0.0, 0.0


def _curve_doubt(curve: Curve, n: float) -> float:
    """The relative error a demand curve may have at n beyond its
    calibration points' own noise: between two knots, up to half the
    change between them (at the middle of the gap: the curve is a straight
    line in ln N, the demand need not be); past the ends, the last
    segment's whole trend (the curve continues half of it); with one knot,
    ONE_POINT_TREND per e-fold."""
    knots = [(k, v) for k, v in curve.knots if v > 0]
    if not knots:
        return 0.0
    past, inside = _position(knots, n)
    if len(knots) == 1:
        return ONE_POINT_TREND * past
    if past > 0:
        end = knots[:2] if n < knots[0][0] else knots[-2:]
        slope = abs(math.log(end[1][1] / end[0][1]) / math.log(end[1][0] / end[0][0]))
        return slope * past
    ln = math.log(n)
    for (a, va), (b, vb) in itertools.pairwise(knots):
        if math.log(a) <= ln <= math.log(b):
            return 0.5 * abs(math.log(vb / va)) * inside
    return 0.0


def demand_doubt(curve: Curve, n: float) -> float:
    """The relative error of a demand curve at n: inside the calibrated range
    the leave-one-out error, where there is one (the measured error of
    interpolating a gap, scaled to this one; half the change across the gap
    stands in only without it); past the range the trend carried on is
    added."""
    return math.hypot(_own_doubt(curve, n), curve.borrowed_doubt(n))


def _own_doubt(curve: Curve, n: float) -> float:
    loo = curve.error_at(n)
    past, _ = _position([k for k in curve.knots if k[1] > 0] or curve.knots, n)
    if math.isnan(loo):
        return _curve_doubt(curve, n)
    if past > 0:
        return math.hypot(loo, _curve_doubt(curve, n))
    return loo

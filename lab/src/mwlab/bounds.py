"""The operational bounds a prediction's intervals are clipped by: what the
measured demands allow, whatever the model says.

For a closed network with think time Z and devices k of demand D_k per
request on c_k servers (the asymptotic and balanced-job bounds of
operational analysis):

- throughput: X <= c_k / D_k for every device (no device busier than all
  its servers), and X <= N / (D + Z) with D the demands a request meets in
  the network added up (no request faster than its own service);
- response time: R >= D, and R >= N / X_max - Z (Little's law at the
  largest throughput).

The demands used are the *lightest* the run measured for each device over
the calibration points, less one point's noise (a measured mean may sit
above the demand it measures); the host CPU's is the lightest any
configuration of the run needed, as measured (the cores are the same for
all, and the least of many means already sits low), so its bound is the
run's own capacity: cores / that demand. All on the most servers the device had at any
point (the cores other processes left change from point to point), carried
by the same rules as the prediction to a configuration that was not
measured; the offset is the most negative one measured. Every measured point
of the configuration obeys the bounds so built, so a bound only cuts off
what the run itself shows to be impossible (a 90% interval whose top is more
than the host's cores can serve). Between two populations measured a demand
may dip below both, so there the lightest the prediction's own doubt allows
counts where it is lighter. Past the populations measured the bound stays at
what was measured: a demand that falls with N could fall further, and a
point carried there may then lie above its bound (the leave-one-out table
shows where). R >= D holds only
between the calibrated populations (below them a worker holds a request for
less time than at any population measured, so the lightest demand measured
is no floor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mwlab.fit import US, Device


@dataclass
class Bounds:
    """What the lightest measured demands allow at one population."""

    n: int
    think_us: float
    # X <= x_max (ops/s): the tightest c / D, and the device that gives it.
    x_max: float
    x_max_by: str
    # R >= r_min (µs): the network's demands and the offset added up.
    r_min: float
    # The servers and the demand (µs) of the device that gives x_max.
    by_servers: float = math.nan
    by_demand_us: float = math.nan

    @property
    def x_asymptote(self) -> float:
        """N / (D + Z): the throughput with no queueing anywhere."""
        t = self.r_min + self.think_us
        return self.n / (t * US) if t > 0 else math.inf

    @property
    def x_top(self) -> float:
        return min(self.x_max, self.x_asymptote)

    @property
    def r_floor(self) -> float:
        """The larger of R >= D and R >= N / X_max - Z."""
        little = self.n / (self.x_max * US) - self.think_us if self.x_max > 0 else 0.0
        return max(self.r_min, little, 0.0)

    def to_dict(self) -> dict[str, float | str]:
        return {"x_max": self.x_top, "x_max_by": self.limit(), "r_min_us": self.r_floor}

    def limit(self) -> str:
        """What gives the throughput bound, in words."""
        if self.x_asymptote < self.x_max:
            return "no queueing: N / (D + Z)"
        if math.isnan(self.by_demand_us):
            return f"capacity of {self.x_max_by}"
        unit = "cores" if "CPU" in self.x_max_by else "servers"
        return f"capacity of {self.x_max_by}: {self.by_servers:.2f} {unit} / {self.by_demand_us:.1f} µs"


def bounds(lightest: list[Device], n: int, think_us: float, offset_us: float) -> Bounds:
    """The bounds at population n from the lightest demands `lightest` and
    the lowest offset measured."""
    caps = [
        (d.servers / (d.demand_us * US), d.name, d.servers, d.demand_us)
        for d in lightest
        if d.demand_us > 0 and d.servers > 0 and not d.delay and not math.isnan(d.demand_us)
    ]
    x_max, by, c, dem = min(caps, default=(math.inf, "", math.nan, math.nan))
    r_min = sum(d.demand_us for d in lightest if d.in_network and d.demand_us > 0) + offset_us
    return Bounds(n, think_us, x_max, by, max(r_min, 0.0), c, dem)


def clip(lo: float, hi: float, b: Bounds, which: str) -> tuple[float, float, bool]:
    """A 90% interval of X (`which` = "x") or R ("r") clipped by the bounds,
    and whether a bound bound it."""
    if which == "x":
        top = b.x_top
        return min(lo, top), min(hi, top), hi > top
    floor = b.r_floor
    return max(lo, floor), max(hi, floor), lo < floor

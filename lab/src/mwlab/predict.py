"""Predictions: what the measured points say about populations and
configurations that were not measured (`mwlab predict`, and the report's
Predictions section).

**Calibration.** For each configuration of a result (its levels of the
factors other than the clients) every device of [`mwlab.fit.devices`] gets a
demand *curve*: its demand per request as a function of the population N
through the demands measured at the calibration points. On a machine the load shares, CPU per request
changes with concurrency (batching, contention), so a demand measured at one
population is not carried to another as a constant. Between calibration
points a curve is a straight line in ln N; outside them it continues half
the last segment's trend (PAST_TREND), and its doubt there is the whole
trend. Its error is the
leave-one-out error at the interior calibration points. The *offset* is what
the devices do not account for (network stack, wake-ups, the client's own
handling; negative where they count time twice, as a worker's holding time
includes CPU time the host CPU counts too): at each calibration point the
measured mean response time minus the network's, carried the same way.

**Prediction.** At a population N the curves give the demands, the closed
network of [`mwlab.fit`] is solved with exact MVA (the offset added to its
response time, X = N / (R + Z)), and the bottleneck is the
device with the largest demand per server (with those within 3% of it).
p50 and p99 are the predicted mean response time times the ratio p50/mean
and p99/mean measured at the nearest calibrated population.

**Configurations not measured** are reached from the nearest measured one by
rules that follow from how a request uses the devices (each rule names its
assumption in the prediction's notes):

- workers (`tmw`) and middlewares (`nmw`): the capacity of the worker pool
  (net threads, event loops, database connections) changes; with another
  number of workers the holding time follows the busy workers k = X · holding
  (on a shared machine a worker holds a request longer the more workers share
  the cores): the calibration points' (k, holding) pairs, straight lines
  between them and held at the ends, solved as a fixed point;
- event loops of the async engine (`middleware.threads`): their capacity;
- servers (`nsvr`): ketama spreads the keys, so the servers' total demand is
  shared by the new number of servers;
- replication: a set touches r servers, so the servers' demand (and their
  share of the host's CPU) scales with get share + set share x r; the
  middleware's work is taken as half fixed per request and half per server
  touched (an assumption, named in the notes);
- any other numeric setting the experiment varied (value or message size):
  each demand and the offset interpolated linearly between the two nearest
  measured levels.

A configuration reached by rules keeps the offset of the lightest calibrated
load (the network stack's part); the offset's growth with N is queueing the
calibrated configuration's own network did not capture, not the target's.
No device may pass its capacity (X <= servers / demand for every device,
also those outside the network: mwmq's host CPU, a memcached server).

Anything else needs a demand that was never observed (a device that did not
exist in the run, a value size never measured) and is refused with the
reason ([`PredictError`]).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from mwlab.bounds import Bounds, bounds, clip
from mwlab.curves import (
    Curve,
    PredictError,
    _between,
    _curve_doubt,
    _line,
    demand_doubt,
)
from mwlab.fit import CLIENT_FACTORS, US, Device, bottleneck, devices, network_centers, num, sweep_label
from mwlab.models import ModelError
from mwlab.models.mva import mva
from mwlab.noise import Noise, noise_of
from mwlab.spec import (
    ExperimentInfo,
    Settings,
    SpecError,
    canonical,
    column_name,
    replication_copies,
    with_values,
)

# The largest population and number of servers predicted: the exact
# solution of a network with multi-server centers takes seconds at 500
# clients and minutes past 2,000, and memory with them.
MAX_CLIENTS = 1000
MAX_SERVERS = 128

# Devices whose capacity is the middleware's threads (per middleware).
MIDDLEWARE_DEVICES = ("workers", "event loops", "net thread", "database connections")


@dataclass
class Calibration:
    """One configuration's demand curves."""

    sweep: str
    levels: dict[str, Any]
    settings: Settings
    ns: list[int]
    think_us: float
    curves: dict[str, Curve]
    servers: dict[str, float]
    in_network: dict[str, bool]
    # What the devices do not account for, added to the response time
    # (negative where they count some time twice: a worker's holding time
    # includes its own CPU time, which the host CPU counts too).
    offset: Curve
    # (N, p50 / mean, p99 / mean) at each calibration point
    tails: list[tuple[int, float, float]] = field(default_factory=list)
    # The workers' holding time against the busy workers k = X S, one pair
    # per calibration point, by k: on a shared machine a worker holds a
    # request longer the more workers share the cores.
    holding: list[tuple[float, float]] = field(default_factory=list)
    # The configuration whose shape carries the curves past the populations
    # measured here ("" when none: `mwlab.nearest.widened`).
    borrowed: str = ""
    # Each device's servers at each calibrated population (N, servers, those
    # at one N averaged): the host CPU's are the cores other processes left,
    # which change from point to point; between them a straight line in ln N,
    # held at the ends.
    capacity: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # The run-to-run noise of the calibration points.
    noise: Noise = field(default_factory=lambda: Noise(float("nan"), float("nan"), 1.0, 0, "not measured"))
    # The lightest demand (µs) each device had in any configuration this one
    # is predicted beside (`on_machine`): the host CPU's bound is the
    # lightest of its (the cores are the same whatever the configuration),
    # and no device's demand is taken to dip below it between populations.
    machine: dict[str, float] = field(default_factory=dict)

    def holding_at(self, k: float) -> float | None:
        """The holding time (µs) with k busy workers: straight lines between the
        calibration points, held at the ends (a slope measured over a narrow
        range of k, extrapolated to four times the workers, was off by 60%);
        None with fewer than two busy levels."""
        return _between(self.holding, k) if len(self.holding) >= 2 else None

    def servers_at(self, name: str, n: float) -> float:
        """The servers of a device at population n (its average where the
        calibration kept no per-point figure)."""
        pts = self.capacity.get(name)
        if not pts:
            return self.servers[name]
        return _between([(math.log(k), c) for k, c in pts], math.log(n))

    def most_servers(self, name: str) -> float:
        """The most servers a device had at any calibration point."""
        return max((c for _, c in self.capacity.get(name, [])), default=self.servers[name])

    def devices_at(self, n: float) -> list[Device]:
        return [
            Device(
                name,
                c.at(n),
                self.servers_at(name, n),
                in_network=self.in_network[name],
                delay=name == "link delay",
            )
            for name, c in self.curves.items()
        ]


@dataclass
class Prediction:
    """One predicted point."""

    config: dict[str, Any]
    n: int
    x: float
    r_us: float
    p50_us: float
    p99_us: float
    bottleneck: str
    basis: str
    notes: list[str]
    devices: list[Device]
    # The 90% interval of each predicted figure, and the relative standard
    # deviations (of ln X and ln R) it was built from, by source.
    x_lo: float = float("nan")
    x_hi: float = float("nan")
    r_lo: float = float("nan")
    r_hi: float = float("nan")
    p50_lo: float = float("nan")
    p50_hi: float = float("nan")
    p99_lo: float = float("nan")
    p99_hi: float = float("nan")
    uncertainty: dict[str, dict[str, float]] = field(default_factory=dict)
    # The think time, the spread of the tail ratios (a part of the p50/p99
    # intervals' width) and the operational bounds the intervals are clipped by.
    think_us: float = 0.0
    tail_sigma: float = 0.0
    bounds: Bounds | None = None
    # Which intervals a bound clipped ("x", "r").
    clipped: list[str] = field(default_factory=list)

    def covers(self, x: float, r_us: float) -> bool:
        """Whether measured throughput and response time are both inside the intervals."""
        return self.x_lo <= x <= self.x_hi and self.r_lo <= r_us <= self.r_hi

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "N": self.n,
            "x": self.x,
            "x_lo": self.x_lo,
            "x_hi": self.x_hi,
            "r_us": self.r_us,
            "r_lo": self.r_lo,
            "r_hi": self.r_hi,
            "p50_us": self.p50_us,
            "p50_lo": self.p50_lo,
            "p50_hi": self.p50_hi,
            "p99_us": self.p99_us,
            "p99_lo": self.p99_lo,
            "p99_hi": self.p99_hi,
            "uncertainty": self.uncertainty,
            "bounds": self.bounds.to_dict() if self.bounds else None,
            "clipped_by_bounds": self.clipped,
            "bottleneck": self.bottleneck,
            "calibrated_on": self.basis,
            "notes": self.notes,
            "demands_us": {d.name: d.demand_us for d in self.devices},
            "servers": {d.name: d.servers for d in self.devices},
        }


def column(key: str) -> str:
    """A setting's column in result tables, or its dotted key where the short name is ambiguous."""
    c = column_name(key)
    try:
        return c if canonical(c) == key else key
    except SpecError:
        return key


def _levels(row: pd.Series, factors: list[str]) -> dict[str, Any]:
    return {f: _plain(row[f]) for f in factors if f not in CLIENT_FACTORS and f in row}


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def config_settings(base: Settings, levels: dict[str, Any]) -> Settings:
    """The settings of a configuration: the experiment's with its factor levels."""
    try:
        s = with_values(base, levels, "configuration")
    except SpecError as e:
        raise PredictError(str(e)) from None
    r = replication(s)
    if s.mq and r != 1:
        raise PredictError("the message-queue system has no replication")
    if r > s.topology.servers:
        raise PredictError(f"replication {r} needs at least as many servers (nsvr={s.topology.servers})")
    if s.middleware.replication != r:
        # The seed levels as copies, as the runner resolves them: none is 1.
        s = with_values(s, {"middleware.replication": r}, "configuration")
    return s


def replication(s: Settings) -> int:
    """Copies of each key: the seed levels none / half / all resolved."""
    return int(replication_copies(s.middleware.replication, s.topology.servers))


def calibrate(rows: list[pd.Series], info: ExperimentInfo, sweep: str = "") -> Calibration:
    """Demand curves from the measured points `rows` of one configuration."""
    rows = [r for r in rows if usable(r)]
    if not rows:
        raise PredictError(f"configuration {sweep or '(the only one)'}: no measured point to calibrate on")
    base = info.settings
    levels = _levels(rows[0], info.columns)
    settings = config_settings(base, levels)
    ns: list[int] = []
    per: dict[str, list[tuple[int, float]]] = {}
    servers: dict[str, list[float]] = {}
    capacity: dict[str, list[tuple[int, float]]] = {}
    in_network: dict[str, bool] = {}
    offsets: list[tuple[int, float]] = []
    tails: list[tuple[int, float, float]] = []
    busy: list[tuple[float, float]] = []
    for row in rows:
        devs = devices(row, base)
        if not devs:
            continue
        n = int(num(row, "N"))
        ns.append(n)
        for d in devs:
            per.setdefault(d.name, []).append((n, d.demand_us))
            servers.setdefault(d.name, []).append(d.servers)
            capacity.setdefault(d.name, []).append((n, d.servers))
            in_network[d.name] = d.in_network
            if d.name == "workers":
                busy.append((num(row, "client_tput") * d.demand_us * US, d.demand_us))
        mean = num(row, "client_rt_mean_us")
        _, r_model = _solve(devs, n, num(row, "Z_us", 0.0), 0.0)
        offsets.append((n, mean - r_model))
        tails.append((n, num(row, "client_rt_p50_us") / mean, num(row, "client_rt_p99_us") / mean))
    if not ns:
        raise PredictError(f"configuration {sweep or '(the only one)'}: no device was measured")
    curves = {
        name: Curve.fit(pairs) for name, pairs in per.items() if any(not math.isnan(v) for _, v in pairs)
    }
    return Calibration(
        sweep=sweep,
        levels=levels,
        settings=settings,
        ns=sorted(ns),
        think_us=sum(num(r, "Z_us", 0.0) for r in rows) / len(rows),
        curves=curves,
        servers={k: sum(v) / len(v) for k, v in servers.items()},
        in_network=in_network,
        offset=Curve.fit(offsets),
        tails=sorted(tails),
        holding=_busy_levels(busy),
        noise=noise_of(rows),
        capacity={name: Curve.fit(pairs).knots for name, pairs in capacity.items()},
    )


def _busy_levels(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(busy workers, holding time) pairs by busy workers, pairs closer than a
    tenth of a worker averaged."""
    points = sorted((k, h) for k, h in points if not (math.isnan(k) or math.isnan(h)))
    out: list[list[float]] = []
    for k, h in points:
        if out and k - out[-1][0] < 0.1:
            n = out[-1][2]
            out[-1] = [(out[-1][0] * n + k) / (n + 1), (out[-1][1] * n + h) / (n + 1), n + 1]
        else:
            out.append([k, h, 1])
    return [(k, h) for k, h, _ in out]


def configurations(agg: pd.DataFrame, info: ExperimentInfo) -> dict[str, list[pd.Series]]:
    """The measured points of a result by configuration (its levels of every
    factor but the clients)."""
    groups: dict[str, list[pd.Series]] = {}
    for _, r in agg.iterrows():
        if usable(r):
            groups.setdefault(sweep_label(r, info.columns), []).append(r)
    return groups


def usable(row: pd.Series) -> bool:
    """Whether a point can calibrate or be predicted: a population, and a
    throughput and mean response time that were measured and are positive
    (a run that completed no request has neither)."""
    x, r = num(row, "client_tput"), num(row, "client_rt_mean_us")
    return num(row, "N", 0) >= 1 and 0 < x < math.inf and 0 < r < math.inf


def unusable(agg: pd.DataFrame) -> list[str]:
    """The points left out of every prediction, each with why."""
    out = []
    for _, r in agg.iterrows():
        if not usable(r):
            x, rt = num(r, "client_tput"), num(r, "client_rt_mean_us")
            out.append(f"{r.get('point', '?')}: no usable throughput or response time (X {x:g}, R {rt:g} µs)")
    return out


def calibrations(
    agg: pd.DataFrame, info: ExperimentInfo, only_n: set[int] | None = None
) -> list[Calibration]:
    """A calibration per configuration of the result (optionally only on the populations `only_n`)."""
    return [
        calibrate([r for r in rows if only_n is None or int(num(r, "N")) in only_n], info, label)
        for label, rows in configurations(agg, info).items()
    ]


def with_changes(levels: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Factor levels with `changes` (canonical keys) applied, under their column names."""
    return {**levels, **{column(k): v for k, v in changes.items()}}


def _set_fraction(s: Settings) -> float:
    sets, gets = (float(x) for x in s.workload.ratio.split(":"))
    return sets / (sets + gets) if sets + gets > 0 else 0.0


def _capacity(devs: list[Device], names: tuple[str, ...], factor: float) -> None:
    for d in devs:
        if d.name in names:
            d.servers *= factor


def _emulated(devs: list[Device]) -> bool:
    return any(d.name.startswith(("CPU of ", "link ")) for d in devs)


STRUCTURAL = {
    "topology.middlewares",
    "middleware.workers",
    "middleware.threads",
    "topology.servers",
    "middleware.replication",
    "middleware.db_pool",
}


def transform(devs: list[Device], old: Settings, new: Settings, notes: list[str]) -> list[Device]:
    """The devices of `old` as they would be under `new`, by the rules in the module's doc."""
    devs = [Device(d.name, d.demand_us, d.servers, in_network=d.in_network, delay=d.delay) for d in devs]
    names = {d.name for d in devs}
    o, n = old, new
    if n.topology.middlewares != o.topology.middlewares:
        if n.topology.middlewares < 1:
            raise PredictError("nmw=0: no middleware; the clients' path without one was never observed")
        if _emulated(devs):
            raise PredictError(
                "a middleware on an emulated host of its own: that host's CPU and links were never observed"
            )
        if o.topology.middlewares < 1:
            raise PredictError("no middleware in the measured configuration: its devices were never observed")
        _capacity(devs, MIDDLEWARE_DEVICES, n.topology.middlewares / o.topology.middlewares)
        notes.append(
            f"middlewares {o.topology.middlewares} -> {n.topology.middlewares}: their threads' capacity"
        )
    if n.middleware.workers != o.middleware.workers:
        if "workers" not in names:
            raise PredictError(
                "middleware.workers: the measured configuration has no worker pool"
                + (
                    " (the async engine's event loops are middleware.threads)"
                    if "event loops" in names
                    else ""
                )
            )
        if n.mq and "database connections" not in names and n.db_pool < n.middleware.workers:
            raise PredictError(
                f"{n.middleware.workers} workers on a pool of {n.db_pool} database connections: the wait for "
                "a connection was never observed (every worker had one); "
                "measure with fewer connections than workers"
            )
        _capacity(devs, ("workers",), n.middleware.workers / o.middleware.workers)
        notes.append(f"workers {o.middleware.workers} -> {n.middleware.workers}: the pool's capacity")
    if n.middleware.db_pool != o.middleware.db_pool and n.mq:
        if "database connections" not in names:
            if n.db_pool < n.middleware.workers:
                raise PredictError(
                    "a pool smaller than the workers: the wait for a connection was never observed"
                )
        else:
            _capacity(devs, ("database connections",), n.db_pool / o.db_pool)
            notes.append(f"database connections {o.db_pool} -> {n.db_pool}")
    if n.middleware.threads != o.middleware.threads:
        if "event loops" not in names:
            raise PredictError(
                "middleware.threads: the measured configuration has no event loops (engine pool)"
            )
        if n.middleware.threads == 0:
            raise PredictError("middleware.threads=0 (half the cores of the host): give the number of loops")
        old_loops = next(d.servers for d in devs if d.name == "event loops") / max(o.topology.middlewares, 1)
        _capacity(devs, ("event loops",), n.middleware.threads / old_loops)
        notes.append(f"event loops {old_loops:g} -> {n.middleware.threads}: their capacity")
    servers = [d for d in devs if d.name.startswith("server ")]
    if n.topology.servers != o.topology.servers:
        if n.topology.servers > MAX_SERVERS:
            raise PredictError(f"nsvr={n.topology.servers}: at most {MAX_SERVERS} servers are predicted")
        if n.mq:
            raise PredictError("topology.servers: the message-queue system has no memcached servers")
        if not servers:
            raise PredictError("topology.servers: the servers' CPU was not measured in this result")
        if _emulated(devs):
            raise PredictError(
                "a server on an emulated host of its own: that host's CPU and links were never observed"
            )
        total = sum(d.demand_us for d in servers)
        devs = [d for d in devs if not d.name.startswith("server ")]
        servers = [Device(f"server {i}", total / n.topology.servers, 1) for i in range(n.topology.servers)]
        devs += servers
        notes.append(
            f"servers {o.topology.servers} -> {n.topology.servers}: "
            "keys spread evenly, the servers' demand shared"
        )
    r_old, r_new = replication(o), replication(n)
    if r_new != r_old:
        if not servers:
            raise PredictError("replication: the servers' CPU was not measured in this result")
        f = _set_fraction(n)
        scale = ((1 - f) + f * r_new) / ((1 - f) + f * r_old)
        extra = sum(d.demand_us for d in servers) * (scale - 1)
        for d in devs:
            if d.name.startswith("server "):
                d.demand_us *= scale
            elif d.name == "host CPU":
                d.demand_us += extra
            elif d.name in MIDDLEWARE_DEVICES:
                d.demand_us *= (1 + scale) / 2
        notes.append(
            f"replication {r_old} -> {r_new}: servers' demand x{scale:.3f} (set share {f:.3f}); "
            "assumed: the middleware's work is half per request, half per server touched"
        )
    return devs


def _solve(devs: list[Device], n: int, think_us: float, offset_us: float) -> tuple[float, float]:
    """Throughput and mean response time (µs): MVA of the devices in the
    network, the offset added to the response time, and no device outside
    the network past its capacity (X <= servers / demand for every device:
    the host CPU of the message-queue system, a memcached server)."""
    try:
        res = mva(network_centers(devs, 0.0), think_us * US, n)
    except ModelError as e:
        raise PredictError(f"the model cannot be solved: {e}") from None
    r = max(res.response_time[-1] / US + offset_us, 1e-3)
    x = n / ((r + think_us) * US)
    cap = min(
        (d.servers / (d.demand_us * US) for d in devs if d.demand_us > 0 and d.servers > 0 and not d.delay),
        default=x,
    )
    if x > cap:
        x, r = cap, n / cap / US - think_us
    return x, r


def _tail(cal: Calibration, n: int) -> tuple[float, float]:
    _, p50, p99 = min(cal.tails, key=lambda t: (abs(math.log(t[0]) - math.log(n)), t[0]))
    return p50, p99


def predict_one(
    cal: Calibration,
    n: int,
    target: Settings | None = None,
    config: dict | None = None,
    *,
    finish: bool = True,
) -> Prediction:
    """The prediction at population n under `target` (default: the
    calibrated configuration), with its intervals clipped by the bounds
    (`finish=False`: no intervals yet; a blend of two predictions makes
    them from its parts' uncertainties)."""
    if target is not None and target == cal.settings:
        # A change that changes nothing (replication=none where one copy was
        # measured): the calibrated configuration itself.
        target = None
    notes: list[str] = []
    devs = cal.devices_at(n)
    if target is not None:
        devs = transform(devs, cal.settings, target, notes)
    steps = rule_steps(cal.settings, target) if target is not None else []
    if n > cal.ns[-1] or n < cal.ns[0]:
        how = (
            f"with half the change {cal.borrowed} measured there"
            if cal.borrowed
            else "with half their last trend"
            if len(cal.ns) > 1
            else "as measured there"
        )
        measured = f"{cal.ns[0]}..{cal.ns[-1]}" if len(cal.ns) > 1 else f"N={cal.ns[0]} only"
        notes.append(f"N={n} outside the calibrated {measured}: demands carried from the nearest end {how}")
    elif cal.borrowed and n not in cal.ns:
        notes.append(
            f"N={n} between the calibrated populations: the demands' straight lines bent by half "
            f"the departure {cal.borrowed} measured there"
        )
    notes += _shared_cores(cal, n)
    # A configuration reached by rules: the offset's growth with N may be the
    # calibrated configuration's own queueing or not; half of it is carried,
    # the other half counted as doubt (`offset_gap`).
    offset, offset_gap = cal.offset.at(n), 0.0
    if target is not None:
        light = cal.offset.at(cal.ns[0])
        offset, offset_gap = (offset + light) / 2, abs(offset - light) / 2
    x, r = _solve(devs, n, cal.think_us, offset)
    pool = next((d for d in devs if d.name == "workers"), None)
    if target is None and pool is not None and len(cal.holding) >= 2 and not cal.ns[0] <= n <= cal.ns[-1]:
        # Past the calibrated populations the busy workers k = X S move past
        # those measured, and the holding time with them: a straight line
        # in k through the nearest two levels, continued (on a shared
        # machine each busy worker adds the same contention for the cores).
        floor = 0.25 * min(h for _, h in cal.holding)
        x, r = _settle(
            pool,
            lambda k: max(_line(cal.holding, k), floor),
            lambda: _solve(devs, n, cal.think_us, offset),
            (x, r),
            notes,
        )
        notes.append("the workers' holding time follows the busy workers past the calibrated ones")
    elif pool is not None and pool.servers != cal.servers.get("workers"):
        if len(cal.holding) < 2:
            notes.append(
                "the workers' holding time as measured at this N (one busy level calibrated: "
                "how it changes with the busy workers was never observed)"
            )
        else:
            # Another pool size: the holding time follows the busy workers k
            # (measured at the calibration points), found as a fixed point.
            x, r = _settle(pool, cal.holding_at, lambda: _solve(devs, n, cal.think_us, offset), (x, r), notes)
            k = ", ".join(f"{k:.1f} -> {h:.0f} µs" for k, h in cal.holding)
            notes.append(f"the workers' holding time follows the busy workers (calibrated: {k})")
    for d in devs:
        d.u_predicted = x * d.demand_us * US / d.servers if d.servers > 0 else float("nan")
    p50, p99 = _tail(cal, n)
    pred = Prediction(
        config=config if config is not None else dict(cal.levels),
        n=n,
        x=x,
        r_us=r,
        p50_us=r * p50,
        p99_us=r * p99,
        bottleneck=bottleneck(devs),
        basis=(cal.sweep or "the measured configuration")
        + (f", shaped by {cal.borrowed}" if cal.borrowed and n not in cal.ns else ""),
        notes=notes,
        devices=devs,
        uncertainty=uncertainty(cal, devs, n, x, r, offset, steps=steps, offset_gap=offset_gap),
        think_us=cal.think_us,
        tail_sigma=_tail_spread(cal, n),
        bounds=_bounds_of(cal, n, target),
    )
    if finish:
        finish_intervals(pred)
    return pred


# The host CPU's cores at two calibration points differing by more than this
# (others took some while the run measured) is said: it moves the predictions.
SHARED_CORES = 0.10


def _shared_cores(cal: Calibration, n: int) -> list[str]:
    """A note where other processes took part of the host CPU at some
    calibration points and not at others: each point keeps the cores it had,
    and a population between them gets a straight line in ln N of theirs."""
    out = []
    for name, pts in cal.capacity.items():
        if not name.startswith("host CPU") or len(pts) < 2:
            continue
        lo, hi = min(c for _, c in pts), max(c for _, c in pts)
        if hi > 0 and lo < (1 - SHARED_CORES) * hi:
            at = ", ".join(f"{c:.2f} at N = {k}" for k, c in pts)
            out.append(
                f"other processes took part of the {name} while some points were measured: it had {at} "
                "cores free (see the 'no interference' check); the predictions use those"
            )
    return out


def _settle(
    pool: Device,
    holding: Callable[[float], float | None],
    solve: Callable[[], tuple[float, float]],
    xr: tuple[float, float],
    notes: list[str],
) -> tuple[float, float]:
    """The workers' holding time as the fixed point of `holding` (of the
    busy workers k = X S) and the network solved with it (`solve`), halving
    each step; a note when 100 steps do not bring it within 0.1%."""
    x, r = xr
    for _ in range(100):
        want = holding(x * pool.demand_us * US)
        if want is None or abs(want - pool.demand_us) < 0.001 * pool.demand_us:
            break
        pool.demand_us = 0.5 * (pool.demand_us + want)
        x, r = solve()
    else:
        if want is not None and abs(want - pool.demand_us) > 0.01 * pool.demand_us:
            notes.append(
                f"the workers' holding time did not settle in 100 steps (last {pool.demand_us:.1f} µs, "
                f"{want:.1f} wanted): the prediction is its last step"
            )
    return x, r


def on_machine(cal: Calibration, others: list[Calibration]) -> Calibration:
    """`cal` with the lightest demand each host CPU had in it or in `others`
    (the same run's configurations: the same machine). A host's cores serve
    at most c / D with D the least CPU a request needed anywhere in the run:
    the CPU per request falls as load batches the work (quickstart's tmw=8
    needed 57.6, 47.1 and 42.0 µs at N = 2, 8 and 24), so a bound from one
    configuration's lighter loads cut off what it measured at a heavier one
    (N = 24 left out: bounded at 43,366 ops/s, measured 44,004), while
    another configuration had already needed less (tmw=2: 38.5 µs at N = 8)."""
    return replace(cal, machine=machine_floor([cal, *others]))


def machine_floor(cals: list[Calibration]) -> dict[str, float]:
    """The lightest demand (µs) each device had in any of `cals`."""
    floor: dict[str, float] = {}
    for c in cals:
        for name, curve in c.curves.items():
            v = min((v for _, v in curve.own_knots if v > 0), default=math.inf)
            floor[name] = min(floor.get(name, math.inf), v)
    return {k: v for k, v in floor.items() if math.isfinite(v)}


def _lightest(cal: Calibration, n: int, target: Settings | None) -> list[Device]:
    """Each device at the lightest demand the calibration measured, less a
    point's noise (a measured mean may sit above the demand it measures);
    the host CPU at the lightest any configuration of the run needed, as
    measured (the least of many noisy means already sits low, and the
    run's capacity bound is cores / that demand),
    on the most servers it had at any point, with the holding time at the
    lightest busy level; carried to `target` by the same rules as the
    prediction. Between two populations it measured a demand may dip below
    both (a worker held for 60 µs at N = 8 where N = 2 and 24 took 71 and
    66): there the lightest the prediction's own demand allows within its 90%
    doubt (`demand_doubt`) counts, where that is lighter, but not below the
    lightest the run measured for the device anywhere (less a point's
    noise: a noisy run's doubt had let a bound double). Past them the
    bound stays at what the run measured: a demand that falls with N could
    fall further, but no measurement of this configuration says so; the host
    CPU's is the lightest any configuration of the run needed
    (`on_machine`), since the cores are the same."""
    nx = cal.noise.point_cv("x")
    nx = 0.0 if math.isnan(nx) else nx

    def low(name: str, c: Curve) -> float:
        own = c.own_knots
        measured = min((v for _, v in own if v > 0), default=0.0)
        anywhere = min(measured, cal.machine.get(name, measured))
        if name.startswith("host CPU"):
            measured = anywhere
        else:
            measured *= math.exp(-Z90 * nx)
            anywhere *= math.exp(-Z90 * nx)
        if not own or any(k == n for k, _ in own) or not own[0][0] < n < own[-1][0]:
            return measured
        doubt = demand_doubt(c, n)
        doubt = math.hypot(nx, 0.0 if math.isnan(doubt) else doubt)
        return min(measured, max(c.at(n) * math.exp(-Z90 * doubt), anywhere))

    devs = [
        Device(
            name,
            low(name, c),
            cal.most_servers(name),
            in_network=cal.in_network[name],
            delay=name == "link delay",
        )
        for name, c in cal.curves.items()
    ]
    if target is not None:
        devs = transform(devs, cal.settings, target, [])
        pool = next((d for d in devs if d.name == "workers"), None)
        if pool is not None and pool.servers < cal.servers.get("workers", 0.0):
            # Fewer workers than measured contend less for the cores: a
            # worker may hold a request for less than any measured holding
            # time (8 workers' 91.9 µs bounded 2 workers below the 37,898
            # ops/s they measured), so the pool bounds nothing.
            pool.demand_us = math.nan
        elif pool is not None and cal.holding:
            pool.demand_us = min(pool.demand_us, *(h for _, h in cal.holding))
    return devs


def _bounds_of(cal: Calibration, n: int, target: Settings | None) -> Bounds:
    """The bounds at n. R >= D (and X <= N / (D + Z)) only between the
    calibrated populations: below them a worker holds a request for less
    time than at any population measured (fewer threads share the cores),
    so the lightest demand measured is no floor there, and above them
    queueing makes R far larger than D anyway."""
    b = bounds(_lightest(cal, n, target), n, cal.think_us, min(v for _, v in cal.offset.knots))
    if not cal.ns[0] <= n <= cal.ns[-1]:
        b.r_min = 0.0
    return b


def finish_intervals(pred: Prediction) -> None:
    """The 90% intervals from the prediction's uncertainty, clipped by its
    bounds (a note says which bound bound which interval)."""
    sx, sr = _total(pred.uncertainty["x"]), _total(pred.uncertainty["r"])
    st = math.hypot(sr, pred.tail_sigma) if not math.isnan(sr) else sr
    pred.x_lo, pred.x_hi = _interval(pred.x, sx)
    pred.r_lo, pred.r_hi = _interval(pred.r_us, sr)
    pred.p50_lo, pred.p50_hi = _interval(pred.p50_us, st)
    pred.p99_lo, pred.p99_hi = _interval(pred.p99_us, st)
    if math.isnan(sx) or math.isnan(sr):
        pred.notes.append("no interval: the calibration's noise was not measured")
        return
    b = pred.bounds
    if b is None:
        return
    pred.clipped = []
    # Past the populations measured a demand carried on its trend may fall
    # below every one measured: the prediction itself is held to the bounds
    # too (never outside its own interval).
    pred.x = min(pred.x, b.x_top)
    if b.r_floor > pred.r_us:
        pred.r_us = b.r_floor
    pred.x_lo, pred.x_hi, cx = clip(pred.x_lo, pred.x_hi, b, "x")
    pred.r_lo, pred.r_hi, cr = clip(pred.r_lo, pred.r_hi, b, "r")
    if cx:
        pred.clipped.append("x")
        pred.notes.append(
            f"X's interval ends at {b.x_top:,.0f} ops/s: the {b.limit()} "
            "(the lightest demands the run measured)"
        )
    if cr:
        pred.clipped.append("r")
        pred.notes.append(
            f"R's interval starts at {b.r_floor / 1e3:.3f} ms: no request is faster at this X bound"
        )


def _interval(value: float, sigma: float) -> tuple[float, float]:
    """The 90% interval of a positive figure whose logarithm has standard
    deviation `sigma`; (0, inf) when the calibration was so noisy that the
    bound does not fit in a float (runs that measured the machine's load
    more than the system)."""
    try:
        hi = value * math.exp(Z90 * sigma)
    except OverflowError:
        hi = math.inf
    return value * math.exp(-Z90 * sigma), hi


# The two-sided 90% quantile of the normal distribution.
Z90 = 1.6448536269514722
# Relative error assumed per doubling (or halving) of a setting a rule
# carries a prediction across to a configuration that was not measured (its
# error is not measured by the run): a rule carried further is trusted less.
RULE_ERROR = 0.10


def _total(parts: dict[str, float]) -> float:
    vals = [v for v in parts.values() if not math.isnan(v)]
    if "noise" in parts and math.isnan(parts["noise"]):
        return float("nan")
    return math.sqrt(sum(v * v for v in vals))


def _tail_spread(cal: Calibration, n: int) -> float:
    """How much the p99 / mean ratio moves between the two calibrated
    populations nearest n (half the relative difference)."""
    near = sorted(cal.tails, key=lambda t: (abs(math.log(t[0]) - math.log(n)), t[0]))[:2]
    if len(near) < 2 or not all(t[2] > 0 for t in near):
        return 0.0
    return 0.5 * abs(math.log(near[0][2] / near[1][2]))


def rule_steps(old: Settings, new: Settings) -> list[float]:
    """How far each rule carries a prediction: |log2(new / old)| of every
    structural setting that changed (workers, middlewares, loops, database
    connections, servers, copies of a key)."""
    pairs = [
        (old.topology.middlewares, new.topology.middlewares),
        (old.middleware.workers, new.middleware.workers),
        (old.middleware.threads, new.middleware.threads),
        (old.topology.servers, new.topology.servers),
        (replication(old), replication(new)),
    ]
    if new.mq:
        pairs.append((old.db_pool, new.db_pool))
    return [abs(math.log2(b / a)) for a, b in pairs if a != b and a > 0 and b > 0]


def uncertainty(
    cal: Calibration,
    devs: list[Device],
    n: int,
    x: float,
    r: float,
    offset: float,
    steps: list[float] | None = None,
    offset_gap: float = 0.0,
) -> dict[str, dict[str, float]]:
    """The relative standard deviations of the predicted ln X and ln R, by source:

    - `noise`: the run-to-run noise of a measured point (a mean of as many
      runs as the calibration's points), which a measurement of the
      prediction would carry too;
    - `calibration`: the calibration points' noise carried through the
      model: each demand (and the offset) moved by its standard error, the
      model solved again, the effects added in quadrature;
    - `curve`: the demand curves' leave-one-out error (with three or more
      calibrated populations) and the gap between calibrated populations
      or past them (`_curve_doubt`), each weighted by how much X and R
      depend on that demand;
    - `rules`: RULE_ERROR per doubling for each rule that carried the
      prediction to a configuration that was not measured (`rule_steps`),
      and the part of the offset a rule cannot tell (`offset_gap`, µs)."""
    rule = RULE_ERROR * math.sqrt(sum(s * s for s in steps or []))
    gap_r = offset_gap / r if r > 0 else 0.0
    gap_x = offset_gap / (r + cal.think_us) if r + cal.think_us > 0 else 0.0
    nx, nr = cal.noise.point_cv("x"), cal.noise.point_cv("r")
    sens: list[tuple[float, float, Curve | None]] = []
    h = 0.02
    # Alike devices (a hundred servers of one demand) move X and R alike:
    # the network is solved once for each kind.
    seen: dict[tuple[float, float, bool], tuple[float, float]] = {}
    for d in devs:
        if d.demand_us <= 0 or d.delay:
            continue
        kind = (d.demand_us, d.servers, d.in_network)
        if kind not in seen:
            saved = d.demand_us
            d.demand_us = saved * (1 + h)
            try:
                x2, r2 = _solve(devs, n, cal.think_us, offset)
            finally:
                d.demand_us = saved
            seen[kind] = (math.log(x2 / x) / math.log(1 + h), math.log(r2 / r) / math.log(1 + h))
        sens.append((*seen[kind], cal.curves.get(d.name)))
    # The offset: its noise is that of the measured response time it came from.
    r_off = nr * abs(offset) / r if r > 0 else 0.0
    x_off = r_off * r / (r + cal.think_us) if r + cal.think_us > 0 else 0.0
    cal_x = math.sqrt(sum((sx * nx) ** 2 for sx, _, _ in sens) + x_off**2)
    cal_r = math.sqrt(sum((sr * nx) ** 2 for _, sr, _ in sens) + r_off**2)
    cx = cr = 0.0
    for sx, sr, curve in sens:
        if curve is None:
            continue
        doubt = demand_doubt(curve, n)
        cx += (sx * doubt) ** 2
        cr += (sr * doubt) ** 2
    off_doubt = (
        math.hypot(
            _curve_doubt(Curve([(k, abs(v) + 1e-9) for k, v in cal.offset.knots]), n),
            cal.offset.borrowed_shift(n),
        )
        if offset
        else 0.0
    )
    # The offset is part of R, and X = N / (R + Z): its doubt moves both.
    cr += (off_doubt * abs(offset) / r) ** 2 if r > 0 else 0.0
    cx += (off_doubt * abs(offset) / (r + cal.think_us)) ** 2 if r + cal.think_us > 0 else 0.0
    return {
        "x": {
            "noise": nx,
            "calibration": cal_x,
            "curve": math.sqrt(cx),
            "rules": math.hypot(rule, gap_x),
        },
        "r": {
            "noise": nr,
            "calibration": cal_r,
            "curve": math.sqrt(cr),
            "rules": math.hypot(rule, gap_r),
        },
    }


def parse_changes(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings into canonical keys and values (numbers as numbers)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise PredictError(
                f"--set {item!r}: expected KEY=VALUE (e.g. tmw=8, nsvr=4, workload.value_size=4096)"
            )
        k, v = item.split("=", 1)
        try:
            key = canonical(k.strip())
        except SpecError as e:
            raise PredictError(str(e)) from None
        if key in out:
            raise PredictError(f"--set {k}: {key} is given twice; give each setting once")
        if key.startswith("run.") or key.startswith("hosts."):
            raise PredictError(f"--set {k}: {key} does not change the system; predictions are of the system")
        if key in (
            "topology.virtual_clients",
            "topology.threads",
            "topology.instances",
            "topology.client_machines",
        ):
            raise PredictError(f"--set {k}: give the total number of clients with --clients N1,N2,...")
        v = v.strip()
        try:
            out[key] = int(v)
        except ValueError:
            try:
                out[key] = float(v)
            except ValueError:
                out[key] = v
    return out


def seed_view(rows: list[pd.Series]) -> list[dict[str, Any]]:
    """The seed reports' single-queue prediction: the service time from the
    run with the fewest clients, then M/M/1 with the measured arrival rate
    (R = S / (1 - X S)), against the measured response time."""
    rows = sorted(rows, key=lambda r: num(r, "N", 0))
    if not rows:
        return []
    s = num(rows[0], "client_rt_mean_us") * US
    out = []
    for r in rows:
        x, measured = num(r, "client_tput"), num(r, "client_rt_mean_us")
        rho = x * s
        pred = s / (1 - rho) / US if rho < 1 else float("inf")
        out.append(
            {
                "N": int(num(r, "N")),
                "rho": rho,
                "r_us": pred,
                "r_error": (pred - measured) / measured
                if measured and not math.isinf(pred)
                else float("inf"),
            }
        )
    return out

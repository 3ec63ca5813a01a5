"""Models fitted to measured experiments (the report's Models section, and
`model.csv` / `utilization.csv`).

Every resource a request uses is a **device** with a demand per request
(µs) and a capacity (servers), measured at each point:

- the host CPU: CPU time per request of every process the lab started
  (sampled per process and thread, `cpu.csv`), capacity = usable cores minus
  the cores other processes took meanwhile;
- the worker pool of the middlewares: the workers' holding time per request
  (the middleware's service time, t_reply - t_dequeue), capacity = workers;
- each middleware's net thread, each memcached server (one worker thread)
  and the load generator's threads: their CPU time per request, capacity =
  their threads.

The closed network that predicts throughput and response time at a point is
the think time, a delay for what no device accounts for (network stack,
wake-ups, the client's own handling), the host CPU and the worker pool as
multi-server centers, and the links and quota'd host CPUs of emulated hosts,
solved with MVA at the point's population. A worker holds its request
through the CPU the worker and the servers spend on it (`hold_cpu_us`), so
that CPU is in the measured holding time already: it is counted there once,
and the host CPU center serves the rest of the request's CPU with the cores
the holds leave it (`_solve`, a fixed point in X). Counted in both, it made
every light-load point too slow by up to 22% whatever the delay. The demands
are measured at each point; the delay is the one fitted parameter, fitted for
the whole experiment by least squares over the points below their knee (all
points when none is). The single-threaded devices are not in the network
(their CPU time is already in the host CPU's), but they are checked as
bottlenecks: the **bottleneck** is the device with the largest demand per
server, named together with every device within 3% of it, so two identical
servers are named together, never one alone.

What the network leaves out, measured (`handoffs`): every wake-up of a
thread waits for a core when the cores are busy, a wait per hand-off between
threads, where a center of CPU time holds it in proportion to the request's
CPU. Where every client has a worker free, the time off the CPU per hand-off
inside the hold and outside it are both measured, and the report compares
them with the network's when the model misses.

Also: the operational-law table of each point (demands, predicted against
measured utilisation, N*, bounds); the single-queue views of the worker pool
(M/M/1 and M/M/m with capacity from the measured service time, error
columns, "unstable" at or beyond ρ = 1); the 2^k r analysis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from scipy.optimize import brentq

from mwlab.models import ModelError
from mwlab.models.factorial import FactorialResult, analyze
from mwlab.models.laws import Center
from mwlab.models.mva import mva
from mwlab.models.queues import mm1, mmm
from mwlab.spec import Settings

CLIENT_FACTORS = {"vcli", "tcli", "icli", "ncli"}
HOLDS = 0.10  # the model "holds" at a point while throughput and response time are within 10%
TIE = 0.03  # devices within 3% of the largest demand per server share the bottleneck
US = 1e-6


@dataclass
class Device:
    """A resource of a point: demand per request, capacity, utilisations."""

    name: str
    demand_us: float
    servers: float
    u_measured: float = float("nan")
    u_predicted: float = float("nan")
    in_network: bool = False
    # A pure delay (link delay): no queue, never the bottleneck.
    delay: bool = False

    @property
    def per_server_us(self) -> float:
        if self.delay:
            return 0.0
        return self.demand_us / self.servers if self.servers > 0 else float("inf")


@dataclass
class PointFit:
    """The model at one point."""

    point: str
    sweep: str
    n: int
    think_us: float
    x_measured: float
    r_measured_us: float
    x_model: float
    r_model_us: float
    devices: list[Device]
    bottleneck: str
    total_demand_us: float
    max_demand_us: float
    # The CPU per request inside the workers' holding time (counted there).
    hold_cpu_us: float = 0.0

    @property
    def x_error(self) -> float:
        return (self.x_model - self.x_measured) / self.x_measured

    @property
    def r_error(self) -> float:
        return (self.r_model_us - self.r_measured_us) / self.r_measured_us

    @property
    def holds(self) -> bool:
        return abs(self.x_error) <= HOLDS and abs(self.r_error) <= HOLDS

    @property
    def knee(self) -> float:
        return (self.total_demand_us + self.think_us) / self.max_demand_us

    @property
    def x_bound(self) -> float:
        return min(self.n / ((self.total_demand_us + self.think_us) * US), 1 / (self.max_demand_us * US))

    @property
    def r_bound_us(self) -> float:
        return max(self.total_demand_us, self.n * self.max_demand_us - self.think_us)


@dataclass
class ExperimentFit:
    """Every point's model, with the delay fitted for the experiment."""

    delay_us: float
    fitted_on: list[str]
    points: list[PointFit] = field(default_factory=list)
    # With both mwproxy engines in one experiment, a delay for each (their
    # network stacks and wake-ups differ): engine -> delay.
    delays: dict[str, float] = field(default_factory=dict)


# mwmq's async engine: database connections per loop and statements in flight on each.
MQ_LOOP_DB = 2
MQ_DEPTH = 2


def num(row: pd.Series, col: str, default: float = float("nan")) -> float:
    """A figure of a summary row as a float: `default` when the column is
    absent, empty, not a number or NaN (every module that reads rows uses it)."""
    v = row.get(col, default)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(v) else v


def _factor(row: pd.Series, column: str, fixed: Any) -> Any:
    """A setting at this point: the factor's column when it varies, else the spec's."""
    v = row.get(column) if column in row.index else None
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return fixed
    return v


def devices(row: pd.Series, settings: Settings) -> list[Device]:
    """The devices of a point, with their demands and measured utilisations."""
    out: list[Device] = []
    cores = num(row, "cores", 0.0)
    free = max(cores - num(row, "cpu_other_cores", 0.0), 0.05)
    # The host's busy time and the sum of the processes' CPU times are two
    # accountings of the same work that differ by up to a fifth at light
    # load (tick-based idle accounting); the smaller is the CPU the lab's
    # processes used for certain.
    cpu = min(num(row, "cpu_lab_us", math.inf), num(row, "cpu_host_us", math.inf))
    if cores > 0 and not math.isinf(cpu):
        used = min(num(row, "cpu_lab_cores", math.inf), num(row, "cpu_host_cores", math.inf))
        out.append(Device("host CPU", cpu, free, used / free, in_network=True))
    middlewares = int(num(row, "nmw", settings.topology.middlewares))
    service = num(row, "mw_service_us")
    pool_wait = num(row, "mw_pool_us")
    if middlewares > 0 and not math.isnan(service) and not math.isnan(pool_wait):
        # mwmq: a worker's own time, then the statement on a pooled database
        # connection. With fewer connections than workers, waiting for one is
        # queueing at the pool, not work: the pool is a center of its own, its
        # connections busy for the database time each.
        workers = int(num(row, "tmw", settings.middleware.workers))
        pool = num(row, "pool", float("nan"))
        if math.isnan(pool):
            pool = settings.middleware.db_pool or workers
        db = num(row, "mw_server_us")
        own = max(service - pool_wait - db, 0.0)
        # The host's CPU work is already inside the measured times (mwmq's in
        # the workers' own time, PostgreSQL's in the database time, the
        # clients' in the delay): counted again as a center it would be twice
        # in every response. It stays a device, checked as a bottleneck.
        for d in out:
            if d.name == "host CPU":
                d.in_network = False
        x = num(row, "client_tput")
        if _factor(row, "engine", settings.middleware.engine) == "async":
            # mwmq's async engine: its loops hold no request while the
            # database answers (one center, their CPU time per request); the
            # statements run on each loop's connections, two in flight on
            # each (pipelined), so the database time has that many servers.
            loops = settings.middleware.threads or max(1, int(num(row, "cores", 1.0)) // 2)
            loop = num(row, "cpu_mw_loop_us")
            if not math.isnan(loop):
                m = loops * middlewares
                util = num(row, "cpu_mw_loop_cores") / m
                out.append(Device("event loops", loop, m, util, in_network=True))
            conns = loops * MQ_LOOP_DB * MQ_DEPTH * middlewares
            out.append(Device("database connections", db, conns, x * db * US / conns, in_network=True))
        elif pool >= workers:
            # A connection per worker: the workers (holding their connection
            # through the statement) are the one constraint.
            busy = service - pool_wait
            out.append(Device("workers", busy, workers * middlewares, num(row, "mw_util"), in_network=True))
        else:
            # Measured: the workers' busy share that was their own work.
            u_own = num(row, "mw_util") * own / service if service > 0 else float("nan")
            out.append(Device("workers", own, workers * middlewares, u_own, in_network=True))
            conns = int(pool) * middlewares
            out.append(Device("database connections", db, conns, x * db * US / conns, in_network=True))
        pg, pg_cores = num(row, "cpu_pg_us"), num(row, "cpu_pg_cores")
        if not math.isnan(pg) and cores > 0:
            out.append(Device("PostgreSQL CPU", pg, free, pg_cores / free))
        lag = num(row, "standby_lag_us")
        if not math.isnan(lag) and lag > 0:
            # A synchronous standby: every statement's commit waits for the
            # standby's flush. The wait is inside the measured database time
            # (the connection is held through it), so it is listed as the
            # part of that time it is, not counted again; the standby's
            # processes are in PostgreSQL's CPU (pg1).
            out.append(Device("standby round trip (in the database time)", lag, 1, delay=True))
        nets = middlewares
        net = num(row, "cpu_mw_net_us")
        if not math.isnan(net):
            out.append(Device("net thread", net, nets, num(row, "cpu_mw_net_cores") / nets))
    elif middlewares > 0 and _factor(row, "engine", settings.middleware.engine) == "async":
        # The async engine's loops hold no request while servers answer:
        # their demand is their CPU time per request, their capacity the loops.
        # mwproxy's default: half the usable cores, at least one loop.
        loops = settings.middleware.threads or max(1, int(num(row, "cores", 1.0)) // 2)
        loop = num(row, "cpu_mw_loop_us")
        if not math.isnan(loop):
            m = loops * middlewares
            out.append(Device("event loops", loop, m, num(row, "cpu_mw_loop_cores") / m, in_network=True))
    elif middlewares > 0 and not math.isnan(service):
        workers = int(num(row, "tmw", settings.middleware.workers)) * middlewares
        out.append(Device("workers", service, workers, num(row, "mw_util"), in_network=True))
        nets = middlewares * settings.middleware.net_threads
        net = num(row, "cpu_mw_net_us")
        if not math.isnan(net):
            out.append(Device("net thread", net, nets, num(row, "cpu_mw_net_cores") / nets))
    servers = int(num(row, "nsvr", settings.topology.servers))
    for i in range(servers):
        d = num(row, f"cpu_mc{i}_us")
        if not math.isnan(d):
            out.append(Device(f"server {i}", d, 1, num(row, f"cpu_mc{i}_cores")))
    load, threads = num(row, "cpu_cl_load_us"), num(row, "cl_load_threads", 0.0)
    if not math.isnan(load) and threads > 0:
        out.append(Device("load generator", load, threads, num(row, "cl_load_thread_util")))
    # Emulated hosts: every shaped link direction is a center whose demand is
    # the bytes it carries per request over its rate; a host with a CPU quota
    # is a center of its own.
    for col in row.index:
        if col.startswith("link_") and col.endswith("_rate_mbit"):
            key = col[: -len("_rate_mbit")]
            per_req, rate = num(row, f"{key}_bytes_per_req"), num(row, col) * 1e6
            if not math.isnan(per_req) and rate > 0:
                _, host, direction = key.split("_", 2)
                name = f"link {host} {'sends' if direction == 'up' else 'receives'}"
                out.append(Device(name, per_req * 8 / rate / US, 1, num(row, f"{key}_util")))
        elif col.startswith("cpu_host_") and col.endswith("_quota"):
            host = col[len("cpu_host_") : -len("_quota")]
            quota, demand = num(row, col), num(row, f"cpu_host_{host}_us")
            if quota > 0 and not math.isnan(demand):
                out.append(Device(f"CPU of {host}", demand, quota, float("nan"), in_network=True))
    # A request's bytes cross the sender's link and the receiver's at the same
    # time, packet after packet: only the slowest link adds its time to the
    # response; the others are checked as bottlenecks.
    links = [d for d in out if d.name.startswith("link ")]
    if links:
        max(links, key=lambda d: d.demand_us).in_network = True
    # Delays added to the links (netem or relays): a delay center of the
    # round trips a request crosses that no measured time holds already (a
    # worker holds its request through the server's or database's round
    # trip; an event loop does not).
    added = num(row, "delay_client_rtt_us", 0.0)
    if any(d.name == "event loops" for d in out):
        added += num(row, "delay_backend_rtt_us", 0.0)
    if added > 0:
        out.append(Device("link delay", added, 1, in_network=True, delay=True))
    return out


def network_centers(devs: list[Device], delay_us: float) -> list[Center]:
    centers = [Center("delay", max(delay_us, 0.0) * US, "delay")]
    for d in devs:
        if not d.in_network or d.demand_us <= 0:
            continue
        if d.delay:
            centers.append(Center(d.name, d.demand_us * US, "delay"))
        elif d.servers == 1:
            centers.append(Center(d.name, d.demand_us * US, "queue"))
        elif d.servers > 1:
            centers.append(Center(d.name, d.demand_us * US, "multi", d.servers))
        else:
            # Less than one core left: one server that much slower.
            centers.append(Center(d.name, d.demand_us / d.servers * US, "queue"))
    return centers


def bottleneck(devs: list[Device]) -> str:
    """The device with the largest demand per server, and every device within
    3% of it, joined with " = "."""
    top = max(d.per_server_us for d in devs)
    return " = ".join(d.name for d in devs if d.per_server_us >= (1 - TIE) * top)


def hold_cpu_us(row: pd.Series, devs: list[Device]) -> float:
    """The CPU per request spent inside the workers' holding time: the
    workers' own CPU and the servers' (a worker holds its request until the
    servers answer). 0 where there is no such hold on the host CPU center: no
    worker pool in the network (async engine, mwmq, whose host CPU is no
    center), or emulated hosts with CPUs of their own."""
    names = {d.name for d in devs if d.in_network}
    if "workers" not in names or "host CPU" not in names or "database connections" in names:
        return 0.0
    if any(str(c).startswith("cpu_host_") and str(c).endswith("_quota") for c in row.index):
        return 0.0
    servers = sum(d.demand_us for d in devs if d.name.startswith("server "))
    inside = num(row, "cpu_mw_worker_us", 0.0) + servers
    cpu = next(d for d in devs if d.name == "host CPU")
    return min(max(inside, 0.0), cpu.demand_us)


def _solve(
    devs: list[Device], inside_us: float, delay_us: float, think_us: float, n: int
) -> tuple[float, float]:
    """Throughput and response time (µs) of the point's network.

    The workers' holding time runs from the dequeue to the reply, so it
    holds the CPU the workers and the servers spend on the request
    (`inside_us`, see `hold_cpu_us`). That CPU is counted once, in the hold:
    the host CPU center serves the rest of the request's CPU with the cores
    the holds leave it, its servers less X * inside_us, X the network's own
    throughput (a fixed point; less capacity can only lower X)."""
    cpu = next((d for d in devs if d.name == "host CPU"), None)
    if cpu is None or inside_us <= 0:
        res = mva(network_centers(devs, delay_us), think_us * US, n)
        return res.throughput[-1], res.response_time[-1] / US

    def at(x: float) -> tuple[float, float]:
        left = max(cpu.servers - x * inside_us * US, 0.05)
        rest = Device(cpu.name, cpu.demand_us - inside_us, left, in_network=True)
        res = mva(network_centers([rest if d is cpu else d for d in devs], delay_us), think_us * US, n)
        return res.throughput[-1], res.response_time[-1] / US

    hi = cpu.servers / (cpu.demand_us * US)  # the host CPU's bound: X D <= its cores
    if at(hi)[0] >= hi:
        return at(hi)
    return at(brentq(lambda x: at(x)[0] - x, 0.0, hi, rtol=1e-10))


def solve_point(row: pd.Series, settings: Settings, delay_us: float, sweep: str = "") -> PointFit | None:
    """MVA of one point's network at its population."""
    n = int(num(row, "N", 0))
    x, r = num(row, "client_tput"), num(row, "client_rt_mean_us")
    devs = devices(row, settings)
    if n < 1 or math.isnan(x) or math.isnan(r) or not x or not devs:
        return None
    think = num(row, "Z_us", 0.0)
    inside = hold_cpu_us(row, devs)
    try:
        x_model, r_model = _solve(devs, inside, delay_us, think, n)
    except ModelError:
        return None
    for d in devs:
        d.u_predicted = x_model * d.demand_us * US / d.servers
    top = max(d.per_server_us for d in devs)
    # Every µs of the request once: the hold's CPU is in the hold.
    total = sum(c.demand for c in network_centers(devs, delay_us)) / US - inside
    return PointFit(
        str(row.get("point", "")),
        sweep,
        n,
        think,
        x,
        r,
        x_model,
        r_model,
        devs,
        bottleneck(devs),
        total,
        top,
        inside,
    )


# A request's hand-offs between threads with mwproxy's worker pool: inside the
# hold, worker -> server and server -> worker; outside it, client -> net
# thread, net thread -> worker and worker -> client.
HANDOFFS_IN_HOLD = 2
HANDOFFS_OUTSIDE = 3


@dataclass
class Handoffs:
    """Time per hand-off between threads not spent on a CPU (µs) at a point:
    inside the workers' hold and outside it as measured, outside it in the
    network. Waking a thread costs a wait for a core when the cores are
    busy; a center of CPU time holds that wait in proportion to the CPU of
    the request, the scheduler makes it per hand-off."""

    inside_us: float
    outside_us: float
    model_us: float

    @property
    def left_out_us(self) -> float:
        """What the network leaves out per request if the hand-offs outside
        the hold waited as long as those inside it (measured there)."""
        return (self.inside_us - self.model_us) * HANDOFFS_OUTSIDE


def handoffs(p: PointFit) -> Handoffs | None:
    """The hand-off times of a point whose every client had a worker free
    (workers >= N: the measured time outside the hold holds no wait for a
    worker, and the network's workers center no queue), from the measured
    response time, holding time and CPU; None elsewhere."""
    devs = {d.name: d for d in p.devices}
    hold, cpu = devs.get("workers"), devs.get("host CPU")
    if hold is None or cpu is None or p.hold_cpu_us <= 0 or hold.servers < p.n:
        return None
    rest = cpu.demand_us - p.hold_cpu_us
    return Handoffs(
        (hold.demand_us - p.hold_cpu_us) / HANDOFFS_IN_HOLD,
        (p.r_measured_us - hold.demand_us - rest) / HANDOFFS_OUTSIDE,
        (p.r_model_us - hold.demand_us - rest) / HANDOFFS_OUTSIDE,
    )


def _delay_error(rows: list[pd.Series], settings: Settings, delay_us: float) -> float:
    err = 0.0
    for row in rows:
        p = solve_point(row, settings, delay_us)
        if p is not None:
            err += p.r_error**2 + p.x_error**2
    return err


def fit_delay(rows: list[pd.Series], settings: Settings) -> float:
    """The delay (µs) minimising the squared relative errors over `rows` (golden-section search)."""
    hi = max((num(r, "client_rt_mean_us", 0.0) for r in rows), default=0.0)
    lo = 0.0
    g = (math.sqrt(5) - 1) / 2
    a, b = lo + (1 - g) * (hi - lo), lo + g * (hi - lo)
    fa, fb = _delay_error(rows, settings, a), _delay_error(rows, settings, b)
    for _ in range(40):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = lo + (1 - g) * (hi - lo)
            fa = _delay_error(rows, settings, a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = _delay_error(rows, settings, b)
    best = (lo + hi) / 2
    return 0.0 if _delay_error(rows, settings, 0.0) <= _delay_error(rows, settings, best) else best


def sweep_label(row: pd.Series, factors: list[str]) -> str:
    """The non-client factor levels of a point (its sweep)."""
    others = [f for f in factors if f not in CLIENT_FACTORS and f in row]
    return ", ".join(f"{f}={row[f]}" for f in others)


def fit_experiment(agg: pd.DataFrame, factors: list[str], settings: Settings) -> ExperimentFit | None:
    """Every point's model; the delay fitted over the points below their knee."""
    if agg.empty or "N" not in agg:
        return None
    rows = [r for _, r in agg.iterrows()]
    groups: dict[str, list[pd.Series]] = {}
    for r in rows:
        groups.setdefault(str(_factor(r, "engine", settings.middleware.engine)), []).append(r)
    fit: ExperimentFit | None = None
    for engine, members in groups.items():
        first = [solve_point(r, settings, 0.0) for r in members]
        below = [r for r, p in zip(members, first, strict=True) if p is not None and p.n <= p.knee]
        basis = below or [r for r, p in zip(members, first, strict=True) if p is not None]
        if not basis:
            continue
        delay = fit_delay(basis, settings)
        if fit is None:
            fit = ExperimentFit(delay, [])
        fit.fitted_on += [str(r.get("point", "")) for r in basis]
        fit.delays[engine] = delay
        for r in members:
            p = solve_point(r, settings, delay, sweep_label(r, factors))
            if p is not None:
                fit.points.append(p)
    return fit


def model_table(fit: ExperimentFit) -> pd.DataFrame:
    """model.csv: predicted against measured throughput and response time per point."""
    return pd.DataFrame(
        [
            {
                "sweep": p.sweep,
                "point": p.point,
                "N": p.n,
                "x_measured": p.x_measured,
                "x_model": p.x_model,
                "x_error": p.x_error,
                "r_measured_us": p.r_measured_us,
                "r_model_us": p.r_model_us,
                "r_error": p.r_error,
                "bottleneck": p.bottleneck,
            }
            for p in fit.points
        ]
    )


def utilization_table(fit: ExperimentFit) -> pd.DataFrame:
    """utilization.csv: per point and device, demand, predicted and measured utilisation."""
    return pd.DataFrame(
        [
            {
                "point": p.point,
                "device": d.name,
                "demand_us": d.demand_us,
                "servers": d.servers,
                "u_predicted": d.u_predicted,
                "u_measured": d.u_measured,
                "in_network": d.in_network,
            }
            for p in fit.points
            for d in p.devices
        ]
    )


def law_table(p: PointFit) -> pd.DataFrame:
    """The operational-law table of a point (seed 003): D_i, U_i = X D_i / m_i
    predicted and measured, and the bounds."""
    rows = [
        {
            "device": d.name,
            "servers": d.servers,
            "D (us)": d.demand_us,
            "D per server (us)": d.per_server_us,
            "U predicted": d.u_predicted,
            "U measured": d.u_measured,
        }
        for d in p.devices
    ]
    return pd.DataFrame(rows)


def bottleneck_agrees(p: PointFit) -> bool | None:
    """Whether the named bottleneck is the most utilised device by measurement
    (None when its utilisation was not measured)."""
    named = [d for d in p.devices if d.name in p.bottleneck.split(" = ")]
    measured = [d for d in p.devices if not math.isnan(d.u_measured)]
    if not named or not measured or all(math.isnan(d.u_measured) for d in named):
        return None
    top = max(d.u_measured for d in measured)
    return max(d.u_measured for d in named if not math.isnan(d.u_measured)) >= top - 0.1


def queue_views(agg: pd.DataFrame, settings: Settings, center: str = "workers") -> pd.DataFrame:
    """The worker pool (or, `center="pool"`, mwmq's database connections) as
    M/M/1 (one server m times as fast) and M/M/m, with the arrival rate the
    middleware's throughput and the capacity from the measured service time
    (μ = 1 / S per server); predicted against measured queue length and
    waiting time, with errors; "unstable" at or beyond ρ = 1. For the pool,
    S is the database time and the measured waiting is the pool wait."""
    service_col = "mw_service_us" if center == "workers" else "mw_server_us"
    if service_col not in agg or agg[service_col].isna().all():
        return pd.DataFrame()
    if center == "pool" and ("mw_pool_us" not in agg or agg["mw_pool_us"].isna().all()):
        return pd.DataFrame()
    rows = []
    for _, r in agg.iterrows():
        s = num(r, service_col) * US
        lam = num(r, "mw_tput")
        if math.isnan(s) or math.isnan(lam) or s <= 0:
            continue
        middlewares = int(max(1, num(r, "nmw", settings.topology.middlewares)))
        workers = int(num(r, "tmw", settings.middleware.workers))
        if center == "workers" and _factor(r, "engine", settings.middleware.engine) == "async":
            continue  # no worker pool: an event loop holds no request while servers answer
        if center == "pool":
            pool = num(r, "pool", float("nan"))
            if math.isnan(pool):
                pool = settings.middleware.db_pool or workers
            if pool >= workers:
                continue  # a connection per worker: nobody waits for one
            m = int(pool) * middlewares
            measured_w = num(r, "mw_pool_us")
            measured_q = lam * measured_w * US
        else:
            m = workers * middlewares
            measured_q, measured_w = num(r, "mw_queue_len"), num(r, "mw_queue_us")
        row: dict[str, Any] = {
            "point": r.get("point", ""),
            "N": r.get("N"),
            "arrival rate (/s)": lam,
            "service time (us)": s / US,
            "workers" if center == "workers" else "connections": m,
            "ρ": lam * s / m,
            "measured queue length": measured_q,
            "measured waiting (us)": measured_w,
        }
        for key in ("M/M/1", "M/M/m"):
            try:
                q = mm1(lam, m / s) if key == "M/M/1" else mmm(lam, 1 / s, m)
                w = q.mean_waiting_time / US
                row[f"{key} queue length"] = q.mean_queue_length
                row[f"{key} waiting (us)"] = w
                row[f"{key} waiting error"] = (w - measured_w) / measured_w if measured_w else float("nan")
            except ModelError:
                row[f"{key} queue length"] = "unstable"
                row[f"{key} waiting (us)"] = "unstable"
                row[f"{key} waiting error"] = "unstable"
        rows.append(row)
    return pd.DataFrame(rows)


def factorial_fit(summary: pd.DataFrame, factors: list[str], response: str) -> FactorialResult | None:
    """2^k r analysis of `response` when every factor has two levels and there are repetitions."""
    ok = summary[summary.get("status", "ok") == "ok"] if "status" in summary else summary
    if ok.empty or not factors or response not in ok:
        return None
    if any(ok[f].nunique() != 2 for f in factors):
        return None
    if ok.groupby(factors).size().min() < 2:
        return None
    try:
        return analyze(factors, [tuple(r) for r in ok[factors].itertuples(index=False)], list(ok[response]))
    except ModelError:
        return None

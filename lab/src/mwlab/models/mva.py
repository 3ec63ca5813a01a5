"""Mean value analysis of closed networks, and open Jackson networks.

- `mva`: exact single-class MVA with queueing, delay and multi-server
  (load-dependent) centers. Without multi-server centers it is the MVA
  recursion; with them, the same figures from the normalisation constants
  (convolution, in logarithms): the load-dependent recursion's marginal
  probabilities (p0 = 1 - the others) lose every digit once a center with
  many servers sits next to a saturated one (32 workers, 48 users: 31,837
  ops/s where the exact answer is 43,695).
- `schweitzer`: Schweitzer's approximate MVA (multi-server centers by
  Seidmann's split into a queue of demand D/m and a delay of D (m-1)/m).
- `mva_multiclass`: exact multi-class MVA for queueing and delay centers.
- `jackson`: open networks of M/M/m stations.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from mwlab.models.errors import ModelError
from mwlab.models.laws import Center
from mwlab.models.queues import mmm


@dataclass
class MvaResult:
    """Per population n = 1..N: throughput, response time, and per center
    utilization, queue length (jobs there, waiting or in service) and residence time."""

    users: list[int] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)
    response_time: list[float] = field(default_factory=list)
    centers: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "users": self.users,
            "throughput": self.throughput,
            "response_time": self.response_time,
            "centers": self.centers,
        }


def _check(centers: list[Center], think: float, users: int) -> None:
    if users < 1:
        raise ModelError("users must be at least 1")
    if think < 0:
        raise ModelError("think time cannot be negative")
    if not centers:
        raise ModelError("a network needs at least one center")
    names = [c.name for c in centers]
    if len(set(names)) != len(names):
        raise ModelError("center names must be distinct")


def mva(centers: list[Center], think: float, users: int) -> MvaResult:
    """Exact MVA for populations 1..users."""
    _check(centers, think, users)
    if any(c.kind == "multi" for c in centers):
        return _by_convolution(centers, think, users)
    res = MvaResult(
        centers={c.name: {"utilization": [], "queue_length": [], "residence_time": []} for c in centers}
    )
    q = [0.0] * len(centers)
    # Marginal probabilities p[k][j] of j jobs at multi-server center k (population n - 1).
    marg = {k: [1.0] for k, c in enumerate(centers) if c.kind == "multi"}
    for n in range(1, users + 1):
        r = []
        for k, c in enumerate(centers):
            if c.kind == "delay":
                r.append(c.demand)
            elif c.kind == "queue":
                r.append(c.demand * (1 + q[k]))
            else:
                p = marg[k]
                r.append(sum(j / min(j, c.servers) * c.demand * p[j - 1] for j in range(1, n + 1)))
        x = n / (think + sum(r))
        q = [x * rk for rk in r]
        for k, c in enumerate(centers):
            if c.kind == "multi":
                old = marg[k]
                new = [0.0] * (n + 1)
                for j in range(1, n + 1):
                    new[j] = x * c.demand / min(j, c.servers) * old[j - 1]
                new[0] = max(0.0, 1 - sum(new[1:]))
                marg[k] = new
        res.users.append(n)
        res.throughput.append(x)
        res.response_time.append(sum(r))
        for k, c in enumerate(centers):
            per = res.centers[c.name]
            u = x * c.demand / (c.servers if c.kind == "multi" else 1)
            per["utilization"].append(u if c.kind != "delay" else x * c.demand)
            per["queue_length"].append(q[k])
            per["residence_time"].append(r[k])
    return res


def _log_factors(c: Center, think: float, users: int) -> np.ndarray:
    """ln f(j), j = 0..users: the product-form factor of j jobs at a center
    (D^j / prod of min(i, m) for a multi-server center, D^j / j! for a delay),
    or of the think time seen as a delay center."""
    j = np.arange(users + 1, dtype=float)
    demand = think if c is None else c.demand
    if demand <= 0:
        out = np.full(users + 1, -np.inf)
        out[0] = 0.0
        return out
    if c is None or c.kind == "delay":
        servers = j
    elif c.kind == "queue":
        servers = np.ones(users + 1)
    else:
        servers = np.minimum(j, c.servers)
    steps = np.log(demand) - np.log(np.maximum(servers[1:], 1e-300))
    return np.concatenate(([0.0], np.cumsum(steps)))


def _log_convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ln of the convolution of exp(a) and exp(b), truncated to len(a)."""
    n = len(a)
    k = np.arange(n)
    idx = k[:, None] - k[None, :]  # [n, k] -> n - k
    terms = np.where(idx >= 0, a[None, :] + b[np.clip(idx, 0, None)], -np.inf)
    top = terms.max(axis=1)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return top + np.log(np.exp(terms - top[:, None]).sum(axis=1))


def _by_convolution(centers: list[Center], think: float, users: int) -> MvaResult:
    """Exact solution by normalisation constants: G(n) is the convolution of
    every center's factors, X(n) = G(n-1)/G(n), and a center's mean jobs at
    population n is sum_j j f(j) G_-k(n-j) / G(n), with G_-k the network
    without it. Kept in logarithms, every term is a sum of positive numbers."""
    factors = [_log_factors(c, think, users) for c in centers]
    base = _log_factors(None, think, users)

    def constants(skip: int | None) -> np.ndarray:
        g = base
        for k, f in enumerate(factors):
            if k != skip:
                g = _log_convolve(g, f)
        return g

    g = constants(None)
    n = np.arange(1, users + 1)
    x = np.exp(g[:-1] - g[1:])
    res = MvaResult(
        centers={c.name: {"utilization": [], "queue_length": [], "residence_time": []} for c in centers}
    )
    res.users = [int(v) for v in n]
    res.throughput = [float(v) for v in x]
    total = np.zeros(users)
    for k, c in enumerate(centers):
        rest = constants(k)
        # sum_j j f(j) G_-k(n - j), in logarithms (j >= 1).
        with np.errstate(divide="ignore"):
            jf = factors[k] + np.log(np.arange(users + 1, dtype=float))
        q = np.exp(_log_convolve(rest, jf)[1:] - g[1:])
        per = res.centers[c.name]
        per["queue_length"] = [float(v) for v in q]
        per["residence_time"] = [float(v) for v in q / x]
        servers = c.servers if c.kind == "multi" else 1
        per["utilization"] = [float(v) for v in x * c.demand / servers]
        total += q / x
    res.response_time = [float(v) for v in total]
    return res


def _seidmann(centers: list[Center]) -> tuple[list[Center], dict[str, list[int]]]:
    """Multi-server centers split into a queue (D/m) and a delay (D (m-1)/m)."""
    out: list[Center] = []
    parts: dict[str, list[int]] = {}
    for c in centers:
        if c.kind == "multi" and c.servers > 1:
            parts[c.name] = [len(out), len(out) + 1]
            out.append(Center(c.name + "#queue", c.demand / c.servers, "queue"))
            out.append(Center(c.name + "#delay", c.demand * (c.servers - 1) / c.servers, "delay"))
        else:
            parts[c.name] = [len(out)]
            out.append(Center(c.name, c.demand, "queue" if c.kind == "multi" else c.kind))
    return out, parts


def schweitzer(
    centers: list[Center], think: float, users: int, tol: float = 1e-9, max_iter: int = 100_000
) -> MvaResult:
    """Schweitzer's approximate MVA at every population 1..users."""
    _check(centers, think, users)
    split, parts = _seidmann(centers)
    res = MvaResult(
        centers={c.name: {"utilization": [], "queue_length": [], "residence_time": []} for c in centers}
    )
    for n in range(1, users + 1):
        q = [n / len(split)] * len(split)
        for _ in range(max_iter):
            r = [
                c.demand if c.kind == "delay" else c.demand * (1 + (n - 1) / n * q[k])
                for k, c in enumerate(split)
            ]
            x = n / (think + sum(r))
            new = [x * rk for rk in r]
            done = max(abs(a - b) for a, b in zip(new, q, strict=True)) < tol
            q = new
            if done:
                break
        else:
            raise ModelError("Schweitzer's iteration did not converge")
        res.users.append(n)
        res.throughput.append(x)
        res.response_time.append(sum(r))
        for c in centers:
            idx = parts[c.name]
            per = res.centers[c.name]
            per["utilization"].append(x * c.demand / (c.servers if c.kind == "multi" else 1))
            per["queue_length"].append(sum(q[i] for i in idx))
            per["residence_time"].append(sum(r[i] for i in idx))
    return res


@dataclass
class MultiClassResult:
    """Throughput and response time per class at the full population, and per center queue lengths."""

    throughput: dict[str, float]
    response_time: dict[str, float]
    queue_length: dict[str, float]
    utilization: dict[str, float]


def mva_multiclass(
    demands: dict[str, dict[str, float]],
    kinds: dict[str, str],
    think: dict[str, float],
    users: dict[str, int],
) -> MultiClassResult:
    """Exact multi-class MVA. `demands[class][center]`, `kinds[center]` in queue|delay."""
    classes = list(users)
    centers = list(kinds)
    for k, kind in kinds.items():
        if kind not in ("queue", "delay"):
            raise ModelError(f"multi-class MVA supports queue and delay centers, not {kind!r} ({k})")
    for c in classes:
        if users[c] < 0 or think.get(c, 0) < 0:
            raise ModelError(f"class {c}: population and think time must be >= 0")
    q: dict[tuple[int, ...], list[float]] = {tuple(0 for _ in classes): [0.0] * len(centers)}
    last = None
    for pop in itertools.product(*(range(users[c] + 1) for c in classes)):
        if sum(pop) == 0:
            continue
        qn = [0.0] * len(centers)
        xs, rs = {}, {}
        for i, c in enumerate(classes):
            if pop[i] == 0:
                continue
            prev = q[tuple(p - (1 if j == i else 0) for j, p in enumerate(pop))]
            r = [
                demands[c].get(k, 0.0) * (1 if kinds[k] == "delay" else 1 + prev[ki])
                for ki, k in enumerate(centers)
            ]
            x = pop[i] / (think.get(c, 0.0) + sum(r))
            xs[c], rs[c] = x, sum(r)
            for ki in range(len(centers)):
                qn[ki] += x * r[ki]
        q[pop] = qn
        last = (xs, rs, qn)
    xs, rs, qn = last if last else ({}, {}, [0.0] * len(centers))
    util = {k: sum(xs.get(c, 0.0) * demands[c].get(k, 0.0) for c in classes) for k in centers}
    return MultiClassResult(xs, rs, dict(zip(centers, qn, strict=True)), util)


@dataclass
class JacksonResult:
    """Per station arrival rate, utilization, mean jobs and response time; system totals."""

    arrival_rates: list[float]
    utilization: list[float]
    mean_jobs: list[float]
    response_time: list[float]
    system_jobs: float
    system_response_time: float


def jackson(
    external: list[float],
    routing: list[list[float]],
    service_rates: list[float],
    servers: list[int] | None = None,
) -> JacksonResult:
    """Open network: external arrival rates γ_k, routing probabilities P[j][k], μ_k, m_k."""
    k = len(external)
    servers = servers or [1] * k
    if any(len(row) != k for row in routing) or len(routing) != k or len(service_rates) != k:
        raise ModelError("routing must be a k x k matrix matching the stations")
    for row in routing:
        if any(p < 0 for p in row) or sum(row) > 1 + 1e-12:
            raise ModelError("routing probabilities must be >= 0 and sum to at most 1 per station")
    # Solve λ = γ + λ P by iteration (converges for an open network).
    lam = list(external)
    for _ in range(100_000):
        new = [external[j] + sum(lam[i] * routing[i][j] for i in range(k)) for j in range(k)]
        if max(abs(a - b) for a, b in zip(new, lam, strict=True)) < 1e-12:
            lam = new
            break
        lam = new
    else:
        raise ModelError("the traffic equations did not converge: is the network open?")
    results = [mmm(lam[i], service_rates[i], servers[i]) if lam[i] > 0 else None for i in range(k)]
    jobs = [r.mean_jobs if r else 0.0 for r in results]
    total_in = sum(external)
    if total_in <= 0:
        raise ModelError("an open network needs external arrivals")
    return JacksonResult(
        arrival_rates=lam,
        utilization=[r.utilization if r else 0.0 for r in results],
        mean_jobs=jobs,
        response_time=[r.mean_response_time if r else 0.0 for r in results],
        system_jobs=sum(jobs),
        system_response_time=sum(jobs) / total_in,
    )

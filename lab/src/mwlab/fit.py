"""Models fitted to measured experiments (the report's Models section).

- A client sweep (points that differ only in the number of clients) with a
  middleware becomes a closed network: the clients' think time, a delay for
  the network and the clients themselves, the net thread (queue), the worker
  pool (multi-server center with one server per worker) and the memcached
  servers (multi-server center with one server per memcached). Demands come
  from the middleware's own timings at the lightest load of the sweep. MVA
  then predicts throughput and response time at every measured population.
  Limitation: a worker is held while its request is at a server (simultaneous
  resource possession), which product-form networks cannot express, so the
  worker pool is given only its own processing time.
- Each point also gets the seeds' single-queue views: M/M/1 and M/M/m (m =
  workers) with the measured throughput as arrival rate and the sweep's
  saturated (largest) throughput as service capacity.
- A 2^k r experiment (every factor at two levels, at least two repetitions)
  gets its effects, allocation of variation and confidence intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mwlab.models import ModelError
from mwlab.models.factorial import FactorialResult, analyze
from mwlab.models.laws import Center, bounds
from mwlab.models.mva import mva
from mwlab.models.queues import mm1, mmm

CLIENT_FACTORS = {"vcli", "tcli", "icli", "ncli"}
HOLDS = 0.15  # the model "holds" while throughput and response time are within 15%


@dataclass
class SweepFit:
    """One client sweep and its network model."""

    label: str
    centers: list[Center]
    think_s: float
    table: pd.DataFrame
    bottleneck: str
    knee: float
    holds_up_to: float | None
    curve: pd.DataFrame = field(default_factory=pd.DataFrame)


def _num(row: pd.Series, col: str, default: float = 0.0) -> float:
    v = row.get(col, default)
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def sweeps(agg: pd.DataFrame, factors: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """Groups of points that differ only in client counts, with at least two populations."""
    if agg.empty or "N" not in agg:
        return []
    others = [f for f in factors if f not in CLIENT_FACTORS and f in agg]
    groups = (
        [("", agg)]
        if not others
        else [
            (
                ", ".join(
                    f"{n}={v}" for n, v in zip(others, key if isinstance(key, tuple) else (key,), strict=True)
                ),
                g,
            )
            for key, g in agg.groupby(others, sort=True)
        ]
    )
    return [(label, g.sort_values("N")) for label, g in groups if g["N"].nunique() >= 2]


def fit_sweep(label: str, g: pd.DataFrame, settings: dict[str, Any]) -> SweepFit | None:
    """The closed network of a sweep, solved with MVA and compared point by point."""
    if "mw_service_us" not in g or g["mw_service_us"].isna().all():
        return None
    light = g.iloc[0]
    workers = int(_num(light, "tmw", settings.get("middleware.workers", 8)))
    servers = int(_num(light, "nsvr", settings.get("topology.servers", 1)))
    middlewares = int(_num(light, "nmw", settings.get("topology.middlewares", 1)))
    us = 1e-6
    server = _num(light, "mw_server_us") * us
    centers = [
        Center(
            "network+client",
            max(0.0, _num(light, "client_rt_mean_us") - _num(light, "mw_rt_mean_us")) * us,
            "delay",
        ),
        Center(
            "net thread", _num(light, "mw_net_us") * us / max(middlewares, 1), "multi", max(middlewares, 1)
        ),
        Center(
            "workers",
            max(0.0, _num(light, "mw_service_us") * us - server),
            "multi",
            workers * max(middlewares, 1),
        ),
    ]
    per_server = sorted(c for c in g.columns if c.startswith("mw_backend") and c.endswith("_demand_us"))
    if per_server:
        # Each memcached server is a queue; its demand is its server time per client request.
        centers += [Center(f"server {i}", _num(light, c) * us) for i, c in enumerate(per_server)]
    else:
        centers.append(Center("servers", server, "multi", servers))
    think = _num(light, "Z_us") * us
    n_max = int(g["N"].max())
    res = mva(centers, think, n_max)
    rows = []
    for _, r in g.iterrows():
        n = int(r["N"])
        x_m, r_m = res.throughput[n - 1], res.response_time[n - 1]
        x, rt = r["client_tput"], r["client_rt_mean_us"] * us
        ex, er = (x_m - x) / x, (r_m - rt) / rt
        rows.append(
            {
                "N": n,
                "X measured": x,
                "X model": x_m,
                "X error": ex,
                "R measured (us)": rt / us,
                "R model (us)": r_m / us,
                "R error": er,
            }
        )
    holds_up_to = None
    for row in rows:
        if abs(row["X error"]) > HOLDS or abs(row["R error"]) > HOLDS:
            break
        holds_up_to = row["N"]
    b = bounds(centers, think, n_max)
    curve = pd.DataFrame({"N": res.users, "X": res.throughput, "R_us": [r / us for r in res.response_time]})
    return SweepFit(label, centers, think, pd.DataFrame(rows), b.bottleneck, b.knee, holds_up_to, curve)


def queue_views(g: pd.DataFrame, settings: dict[str, Any]) -> pd.DataFrame:
    """M/M/1 and M/M/m predictions of queue length and waiting time per point of a sweep."""
    if "mw_queue_us" not in g or g["mw_tput"].isna().all():
        return pd.DataFrame()
    x_max = g["client_tput"].max()
    rows = []
    for _, r in g.iterrows():
        m = int(_num(r, "tmw", settings.get("middleware.workers", 8))) * int(
            max(1, _num(r, "nmw", settings.get("topology.middlewares", 1)))
        )
        lam = _num(r, "mw_tput")
        row = {
            "N": r["N"],
            "arrival rate": lam,
            "measured queue length": _num(r, "mw_queue_len"),
            "measured waiting (us)": _num(r, "mw_queue_us"),
        }
        for key in ("M/M/1", "M/M/m"):
            try:
                q = mm1(lam, x_max) if key == "M/M/1" else mmm(lam, x_max / m, m)
                row[f"{key} utilization"] = q.utilization
                row[f"{key} queue length"] = q.mean_queue_length
                row[f"{key} waiting (us)"] = q.mean_waiting_time * 1e6
            except ModelError:
                row[f"{key} utilization"] = lam / x_max if x_max else float("nan")
                row[f"{key} queue length"] = float("inf")
                row[f"{key} waiting (us)"] = float("inf")
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

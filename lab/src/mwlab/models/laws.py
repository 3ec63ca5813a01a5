"""Operational laws, bottleneck analysis and bounds for closed interactive
systems (Jain ch. 33; Lazowska et al., Quantitative System Performance ch. 5).

A system is a list of centers: name, service demand D_k (visits x service time,
in seconds per request), kind `queue`, `delay` or `multi` with m servers. Z is
the think time of the users (the delay center "terminals").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mwlab.models.errors import ModelError


@dataclass(frozen=True)
class Center:
    """A service center of a network."""

    name: str
    demand: float
    kind: str = "queue"
    servers: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("queue", "delay", "multi"):
            raise ModelError(f"center {self.name}: kind must be queue, delay or multi, not {self.kind!r}")
        if not self.demand >= 0 or math.isinf(self.demand):
            raise ModelError(f"center {self.name}: demand must be a finite number >= 0, not {self.demand}")
        if self.servers < 1:
            raise ModelError(f"center {self.name}: needs at least one server")

    @property
    def saturation_demand(self) -> float:
        """Demand per server: 1/this is the throughput that saturates the center (0 for delays)."""
        if self.kind == "delay":
            return 0.0
        return self.demand / (self.servers if self.kind == "multi" else 1)


def utilization(throughput: float, service_time: float) -> float:
    """Utilization law: U = X S."""
    return throughput * service_time


def forced_flow(system_throughput: float, visits: float) -> float:
    """Forced flow law: X_k = V_k X."""
    return system_throughput * visits


def little(throughput: float, response_time: float) -> float:
    """Little's law: N = X R."""
    return throughput * response_time


def general_response_time(visits: list[float], residence: list[float]) -> float:
    """General response time law: R = Σ V_k R_k."""
    return sum(v * r for v, r in zip(visits, residence, strict=True))


def interactive_response_time(users: float, throughput: float, think: float) -> float:
    """Interactive response time law: R = N / X - Z."""
    if throughput <= 0:
        raise ModelError("throughput must be positive")
    return users / throughput - think


@dataclass(frozen=True)
class Bounds:
    """Asymptotic and balanced job bounds at population N."""

    total_demand: float
    max_demand: float
    bottleneck: str
    knee: float
    throughput_upper: float
    throughput_lower: float
    response_time_lower: float
    response_time_upper: float
    bjb_throughput_upper: float
    bjb_throughput_lower: float


def bounds(centers: list[Center], think: float, users: int) -> Bounds:
    """Bottleneck, knee N* = (D + Z)/Dmax, and bounds on X(N) and R(N)."""
    if users < 1:
        raise ModelError("users must be at least 1")
    if think < 0:
        raise ModelError("think time cannot be negative")
    queueing = [c for c in centers if c.kind != "delay"]
    if not queueing or max(c.saturation_demand for c in queueing) <= 0:
        raise ModelError("bounds need at least one queueing center with a positive demand")
    d = sum(c.demand for c in centers)
    b = max(queueing, key=lambda c: c.saturation_demand)
    dmax = b.saturation_demand
    n = users
    x_up = min(n / (d + think), 1 / dmax)
    x_low = n / (n * d + think)
    # Balanced job bounds (single-server queueing centers, delay centers folded into Z).
    dq = sum(c.demand for c in queueing)
    z = think + d - dq
    davg = dq / len(queueing)
    bjb_up = min(1 / dmax, n / (dq + z + (n - 1) * davg / (1 + z / dq)))
    bjb_low = n / (dq + z + (n - 1) * dmax / (1 + z / (n * dq)))
    return Bounds(
        total_demand=d,
        max_demand=dmax,
        bottleneck=b.name,
        knee=(d + think) / dmax,
        throughput_upper=x_up,
        throughput_lower=x_low,
        response_time_lower=max(d, n * dmax - think),
        response_time_upper=n * d,
        bjb_throughput_upper=bjb_up,
        bjb_throughput_lower=bjb_low,
    )

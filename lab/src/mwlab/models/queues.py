"""Single queues: M/M/1, M/M/m (Erlang C), M/M/m/B and M/G/1 (Pollaczek-Khinchine).

Rates are per unit of time (λ arrivals, μ services per server); results use the
same unit. Unstable inputs raise ModelError instead of returning NaN.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from mwlab.models.errors import ModelError


@dataclass(frozen=True)
class QueueResult:
    """What a queueing model predicts (fields that do not apply are None)."""

    utilization: float
    p0: float
    prob_queueing: float
    mean_jobs: float
    mean_queue_length: float
    mean_response_time: float
    mean_waiting_time: float
    var_jobs: float | None = None
    var_waiting_time: float | None = None
    throughput: float | None = None
    loss_probability: float | None = None
    response_time_p90: float | None = None
    waiting_time_p90: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)


def _check_rates(lam: float, mu: float) -> None:
    if not (lam >= 0 and mu > 0) or math.isinf(lam) or math.isinf(mu):
        raise ModelError(
            f"rates must be finite with arrival rate >= 0 and service rate > 0 (λ={lam}, μ={mu})"
        )


def mm1(lam: float, mu: float) -> QueueResult:
    """M/M/1."""
    _check_rates(lam, mu)
    rho = lam / mu
    if rho >= 1:
        raise ModelError(f"M/M/1 is unstable: utilization λ/μ = {rho:.3f} >= 1")
    r = 1 / (mu - lam)
    w = rho / (mu - lam)
    return QueueResult(
        utilization=rho,
        p0=1 - rho,
        prob_queueing=rho,
        mean_jobs=rho / (1 - rho),
        mean_queue_length=rho**2 / (1 - rho),
        mean_response_time=r,
        mean_waiting_time=w,
        var_jobs=rho / (1 - rho) ** 2,
        var_waiting_time=(2 - rho) * rho / (mu**2 * (1 - rho) ** 2),
        throughput=lam,
        response_time_p90=r * math.log(10),
        waiting_time_p90=max(0.0, r * math.log(10 * rho)),
    )


def erlang_c(m: int, a: float) -> tuple[float, float]:
    """(p0, probability of queueing) of M/M/m with offered load a = λ/μ < m."""
    rho = a / m
    terms = 0.0
    term = 1.0
    for n in range(m):
        if n > 0:
            term *= a / n
        terms += term
    last = term * a / m / (1 - rho)  # a^m / (m! (1 - rho))
    p0 = 1 / (terms + last)
    return p0, last * p0


def mmm(lam: float, mu: float, m: int) -> QueueResult:
    """M/M/m (Erlang C), m identical servers, one FCFS queue."""
    _check_rates(lam, mu)
    if m < 1:
        raise ModelError("M/M/m needs at least one server")
    rho = lam / (m * mu)
    if rho >= 1:
        raise ModelError(f"M/M/m is unstable: utilization λ/(mμ) = {rho:.3f} >= 1")
    p0, pq = erlang_c(m, lam / mu)
    w = pq / (m * mu * (1 - rho))
    nq = rho * pq / (1 - rho)
    # Waiting time: P(W > t) = pq exp(-m μ (1 - ρ) t).
    decay = m * mu * (1 - rho)
    w90 = max(0.0, math.log(10 * pq) / decay) if pq > 0 else 0.0
    return QueueResult(
        utilization=rho,
        p0=p0,
        prob_queueing=pq,
        mean_jobs=m * rho + nq,
        mean_queue_length=nq,
        mean_response_time=1 / mu + w,
        mean_waiting_time=w,
        var_jobs=m * rho + rho * pq * ((1 + rho - rho * pq) / (1 - rho) ** 2 + m),
        var_waiting_time=pq * (2 - pq) / decay**2,
        throughput=lam,
        waiting_time_p90=w90,
    )


def mmmb(lam: float, mu: float, m: int, capacity: int) -> QueueResult:
    """M/M/m/B: at most B jobs in the system (B >= m); arrivals finding it full are lost."""
    _check_rates(lam, mu)
    if m < 1 or capacity < m:
        raise ModelError(f"M/M/m/B needs m >= 1 and capacity B >= m (m={m}, B={capacity})")
    a = lam / mu
    weights = [1.0]
    for n in range(1, capacity + 1):
        weights.append(weights[-1] * a / min(n, m))
    total = sum(weights)
    p = [x / total for x in weights]
    loss = p[capacity]
    lam_eff = lam * (1 - loss)
    n_mean = sum(n * pn for n, pn in enumerate(p))
    nq = sum((n - m) * pn for n, pn in enumerate(p) if n > m)
    r = n_mean / lam_eff if lam_eff > 0 else 1 / mu
    w = nq / lam_eff if lam_eff > 0 else 0.0
    return QueueResult(
        utilization=lam_eff / (m * mu),
        p0=p[0],
        prob_queueing=sum(p[m:capacity]),
        mean_jobs=n_mean,
        mean_queue_length=nq,
        mean_response_time=r,
        mean_waiting_time=w,
        var_jobs=sum((n - n_mean) ** 2 * pn for n, pn in enumerate(p)),
        throughput=lam_eff,
        loss_probability=loss,
    )


def mg1(lam: float, mu: float, scv: float) -> QueueResult:
    """M/G/1 with service-time squared coefficient of variation `scv` (1 = exponential, 0 = constant)."""
    _check_rates(lam, mu)
    if scv < 0:
        raise ModelError("the squared coefficient of variation cannot be negative")
    rho = lam / mu
    if rho >= 1:
        raise ModelError(f"M/G/1 is unstable: utilization λ/μ = {rho:.3f} >= 1")
    w = rho * (1 + scv) / (2 * mu * (1 - rho))
    nq = lam * w
    return QueueResult(
        utilization=rho,
        p0=1 - rho,
        prob_queueing=rho,
        mean_jobs=nq + rho,
        mean_queue_length=nq,
        mean_response_time=w + 1 / mu,
        mean_waiting_time=w,
        throughput=lam,
    )


def mmm_waiting_quantile(lam: float, mu: float, m: int, q: float) -> float:
    """The q-quantile of the waiting time in M/M/m: P(W > t) = C e^{-mμ(1-ρ)t}."""
    if not 0 < q < 1:
        raise ModelError("a quantile is between 0 and 1")
    res = mmm(lam, mu, m)
    pq = res.prob_queueing
    if pq <= 1 - q:
        return 0.0
    return math.log(pq / (1 - q)) / (m * mu * (1 - res.utilization))


def mm1_response_quantile(lam: float, mu: float, q: float) -> float:
    """The q-quantile of the response time in M/M/1 (exponential with mean 1/(μ-λ))."""
    if not 0 < q < 1:
        raise ModelError("a quantile is between 0 and 1")
    return mm1(lam, mu).mean_response_time * math.log(1 / (1 - q))

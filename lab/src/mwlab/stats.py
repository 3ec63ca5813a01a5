"""How far a measurement can be trusted: pure functions on series of numbers.

- **Warm-up:** [`mser5`] — the MSER-5 rule (White, 1997; the best-rated
  truncation rule in simulation studies): average the series in batches of
  five, and cut the prefix that minimises the standard error of the mean of
  what is left, searching the first half only and keeping at least two
  batches. On a steady series MSER-5 still cuts something most of the time
  (35–60% of series of 20–300 values, every series of 10–14), so
  [`warmup`] accepts its cut only where the part cut differs from the rest
  (a t test with the spread of the rest, p < 0.005) and judges no series
  shorter than 20 values.
- **Confidence intervals of a mean** when successive values are correlated
  (per-window throughput of one run): [`batch_means_ci`] — non-overlapping
  batch means, the batch size doubled until the batch means' lag-1
  autocorrelation is small, then a Student-t interval over the batches.
  [`naive_ci`] is the textbook interval that assumes independence, kept to
  show how much it under-covers.
- **Confidence intervals of a percentile:** [`percentile_ci`] — the
  order-statistic (binomial) interval, with the sample size replaced by the
  effective sample size of the indicator series ``x <= q`` (its integrated
  autocorrelation, estimated with batch means) when the values come in time
  order, as response times of one run do.
- **Stationarity and drift:** [`stationarity`] — KPSS (null: stationary)
  from statsmodels at 2.5%, ADF (null: unit root) reported beside it;
  [`trend`] — Mann–Kendall (Kendall's tau against time) at 2.5%, for windows
  of a run or repetitions in their run order. A run's windows count as
  stationary unless KPSS or Mann–Kendall rejects, so the two together raise
  a false alarm on at most 5% of steady series (Bonferroni). Requiring ADF to
  reject a unit root as well, as earlier versions did, flagged 54% of steady
  series of 20 values: on short series ADF rarely rejects anything.

False-alarm rates on steady series and power on series with a transient or
a drift are measured by `tests/test_check_rates.py` and listed in
docs/statistics.md.

Every function returns plain numbers and says which method it used, so the
report and `mwlab stats` can show it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

# Batch means: lag-1 autocorrelation of the batch means below which batches
# count as independent, and the fewest batches an interval is built from.
ACF_LIMIT = 0.1
MIN_BATCHES = 10


@dataclass(frozen=True)
class Interval:
    """An estimate with its confidence interval and how it was made."""

    estimate: float
    lo: float
    hi: float
    confidence: float
    method: str
    n: int
    # Batch means: the batch size and number of batches; percentiles: the
    # effective sample size.
    batch_size: int = 1
    batches: int = 0
    effective_n: float = float("nan")

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def relative_half_width(self) -> float:
        """Half the interval over the estimate (inf for an estimate of 0)."""
        return self.half_width / abs(self.estimate) if self.estimate else math.inf

    def covers(self, value: float) -> bool:
        return self.lo <= value <= self.hi

    def as_dict(self) -> dict:
        d = asdict(self)
        d["mean" if self.method != "order statistics" else "percentile"] = d.pop("estimate")
        d["ci"] = [d.pop("lo"), d.pop("hi")]
        return d


def _clean(series: Sequence[float]) -> np.ndarray:
    a = np.asarray(series, dtype=float)
    return a[~np.isnan(a)]


def mser5(series: Sequence[float], batch: int = 5) -> int:
    """The MSER-5 truncation point: the index of the first value to keep.

    The series is averaged in batches of `batch` (a partial last batch is
    dropped); for each candidate cut d (in batches, over the first half) the
    statistic is the variance of the kept batch means divided by their count
    — the squared standard error of the kept mean — and the smallest wins.
    Returns 0 for series too short to judge (fewer than three batches)."""
    a = _clean(series)
    k = len(a) // batch
    if k < 3:
        return 0
    means = a[: k * batch].reshape(k, batch).mean(axis=1)
    best, best_d = math.inf, 0
    # At least two batches kept: one alone has no variance and always "wins".
    for d in range(min(k // 2, k - 2) + 1):
        kept = means[d:]
        m = len(kept)
        stat = float(np.sum((kept - kept.mean()) ** 2)) / (m * m)
        if d == 0 or stat < best * (1 - 1e-12):
            best, best_d = stat, d
    return best_d * batch


WARMUP_ALPHA = 0.005  # a cut is accepted when the part cut differs from the rest below this p
WARMUP_MIN = 20  # fewer values: too short to judge a warm-up
STATIONARITY_MIN = 10  # fewer values: too short to judge stationarity
KPSS_ALPHA = 0.025
TREND_ALPHA = 0.025


@dataclass(frozen=True)
class Warmup:
    """The warm-up found in one or more series of the same windows."""

    cut: int  # values to discard (0: no warm-up shown)
    mser_cut: int  # what MSER-5 alone would cut (largest over the series)
    p: float  # p of the part cut against the rest (smallest over the series)
    judged: bool
    n: int
    method: str = "MSER-5, cut accepted at p < 0.005 (t test with the rest's spread)"

    def as_dict(self) -> dict:
        return asdict(self)


def warmup(*series: Sequence[float], alpha: float = WARMUP_ALPHA) -> Warmup:
    """The warm-up of a run: MSER-5's cut on each series (throughput, mean and
    p99 response time of the same windows), accepted only where the values
    cut differ significantly from the rest; the largest accepted cut. Series
    shorter than [`WARMUP_MIN`] are not judged."""
    arrays = [_clean(x) for x in series]
    n = min((len(a) for a in arrays), default=0)
    if n < WARMUP_MIN:
        return Warmup(0, 0, float("nan"), False, n, f"too short to judge ({n} values; {WARMUP_MIN} needed)")
    cut, mser_cut, best_p = 0, 0, float("nan")
    for a in arrays:
        d = mser5(a)
        mser_cut = max(mser_cut, d)
        if d == 0 or float(np.ptp(a)) == 0.0:
            continue
        p = _head_differs(a[:d], a[d:])
        best_p = p if math.isnan(best_p) else min(best_p, p)
        if p < alpha:
            cut = max(cut, d)
    return Warmup(cut, mser_cut, best_p, True, n)


def _head_differs(head: np.ndarray, rest: np.ndarray) -> float:
    """p of a t test that the values cut have the mean of the rest, with the
    rest's spread (a warm-up's own values vary more than a steady state's,
    which would hide it behind its own variance)."""
    nh, nr = len(head), len(rest)
    sd = float(rest.std(ddof=1)) if nr > 1 else 0.0
    diff = abs(float(head.mean()) - float(rest.mean()))
    if sd == 0.0:
        return 0.0 if diff > 0 else 1.0
    t = diff / (sd * math.sqrt(1 / nh + 1 / nr))
    return float(2 * sps.t.sf(t, nr - 1))


def naive_ci(series: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student-t interval of the mean that assumes independent values."""
    a = _clean(series)
    n = len(a)
    if n < 2:
        m = float(a[0]) if n else float("nan")
        return Interval(m, float("nan"), float("nan"), confidence, "naive t", n)
    m, s = float(a.mean()), float(a.std(ddof=1))
    h = sps.t.ppf(0.5 + confidence / 2, n - 1) * s / math.sqrt(n)
    return Interval(m, m - h, m + h, confidence, "naive t", n)


def _lag1(a: np.ndarray) -> float:
    if len(a) < 3:
        return 0.0
    d = a - a.mean()
    den = float(np.dot(d, d))
    return float(np.dot(d[:-1], d[1:])) / den if den > 0 else 0.0


def _batch_means(a: np.ndarray, b: int) -> np.ndarray:
    """Means of consecutive batches of `b` values; the oldest values that do
    not fill a batch are dropped (the warm-up side)."""
    k = len(a) // b
    return a[len(a) - k * b :].reshape(k, b).mean(axis=1)


def _rank_spread(n: float, q: float, tau: float, confidence: float) -> float:
    """Half-width in ranks of the binomial interval of the `q` quantile of
    `n` values whose correlation makes them worth n/τ independent ones."""
    z = sps.norm.ppf(0.5 + confidence / 2)
    return z * math.sqrt(n * max(tau, 1.0) * q * (1 - q))


def batch_size(series: Sequence[float], min_batches: int = MIN_BATCHES, acf_limit: float = ACF_LIMIT) -> int:
    """The smallest power-of-two batch size whose batch means have a lag-1
    autocorrelation below `acf_limit`, keeping at least `min_batches`
    batches (the largest such size when none qualifies)."""
    a = _clean(series)
    b = 1
    while len(a) // (2 * b) >= min_batches:
        if _lag1(_batch_means(a, b)) < acf_limit:
            return b
        b *= 2
    return b


def batch_means_ci(series: Sequence[float], confidence: float = 0.95) -> Interval:
    """Batch-means interval of the mean of an autocorrelated series."""
    a = _clean(series)
    n = len(a)
    if n < 2 * MIN_BATCHES:
        iv = naive_ci(a, confidence)
        return Interval(iv.estimate, iv.lo, iv.hi, confidence, "naive t (too few values for batch means)", n)
    b = batch_size(a)
    means = _batch_means(a, b)
    k = len(means)
    m, s = float(means.mean()), float(means.std(ddof=1))
    h = sps.t.ppf(0.5 + confidence / 2, k - 1) * s / math.sqrt(k)
    return Interval(m, m - h, m + h, confidence, "batch means", n, batch_size=b, batches=k)


def mean_ci(series: Sequence[float], confidence: float = 0.95, independent: bool = False) -> Interval:
    """The interval the lab uses for a mean: batch means for a time series,
    Student-t for independent values (repetitions)."""
    return naive_ci(series, confidence) if independent else batch_means_ci(series, confidence)


def integrated_autocorrelation(series: Sequence[float], min_batches: int = 2 * MIN_BATCHES) -> float:
    """τ = n·Var(mean)/Var(x) (1 for independent values), estimated with
    batch means: b·Var(batch means)/Var(x) grows with the batch size b until
    batches are independent and then levels off at τ, so the estimate is the
    largest over doubling batch sizes that leave `min_batches` batches."""
    a = _clean(series)
    n = len(a)
    var = float(a.var(ddof=1)) if n > 1 else 0.0
    if n < 2 * min_batches or var <= 0:
        return 1.0
    tau, b = 1.0, 2
    while n // b >= min_batches:
        tau = max(tau, b * float(_batch_means(a, b).var(ddof=1)) / var)
        b *= 2
    return tau


def percentile_ci(
    values: Sequence[float], q: float, confidence: float = 0.95, ordered: bool = True
) -> Interval:
    """Order-statistic interval of the `q` quantile (0 < q < 1).

    The ranks are n·q ± z·sqrt(n_eff·q(1−q))·n/n_eff, the binomial interval
    of how many values fall below the true quantile, with n_eff = n/τ where τ
    is the integrated autocorrelation of the indicator ``x <= estimate``
    when the values are `ordered` in time (1 when they are independent)."""
    a = _clean(values)
    n = len(a)
    if n == 0 or not 0 < q < 1:
        return Interval(float("nan"), float("nan"), float("nan"), confidence, "order statistics", n)
    s = np.sort(a)
    est = float(np.quantile(a, q))
    tau = integrated_autocorrelation((a <= est).astype(float)) if ordered else 1.0
    n_eff = n / tau
    spread = _rank_spread(n, q, tau, confidence)
    lo_rank = max(0, math.floor(n * q - spread) - 1)
    hi_rank = min(n - 1, math.ceil(n * q + spread))
    return Interval(
        est, float(s[lo_rank]), float(s[hi_rank]), confidence, "order statistics", n, effective_n=n_eff
    )


def percentile_ci_from_histogram(
    values: Sequence[float], counts: Sequence[int], q: float, confidence: float = 0.95, tau: float = 1.0
) -> Interval:
    """The order-statistic interval from a histogram (bucket values and their
    counts, as in a merged HDR histogram); `tau` widens it for correlated
    samples (1 = independent)."""
    v = np.asarray(values, dtype=float)
    c = np.asarray(counts, dtype=float)
    order = np.argsort(v)
    v, c = v[order], c[order]
    n = float(c.sum())
    if n <= 0:
        return Interval(float("nan"), float("nan"), float("nan"), confidence, "order statistics", 0)
    cum = np.cumsum(c)

    def at(rank: float) -> float:
        i = int(np.searchsorted(cum, min(max(rank, 1.0), n), side="left"))
        return float(v[min(i, len(v) - 1)])

    n_eff = n / max(tau, 1.0)
    spread = _rank_spread(n, q, tau, confidence)
    return Interval(
        at(math.ceil(n * q)),
        at(math.floor(n * q - spread)),
        at(math.ceil(n * q + spread) + 1),
        confidence,
        "order statistics",
        int(n),
        effective_n=n_eff,
    )


@dataclass(frozen=True)
class Stationarity:
    """KPSS and ADF on one series, and the verdict."""

    kpss_p: float
    adf_p: float
    stationary: bool
    n: int
    method: str = "KPSS (level) at 2.5%; ADF reported"
    judged: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


def stationarity(series: Sequence[float], alpha: float = KPSS_ALPHA) -> Stationarity:
    """Stationary unless KPSS rejects stationarity at `alpha` (ADF's p is
    reported beside it, not required: on short series it rarely rejects a
    unit root, stationary or not). Series of fewer than [`STATIONARITY_MIN`]
    values are not judged; constant ones are stationary."""
    from statsmodels.tsa.stattools import adfuller, kpss

    a = _clean(series)
    n = len(a)
    if n < STATIONARITY_MIN:
        return Stationarity(float("nan"), float("nan"), True, n, f"too short to judge ({n} values)", False)
    if float(np.ptp(a)) == 0.0:
        return Stationarity(float("nan"), float("nan"), True, n, "constant")
    with warnings.catch_warnings():
        # KPSS's p-value is interpolated in a table and clipped at its ends.
        warnings.simplefilter("ignore")
        kpss_p = float(kpss(a, regression="c", nlags="auto")[1])
        try:
            adf_p = float(adfuller(a, autolag="AIC")[1]) if n >= 12 else float("nan")
        except (ValueError, np.linalg.LinAlgError):
            adf_p = float("nan")
    return Stationarity(kpss_p, adf_p, kpss_p > alpha, n)


@dataclass(frozen=True)
class Trend:
    """Mann–Kendall: Kendall's tau of the values against their order."""

    tau: float
    p: float
    trending: bool
    n: int
    method: str = "Mann-Kendall (Kendall's tau against order), 2.5%"

    def as_dict(self) -> dict:
        return asdict(self)


def trend(series: Sequence[float], alpha: float = TREND_ALPHA) -> Trend:
    """Whether the values drift with their order (windows of a run, or
    repetitions in the order they ran)."""
    a = _clean(series)
    n = len(a)
    if n < 4 or float(np.ptp(a)) == 0.0:
        return Trend(0.0, 1.0, False, n)
    res = sps.kendalltau(np.arange(n), a)
    tau, p = float(res.statistic), float(res.pvalue)
    return Trend(tau, p, p < alpha, n)


@dataclass(frozen=True)
class Fit:
    """A goodness-of-fit test: statistic, critical value, verdict."""

    statistic: float
    critical: float
    rejected: bool
    n: int
    method: str

    def as_dict(self) -> dict:
        return asdict(self)


# Stephens (1974): the 5% and 2.5% points of the modified A² for the
# exponential distribution with its mean estimated from the sample. The check
# uses 2.5%: gaps come through a histogram (3 significant digits), which
# raises the 5% test's false alarms to about 6%.
AD_EXPON_5PCT = 1.321
AD_EXPON_2_5PCT = 1.591


def anderson_exponential(sample: Sequence[float], critical: float = AD_EXPON_5PCT) -> Fit:
    """Anderson-Darling test that `sample` is exponential (mean estimated):
    A² modified by (1 + 0.6/n), rejected above `critical` (5%: 1.321)."""
    x = np.sort(_clean(sample))
    x = x[x >= 0]
    n = len(x)
    level = {AD_EXPON_5PCT: "5%", AD_EXPON_2_5PCT: "2.5%"}.get(critical, f"A² > {critical}")
    method = f"Anderson-Darling, exponential with estimated mean, {level}"
    if n < 8 or x.mean() <= 0:
        return Fit(float("nan"), critical, False, n, method + " (too few values)")
    f = 1 - np.exp(-x / x.mean())
    f = np.clip(f, 1e-12, 1 - 1e-12)
    i = np.arange(1, n + 1)
    a2 = -n - float(np.sum((2 * i - 1) * (np.log(f) + np.log(1 - f[::-1])))) / n
    a2 *= 1 + 0.6 / n
    return Fit(a2, critical, a2 > critical, n, method)


def sample_of_histogram(values: Sequence[float], counts: Sequence[int], size: int = 2000) -> np.ndarray:
    """`size` values with the histogram's distribution: its quantiles at
    (k + 0.5)/size, so the sample is the same every time."""
    v = np.asarray(values, dtype=float)
    c = np.asarray(counts, dtype=float)
    order = np.argsort(v)
    v, c = v[order], c[order]
    n = c.sum()
    if n <= 0:
        return np.array([])
    cum = np.cumsum(c)
    ranks = (np.arange(size) + 0.5) / size * n
    return v[np.searchsorted(cum, ranks, side="right").clip(0, len(v) - 1)]

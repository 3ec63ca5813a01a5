"""From result files to tables: trim each run to its measurement windows,
merge the clients' and the middlewares' windows (HDR histograms merged, never
averaged percentiles), compute per-run figures, then mean and standard
deviation over repetitions.

Pure functions over records come first (testable on synthetic windows); the
functions that read a result directory are at the end.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mwlab import stats as trust
from mwlab.procs import LabError
from mwlab.results import merge_hists, read_windows
from mwlab.spec import ExperimentInfo, factor_columns, stored_settings

Window = dict[str, Any]
OPS = ("get", "multiget", "set", "delete", "other", "all")
# mwmq's classes (system: mq), reported where the windows have them.
MQ_OPS = ("send", "recv", "ack", "pop")


def trim_client(windows: Sequence[Window], trim_start: int = 0, trim_end: int = 0) -> list[Window]:
    """The measure-phase windows of a client, minus `trim_start` first and `trim_end` last ones."""
    kept = [w for w in windows if (w.get("client") or {}).get("phase", "measure") == "measure"]
    end = len(kept) - trim_end
    return kept[trim_start:end] if end > trim_start else []


def common_span(clients: Iterable[Sequence[Window]]) -> tuple[int, int] | None:
    """The wall-clock interval covered by every client's kept windows."""
    starts, ends = [], []
    for ws in clients:
        if not ws:
            return None
        starts.append(ws[0]["start_unix_ms"])
        ends.append(ws[-1]["start_unix_ms"] + ws[-1]["duration_ms"])
    if not starts or max(starts) >= min(ends):
        return None
    return max(starts), min(ends)


def within(windows: Sequence[Window], span: tuple[int, int]) -> list[Window]:
    """Windows lying entirely inside `span`."""
    lo, hi = span
    return [w for w in windows if w["start_unix_ms"] >= lo and w["start_unix_ms"] + w["duration_ms"] <= hi]


@dataclass
class Merged:
    """An operation class over several windows (and processes)."""

    count: int = 0
    errors: int = 0
    hits: int = 0
    misses: int = 0
    keys: int = 0
    mean_us: float = float("nan")
    std_us: float = float("nan")
    p25_us: float = float("nan")
    p50_us: float = float("nan")
    p90_us: float = float("nan")
    p99_us: float = float("nan")


def weighted_mean(summaries: Iterable[dict[str, Any]]) -> float:
    """Exact mean of several histogram summaries (each has count and mean)."""
    total = n = 0.0
    for s in summaries:
        total += s["mean"] * s["count"]
        n += s["count"]
    return total / n if n else float("nan")


def _with_percentiles(m: Merged, hists: list[dict[str, Any]]) -> Merged:
    """Fills mean and percentiles from histogram summaries (merging their HDR encodings)."""
    hists = [h for h in hists if h and h["count"]]
    if hists:
        h = merge_hists(x["hdr"] for x in hists)
        m.mean_us = weighted_mean(hists)
        m.std_us = h.get_stddev()
        m.p25_us = h.get_value_at_percentile(25)
        m.p50_us = h.get_value_at_percentile(50)
        m.p90_us = h.get_value_at_percentile(90)
        m.p99_us = h.get_value_at_percentile(99)
    return m


def merge_op(windows: Sequence[Window], op: str) -> Merged:
    """Operation class `op` merged over windows."""
    recs = [w["ops"][op] for w in windows if op in w["ops"]]
    m = Merged(
        count=sum(r["count"] for r in recs),
        errors=sum(r["errors"] for r in recs),
        hits=sum(r["hits"] for r in recs),
        misses=sum(r["misses"] for r in recs),
        keys=sum(r["keys"] for r in recs),
    )
    return _with_percentiles(m, [r["response_us"] for r in recs])


def merge_stage(windows: Sequence[Window], name: str) -> Merged:
    """A middleware stage histogram (`net_us`, `queue_us`, ...) merged over windows."""
    hists = [(w.get("middleware") or {}).get(name) for w in windows]
    hists = [h for h in hists if h]
    return _with_percentiles(Merged(count=sum(h["count"] for h in hists)), hists)


def seconds(windows: Sequence[Window]) -> float:
    return sum(w["duration_ms"] for w in windows) / 1000.0


def _std(values: Sequence[float]) -> float:
    """Sample standard deviation (NaN with fewer than two values)."""
    vals = [v for v in values if not math.isnan(v)]
    if len(vals) < 2:
        return float("nan")
    mean = sum(vals) / len(vals)
    return math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (sample standard deviation / mean)."""
    vals = [v for v in values if not math.isnan(v)]
    if len(vals) < 2:
        return float("nan")
    mean = sum(vals) / len(vals)
    if mean == 0:
        return float("nan")
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return math.sqrt(var) / mean


def client_metrics(clients: Sequence[Sequence[Window]]) -> dict[str, float]:
    """Figures of the clients' kept windows (all clients together)."""
    flat = [w for ws in clients for w in ws]
    secs = seconds(clients[0]) if clients and clients[0] else 0.0
    out: dict[str, float] = {"client_seconds": secs}
    present = {op for w in flat for op in w["ops"]}
    for op in OPS + tuple(o for o in MQ_OPS if o in present):
        m = merge_op(flat, op)
        prefix = "client" if op == "all" else f"client_{op}"
        out[f"{prefix}_tput"] = m.count / secs if secs else float("nan")
        out[f"{prefix}_rt_mean_us"] = m.mean_us
        if op == "all":
            out.update(
                client_rt_sd_us=m.std_us,
                client_rt_p25_us=m.p25_us,
                client_rt_p50_us=m.p50_us,
                client_rt_p90_us=m.p90_us,
                client_rt_p99_us=m.p99_us,
                client_requests=m.count,
                client_errors=m.errors,
                client_hits=m.hits,
                client_misses=m.misses,
                client_keys=m.keys,
            )
    # Open-loop counters of the load generators: sends behind their time, and
    # arrivals that could not be sent for want of a live connection.
    for key, field in (("client_late", "late_sends"), ("client_unsent", "unsent")):
        out[key] = sum(int((w.get("client") or {}).get(field, 0) or 0) for w in flat)
    n = z_num = z_den = 0.0
    for ws in clients:
        if ws:
            c = ws[0].get("client") or {}
            n += c.get("connections", 0) * c.get("virtual_clients", 1)
            count = sum(w["ops"]["all"]["count"] for w in ws)
            z_num += (c.get("think_time_us", 0.0) or 0.0) * count
            z_den += count
    out["N"] = n
    out["Z_us"] = z_num / z_den if z_den else 0.0
    # Throughput and mean response time of each window (all clients
    # together): stability, and the error bars of a single repetition.
    tputs, _ = window_series(clients)
    rts = window_rt(clients, "mean")
    out["client_window_cv"] = cv(tputs)
    out["client_tput_window_std"] = _std(tputs)
    out["client_rt_window_std_us"] = _std(rts)
    out["windows"] = len(tputs)
    x = out["client_tput"]
    r = out["client_rt_mean_us"]
    if x and not math.isnan(x) and n:
        law = n / x * 1e6 - out["Z_us"]
        out["law_rt_us"] = law
        out["law_deviation"] = (r - law) / law if law else float("nan")
    return out


def middleware_metrics(mws: Sequence[Sequence[Window]]) -> dict[str, float]:
    """Figures of the middlewares' windows within the clients' span (all middlewares together)."""
    flat = [w for ws in mws for w in ws]
    if not flat:
        return {}
    secs = seconds(mws[0])
    m = merge_op(flat, "all")
    out = {
        "mw_tput": m.count / secs if secs else float("nan"),
        "mw_rt_mean_us": m.mean_us,
        "mw_rt_p99_us": m.p99_us,
        "mw_errors": m.errors,
    }
    # pool: waiting for a database connection (mwmq only).
    parts = ("net", "queue", "server", "service") + (
        ("pool",)
        if any(
            "pool_us" in (w.get("middleware") or {}) and (w.get("middleware") or {}).get("pool_us")
            for w in flat
        )
        else ()
    )
    for part in parts:
        st = merge_stage(flat, f"{part}_us")
        out[f"mw_{part}_us"] = st.mean_us
        out[f"mw_{part}_sd_us"] = st.std_us
        out[f"mw_{part}_p25_us"] = st.p25_us
        out[f"mw_{part}_p90_us"] = st.p90_us
    out["mw_rt_sd_us"] = m.std_us
    out["mw_rt_p25_us"] = m.p25_us
    out["mw_rt_p90_us"] = m.p90_us
    qlen = util = 0.0
    for ws in mws:
        dur = sum(w["duration_ms"] for w in ws) or 1
        qlen += sum(w["middleware"]["queue_length_mean"] * w["duration_ms"] for w in ws) / dur
        util += sum(w["middleware"]["worker_utilisation"] * w["duration_ms"] for w in ws) / dur
    out["mw_queue_len"] = qlen
    out["mw_util"] = util / len(mws)
    # Demand of each memcached server per client request: its total server time / requests.
    busy: dict[str, float] = {}
    for w in flat:
        for addr, b in w["middleware"].get("backends", {}).items():
            h = b["server_us"]
            busy[addr] = busy.get(addr, 0.0) + h["mean"] * h["count"]
    for i, addr in enumerate(sorted(busy)):
        out[f"mw_backend{i}_demand_us"] = busy[addr] / m.count if m.count else float("nan")
    return out


def cumulative_at(samples: Sequence[tuple[int, float]], t: float) -> float:
    """A cumulative counter at time `t`, interpolated between samples (and
    extrapolated at the last rate for a moment past the last one)."""
    if not samples:
        return float("nan")
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    if len(samples) >= 2:
        (t0, v0), (t1, v1) = samples[-2], samples[-1]
        if t1 > t0 and t - t1 <= 2 * (t1 - t0):
            return v1 + (v1 - v0) * (t - t1) / (t1 - t0)
    return samples[-1][1]


def _role(process: str) -> str:
    """`mw0` -> `mw`, `mc1` -> `mc`, `cl2` -> `cl`."""
    return process.rstrip("0123456789")


def cpu_metrics(
    samples: dict[tuple[str, str], list[tuple[int, float]]],
    span: tuple[int, int],
    requests: int,
    cores: float,
    remote: frozenset[str] = frozenset(),
) -> dict[str, float]:
    """CPU used during `span` by every process and thread class the lab started,
    by the host, and by everything else; as cores and as µs per request.

    Columns: `cpu_<x>_cores` and `cpu_<x>_us` (per request) for each process
    (`mw0`, `mc1`, `cl0`, `pg0`...), each role (`mw`, `mc`, `cl`, `pg`), each middleware
    thread class (`mw_net`, `mw_worker`, `mw_stats`), PostgreSQL's processes
    by role (`pg_backend`, `pg_walwriter`, ...), the load threads
    (`cl_load`), everything the lab started on this machine (`lab`, including
    its own process; the processes in `remote` ran on SSH hosts, sampled
    there, and count only as themselves and their roles), the host (`host`)
    and the rest (`other` = host - lab); `cores`
    usable, `host_util` (host busy / usable cores), `cl_load_thread_util`
    (the busiest load generator thread class's cores per thread).
    """
    lo, hi = span
    secs = (hi - lo) / 1000.0
    if secs <= 0:
        return {}
    used: dict[str, float] = {}

    def add(name: str, value: float) -> None:
        if not math.isnan(value):
            used[name] = used.get(name, 0.0) + max(0.0, value)

    for (process, thread), series in samples.items():
        delta = cumulative_at(series, hi) - cumulative_at(series, lo)
        if process == "host":
            add("host", delta)
        elif process.startswith("host:"):
            continue
        elif thread == "*":
            if process != "lab":
                add(process, delta)
            if process not in remote:
                add("lab", delta)
            if process != "lab":
                add(_role(process), delta)
        elif process.startswith(("mw", "cl", "pg")):
            add(f"{_role(process)}_{thread}", delta)
    if "host" in used:
        used["other"] = max(0.0, used["host"] - used.get("lab", 0.0))
    out: dict[str, float] = {"cores": cores}
    for name, value in used.items():
        out[f"cpu_{name}_cores"] = value / secs
        out[f"cpu_{name}_us"] = value / requests * 1e6 if requests else float("nan")
    if "host" in used and cores:
        out["host_util"] = used["host"] / secs / cores
    return out


def read_cpu(rdir: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """cpu.csv of a run as series of (unix ms, cumulative CPU seconds) per (process, thread class)."""
    path = rdir / "cpu.csv"
    if not path.exists():
        return {}
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    with path.open() as f:
        next(f, None)
        for line in f:
            parts = line.rstrip("\n").split(",")
            if len(parts) != 4:
                continue
            stamp, process, thread, secs = parts
            series.setdefault((process, thread), []).append((int(stamp), float(secs)))
    return series


def link_metrics(
    rdir: Path, span: tuple[int, int], requests: int, placement: dict[str, Any]
) -> dict[str, float]:
    """Emulated hosts: per host and link direction (`up`: what the host sent,
    `down`: what it received) the achieved rate (Mbit/s, on the wire), bytes
    per request and utilisation of the link's rate over `span`; drops and
    overlimits of the shaping over the run; per host with a CPU quota, the
    share of scheduling periods in which it was throttled."""
    path = rdir / "links.csv"
    if not path.exists():
        return {}
    lo, hi = span
    secs = (hi - lo) / 1000.0
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    throttle: dict[str, list[tuple[int, int, int]]] = {}
    with path.open() as f:
        next(f, None)
        for line in f:
            stamp, host, direction, a, b = line.rstrip("\n").split(",")
            if direction == "throttle":
                n, periods = b.split("/")
                throttle.setdefault(host, []).append((int(stamp), int(n), int(periods)))
            else:
                series.setdefault((host, direction), []).append((int(stamp), float(a)))
    hosts = placement.get("hosts", {})
    out: dict[str, float] = {}
    for (host, direction), samples in series.items():
        moved = cumulative_at(samples, hi) - cumulative_at(samples, lo)
        key = f"link_{host}_{direction}"
        out[f"{key}_mbit"] = moved * 8 / secs / 1e6 if secs > 0 else float("nan")
        out[f"{key}_bytes_per_req"] = moved / requests if requests else float("nan")
        rate = (hosts.get(host) or {}).get(f"{direction}_bps")
        if rate:
            out[f"{key}_rate_mbit"] = rate / 1e6
            out[f"{key}_util"] = moved * 8 / secs / rate if secs > 0 else float("nan")
    qdisc = rdir / "qdisc.json"
    if qdisc.exists():
        q = json.loads(qdisc.read_text())
        for link, end in q.get("end", {}).items():
            start = q.get("start", {}).get(link, {})
            host, direction = link.split("/")
            out[f"link_{host}_{direction}_drops"] = end.get("drops", 0) - start.get("drops", 0)
            out[f"link_{host}_{direction}_overlimits"] = end.get("overlimits", 0) - start.get("overlimits", 0)
    for host, samples in throttle.items():
        inside = [x for x in samples if lo <= x[0] <= hi] or samples
        if len(inside) >= 2:
            periods = inside[-1][2] - inside[0][2]
            out[f"host_{host}_throttled"] = (inside[-1][1] - inside[0][1]) / periods if periods else 0.0
    return out


# ---- reading result directories ----


def _read_all(rdir: Path, prefix: str, offsets: dict[str, float] | None = None) -> list[list[Window]]:
    """The windows of every process `prefix`N of a run; a process on another
    host has its window times moved by that host's clock offset (ms), so that
    windows of different hosts are compared on this machine's clock."""
    dirs = sorted(
        (d for d in rdir.glob(f"{prefix}[0-9]*") if d.is_dir()), key=lambda d: int(d.name[len(prefix) :])
    )
    out = []
    for d in dirs:
        ws = read_windows(d)
        shift = (offsets or {}).get(d.name, 0.0)
        if shift:
            ws = [{**w, "start_unix_ms": w["start_unix_ms"] - round(shift)} for w in ws]
        out.append(ws)
    return out


def clock_offsets(record: dict[str, Any]) -> dict[str, float]:
    """Per process, the clock offset (ms) of the host it ran on, from run.json."""
    placement = record.get("placement") or {}
    hosts = placement.get("hosts") or {}
    return {
        proc: float((hosts.get(host) or {}).get("clock_offset_ms", 0.0))
        for proc, host in (placement.get("processes") or {}).items()
    }


def window_series(clients: Sequence[Sequence[Window]]) -> tuple[list[float], list[str]]:
    """Throughput of every window of the clients together, in time order, and
    each window's phase (warmup, measure, cooldown)."""
    tput: dict[int, float] = {}
    phase: dict[int, str] = {}
    for ws in clients:
        for w in ws:
            start = w["start_unix_ms"]
            tput[start] = tput.get(start, 0.0) + w["ops"]["all"]["count"] / (w["duration_ms"] / 1000.0)
            phase.setdefault(start, (w.get("client") or {}).get("phase", "measure"))
    order = sorted(tput)
    return [tput[t] for t in order], [phase[t] for t in order]


def window_rt(clients: Sequence[Sequence[Window]], stat: str, upto: int | None = None) -> list[float]:
    """A response-time statistic (`mean`, `p99`) of each window in time order
    (the clients' windows of the same moment: the request-weighted mean, or
    the largest p99)."""
    per: dict[int, list[tuple[float, int]]] = {}
    for ws in clients:
        for w in ws:
            a = w["ops"]["all"]
            if a["count"]:
                per.setdefault(w["start_unix_ms"], []).append((float(a["response_us"][stat]), a["count"]))
    out = []
    for t in sorted(per):
        vals = per[t]
        if stat == "mean":
            out.append(sum(v * n for v, n in vals) / sum(n for _, n in vals))
        else:
            out.append(max(v for v, _ in vals))
    return out[:upto] if upto is not None else out


def _counts(h: Any) -> np.ndarray | None:
    """The histogram's bucket counts as an array (None if this hdrhistogram
    version does not expose them)."""
    try:
        return np.ctypeslib.as_array(h.counts)[: h.counts_len]
    except (AttributeError, TypeError, ValueError):
        return None


def _count_le(h: Any, value: float) -> int:
    """Values recorded at or below `value` (HDR precision)."""
    c = _counts(h)
    if c is not None and hasattr(h, "_counts_index_for"):
        return int(c[: h._counts_index_for(int(value)) + 1].sum())
    return sum(
        it.count_at_value_iterated_to for it in h.get_recorded_iterator() if it.value_iterated_to <= value
    )


def _recorded(h: Any) -> tuple[list[float], list[int]]:
    """The values (bucket tops) and counts of the buckets that hold any."""
    c = _counts(h)
    if c is not None:
        idx = np.nonzero(c)[0]
        return [float(h.get_highest_equivalent_value(h.get_value_from_index(int(i)))) for i in idx], [
            int(c[i]) for i in idx
        ]
    vals, counts = [], []
    for it in h.get_recorded_iterator():
        vals.append(it.value_iterated_to)
        counts.append(it.count_at_value_iterated_to)
    return vals, counts


def p99_run_ci(kept: Sequence[Sequence[Window]], q: float = 0.99) -> dict[str, Any]:
    """The 95% interval of a run's p99 response time from the merged
    histograms (order statistics). Response times in a run are correlated, so
    the sample size is divided by τ, estimated from how much the share of
    requests at or below the p99 varies between windows: n_w·Var(share)/(q(1−q))
    would be 1 for independent requests."""
    encoded = [w["ops"]["all"]["response_us"]["hdr"] for ws in kept for w in ws if w["ops"]["all"]["count"]]
    if not encoded:
        return {}
    merged = merge_hists(encoded)
    est = merged.get_value_at_percentile(q * 100)
    shares, sizes = [], []
    h = merge_hists([])
    for e in encoded:
        h.reset()
        h.decode_and_add(e)
        n = h.get_total_count()
        below = _count_le(h, est)
        if n:
            shares.append(below / n)
            sizes.append(n)
    tau = 1.0
    if len(shares) >= 3:
        f = sum(s * n for s, n in zip(shares, sizes, strict=True)) / sum(sizes)
        if 0 < f < 1:
            var = sum(n * (s - f) ** 2 for s, n in zip(shares, sizes, strict=True)) / (len(shares) - 1)
            tau = max(1.0, var / (f * (1 - f)))
    vals, counts = _recorded(merged)
    iv = trust.percentile_ci_from_histogram(vals, counts, q, tau=tau)
    return {
        "client_rt_p99_run_ci_lo_us": iv.lo,
        "client_rt_p99_run_ci_hi_us": iv.hi,
        "client_rt_p99_tau": tau,
    }


def trust_metrics(
    all_windows: Sequence[Sequence[Window]], kept: Sequence[Sequence[Window]]
) -> dict[str, Any]:
    """How far the run's windows can be trusted (`mwlab.stats`): the warm-up
    MSER-5 finds in the warm-up and measured windows against the configured
    one, the batch-means interval of the measured throughput, and whether the
    measured windows are stationary and free of trend."""
    series, phases = window_series(all_windows)
    # Cool-down windows are not part of the question.
    upto = len(phases) - (phases[::-1].index("measure") if "measure" in phases else 0)
    series, phases = series[:upto], phases[:upto]
    measured, _ = window_series(kept)
    # MSER-5 on the windows' throughput, mean and p99 response time, each cut
    # accepted where what it cuts differs from the rest; the largest counts.
    rts = [window_rt(all_windows, stat, upto=len(series)) for stat in ("mean", "p99")]
    w = trust.warmup(series, *[x for x in rts if len(x) == len(series)])
    out: dict[str, Any] = {
        "warmup_windows": sum(1 for p in phases if p == "warmup"),
        "warmup_detected_windows": float(w.cut) if w.judged else float("nan"),
        "warmup_mser_windows": float(w.mser_cut) if w.judged else float("nan"),
        "warmup_p": w.p,
        "warmup_series_windows": len(series),
    }
    ci = trust.batch_means_ci(measured)
    out.update(
        client_tput_run_ci_lo=ci.lo,
        client_tput_run_ci_hi=ci.hi,
        client_tput_run_ci_method=ci.method,
    )
    rt = trust.batch_means_ci(window_rt(kept, "mean"))
    out.update(client_rt_run_ci_lo_us=rt.lo, client_rt_run_ci_hi_us=rt.hi)
    out.update(p99_run_ci(kept))
    st, tr = trust.stationarity(measured), trust.trend(measured)
    out.update(
        windows_kpss_p=st.kpss_p,
        windows_adf_p=st.adf_p,
        windows_trend_p=tr.p,
        windows_stationary=float(st.stationary and not tr.trending) if st.judged else float("nan"),
        windows_measured=len(measured),
    )
    return out


# Gaps between sends shorter than this are left out of the exponential test.
GAP_RESOLUTION_US = 100.0


def gap_fit(h: Any) -> tuple[trust.Fit, float, float]:
    """Anderson-Darling test that the gaps in histogram `h` are exponential:
    (the test, the mean gap, the resolution r). Gaps below the wake-up
    resolution of a load thread (tens of µs) are distorted even when it keeps
    up; exponential gaps are memoryless, so those above r, less r, are
    exponential with the same mean: the test takes those."""
    vals, counts = _recorded(h)
    mean = h.get_mean_value()
    r = min(GAP_RESOLUTION_US, mean / 2)
    above = [(v - r, c) for v, c in zip(vals, counts, strict=True) if v > r]
    # A sample no larger than the gaps recorded: drawing more from a small
    # histogram repeats values and makes the test sure of what it never saw.
    size = min(2000, sum(c for _, c in above))
    sample = trust.sample_of_histogram([v for v, _ in above], [c for _, c in above], size)
    return trust.anderson_exponential(sample, trust.AD_EXPON_2_5PCT), mean, r


def generator_metrics(clients: Sequence[Sequence[Window]]) -> dict[str, Any]:
    """Whether the load generator ran the load it was asked for.

    Open loop: the achieved rate against the target, the share of sends that
    left more than 1 ms late and the 99th percentile of lateness, and an
    Anderson-Darling test that the gaps between a thread's sends are
    exponential (the arrivals were drawn so). Closed loop: the interactive
    law in each window (the largest deviation)."""
    flat = [w for ws in clients for w in ws]
    if not flat:
        return {}
    out: dict[str, Any] = {}
    open_loop = any((w.get("client") or {}).get("mode") == "open" for w in flat)
    if open_loop:
        secs = seconds(clients[0]) if clients[0] else 0.0
        target = sum(float((ws[0].get("client") or {}).get("target_rate", 0.0)) for ws in clients if ws)
        sent = sum(w["ops"]["all"]["count"] for w in flat)
        late = sum(int((w.get("client") or {}).get("late_sends", 0) or 0) for w in flat)
        out["gen_target_rate"] = target
        out["gen_rate_ratio"] = sent / secs / target if secs and target else float("nan")
        out["gen_late_share"] = late / sent if sent else float("nan")
        lates = [
            w["client"]["send_late_us"]["hdr"] for w in flat if (w.get("client") or {}).get("send_late_us")
        ]
        if lates:
            out["gen_late_p99_us"] = float(merge_hists(lates).get_value_at_percentile(99.0))
        gaps = [w["client"]["send_gap_us"]["hdr"] for w in flat if (w.get("client") or {}).get("send_gap_us")]
        if gaps:
            fit, mean, r = gap_fit(merge_hists(gaps))
            out["gen_gap_ad"] = fit.statistic
            out["gen_gap_exponential"] = float(not fit.rejected) if fit.n >= 8 else float("nan")
            out["gen_gap_mean_us"] = mean
            out["gen_gap_resolution_us"] = r
    else:
        worst = 0.0
        for ws in clients:
            if not ws:
                continue
            c = ws[0].get("client") or {}
            n = c.get("connections", 0) * c.get("virtual_clients", 1)
            z = c.get("think_time_us", 0.0) or 0.0
            for w in ws:
                a = w["ops"]["all"]
                x = a["count"] / (w["duration_ms"] / 1000.0)
                if a["count"] < 100 or not x:
                    continue
                law = n / x * 1e6 - z
                if law > 0:
                    worst = max(worst, abs(a["response_us"]["mean"] - law) / law)
        out["gen_law_window_max_dev"] = worst
    return out


def run_metrics(rdir: Path, trim_start: int = 0, trim_end: int = 0) -> dict[str, Any]:
    """One row of summary.csv from a run directory."""
    record = json.loads((rdir / "run.json").read_text())
    row: dict[str, Any] = {"point": record["point"], "rep": record["rep"], "status": record["status"]}
    row.update(factor_columns(record.get("factors", {})))
    if record["status"] != "ok":
        row["error"] = record.get("error", "")
        return row
    offsets = clock_offsets(record)
    every = _read_all(rdir, "cl", offsets)
    clients = [trim_client(ws, trim_start, trim_end) for ws in every]
    span = common_span(clients)
    if span is None:
        row.update(status="failed", error="no measurement window common to all clients")
        return row
    clients = [within(ws, span) for ws in clients]
    row.update(client_metrics(clients))
    row.update(trust_metrics(every, clients))
    row.update(generator_metrics(clients))
    row["warmup_windows"] += trim_start
    first = [ws[0]["start_unix_ms"] for ws in clients if ws]
    row["start_unix_ms"] = min(first) if first else float("nan")
    mws = [within(ws, span) for ws in _read_all(rdir, "mw", offsets)]
    row.update(middleware_metrics(mws))
    placement = record.get("placement") or {}
    remote = frozenset(
        p
        for p, h in (placement.get("processes") or {}).items()
        if placement.get("emulation") == "ssh" and h in (placement.get("hosts") or {})
    )
    cpu = read_cpu(rdir)
    requests = int(row.get("client_requests", 0))
    row.update(cpu_metrics(cpu, span, requests, record.get("cores", 0.0), remote))
    threads = stored_settings(record.get("settings", {})).topology.threads * max(
        1, sum(1 for d in rdir.glob("cl[0-9]*") if d.is_dir())
    )
    if "cpu_cl_load_cores" in row:
        row["cl_load_threads"] = threads
        row["cl_load_thread_util"] = row["cpu_cl_load_cores"] / threads
    delay = record.get("delay")
    if delay:
        # Link delays: what they add to a request's round trips, and the
        # worst probe against what it should have measured.
        row["delay_rtt_us"] = float(delay.get("rtt_per_request_us", 0.0))
        row["delay_client_rtt_us"] = float(delay.get("client_rtt_us", 0.0))
        row["delay_backend_rtt_us"] = float(delay.get("backend_rtt_us", 0.0))
        row["delay_method"] = delay.get("method", "")
        probes = delay.get("probes") or []
        if probes:
            worst = max(probes, key=lambda p: abs(p["measured_us"] - p["expected_us"]))
            row["delay_probe_expected_us"] = worst["expected_us"]
            row["delay_probe_measured_us"] = worst["measured_us"]
    database = record.get("database") or {}
    if database.get("standby_flush_lag_us") is not None:
        # The synchronous standby's round trip, which every commit waits
        # for: the samples of the measured windows (the warm-up's include
        # the standby catching up with the schema), else all of them.
        samples = database.get("standby_lag_samples")
        samples = samples if isinstance(samples, list) else []
        inside = sorted(lag for t, lag in samples if span[0] <= t <= span[1])
        row["standby_lag_us"] = (
            float(inside[len(inside) // 2]) if inside else float(database["standby_flush_lag_us"])
        )
    row.update(link_metrics(rdir, span, requests, placement))
    row.update(host_metrics(cpu, span, requests, placement))
    return row


def host_metrics(
    cpu: dict[tuple[str, str], list[tuple[int, float]]],
    span: tuple[int, int],
    requests: int,
    placement: dict[str, Any],
) -> dict[str, float]:
    """Per host of its own (emulated with a CPU quota, or reached over SSH and
    sampled there): the CPU its processes used per request
    (`cpu_host_<h>_us`) and the cores they had (`cpu_host_<h>_quota`: the
    quota, or the host's cores less what other processes there took); for an
    SSH host also its busy share (`host_util_<h>`), the other processes' cores
    (`cpu_other_<h>_cores`) and its cores (`cores_<h>`)."""
    out: dict[str, float] = {}
    secs = (span[1] - span[0]) / 1000.0

    def moved(key: tuple[str, str]) -> float:
        return cumulative_at(cpu[key], span[1]) - cumulative_at(cpu[key], span[0]) if key in cpu else 0.0

    for host, spec in (placement.get("hosts") or {}).items():
        cores = spec.get("cores") if spec.get("sampled") else None
        if spec.get("cpus") is None and not cores:
            continue
        procs = [p for p, h in placement.get("processes", {}).items() if h == host]
        used = sum(moved((p, "*")) for p in procs)
        out[f"cpu_host_{host}_us"] = used / requests * 1e6 if requests else float("nan")
        if spec.get("cpus") is not None:
            out[f"cpu_host_{host}_quota"] = spec["cpus"]
            continue
        busy = moved((f"host:{host}", "busy"))
        other = max(0.0, busy - used) / secs if secs > 0 else float("nan")
        out[f"cores_{host}"] = float(cores)
        out[f"host_util_{host}"] = busy / secs / cores if secs > 0 else float("nan")
        out[f"cpu_other_{host}_cores"] = other
        out[f"cpu_host_{host}_quota"] = max(cores - other, 0.05)
    return out


def read_experiment(result: Path) -> ExperimentInfo:
    """The experiment.json of a result directory written by `mwlab run`."""
    path = result / "experiment.json"
    if not path.is_file():
        raise LabError(f"{result} is not a result directory of `mwlab run` (it has no experiment.json)")
    try:
        return ExperimentInfo.model_validate_json(path.read_text())
    except ValueError as e:
        raise LabError(f"{path} is damaged: {e}") from e


def compute_tables(result: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The summary (point x repetition) and the aggregate (per point) of a
    result, from its runs' files (nothing written)."""
    meta = read_experiment(result)
    run = meta.settings.run
    rows = [
        run_metrics(r.parent, run.trim_start, run.trim_end) for r in sorted(result.glob("*/rep-*/run.json"))
    ]
    summary = pd.DataFrame(rows)
    aggregate = add_repetition_trust(aggregate_runs(summary, meta.columns), summary)
    return summary, aggregate


def summarize(result: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """summary.csv (point x repetition) and aggregate.csv (per point), computed and written into `result`."""
    summary, aggregate = compute_tables(result)
    summary.to_csv(result / "summary.csv", index=False)
    aggregate.to_csv(result / "aggregate.csv", index=False)
    return summary, aggregate


def tables(result: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """summary.csv and aggregate.csv of a result, computed when missing."""
    if not (result / "summary.csv").exists() or not (result / "aggregate.csv").exists():
        return summarize(result)
    return pd.read_csv(result / "summary.csv"), pd.read_csv(result / "aggregate.csv")


def add_repetition_trust(aggregate: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Across repetitions, the unit of variance between runs: a Student-t
    interval of throughput and of p99 per point, and a Mann-Kendall test of
    throughput in the order the repetitions ran (the run order is shuffled,
    so a trend means the machine drifted)."""
    if aggregate.empty or "client_tput" not in summary:
        return aggregate
    ok = summary[summary["status"] == "ok"]
    # (summary column, prefix of the interval's columns, their suffix)
    measures = (
        ("client_tput", "client_tput_ci", ""),
        ("client_rt_mean_us", "client_rt_mean_ci", "_us"),
        ("client_rt_p99_us", "client_rt_p99_ci", "_us"),
    )
    cols: dict[str, list[float]] = {
        f"{pre}_{end}{suf}": [] for _, pre, suf in measures for end in ("lo", "hi")
    }
    cols["reps_trend_p"] = []
    for point in aggregate["point"]:
        runs = ok[ok["point"] == point]
        if "start_unix_ms" in runs:
            runs = runs.sort_values("start_unix_ms")
        for col, pre, suf in measures:
            iv = trust.naive_ci(runs[col].tolist()) if col in runs else None
            cols[f"{pre}_lo{suf}"].append(iv.lo if iv else float("nan"))
            cols[f"{pre}_hi{suf}"].append(iv.hi if iv else float("nan"))
        cols["reps_trend_p"].append(
            trust.trend(runs["client_tput"].tolist()).p if len(runs) >= 4 else float("nan")
        )
    out = aggregate.copy()
    for k, v in cols.items():
        out[k] = v
    return out


def aggregate_runs(summary: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """Mean and standard deviation over repetitions of every numeric column, per point."""
    if summary.empty or "status" not in summary:
        return pd.DataFrame()
    ok = summary[summary["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame()
    numeric = [
        c
        for c in ok.columns
        if c not in ("point", "rep", "status", "error", *factors) and pd.api.types.is_numeric_dtype(ok[c])
    ]
    groups = ok.groupby("point", sort=False)
    stats = groups[numeric].agg(["mean", "std"])
    stats.columns = [f"{c}_{s}" if s == "std" else c for c, s in stats.columns]
    front = pd.concat([groups[f].first() for f in factors] + [groups.size().rename("reps")], axis=1)
    agg = pd.concat([front, stats], axis=1).copy()
    agg.insert(0, "point", agg.index)
    agg = agg.reset_index(drop=True)
    return agg.sort_values([*factors, "N"] if "N" in agg else factors, kind="stable").reset_index(drop=True)

"""Checks written into every report, with their numbers: the interactive
response time law, client against middleware throughput, stability across
repetitions and across windows, errors and misses; and what makes a result
noisy or not about the system under test: other processes taking CPU
(interference), a saturated host, a saturated load generator."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from mwlab import stats as trust

LAW_TOLERANCE = 0.05
THROUGHPUT_TOLERANCE = 0.05
REPS_CV_LIMIT = 0.10
WINDOWS_CV_LIMIT = 0.15
EMPTY_RECEIVE_LIMIT = 0.05  # mwmq: share of requests that were receives finding nothing
INTERFERENCE_LIMIT = 0.10  # share of the usable cores other processes may take
SATURATION_LIMIT = 0.90  # host CPU or load-generator thread utilisation


@dataclass(frozen=True)
class Check:
    """One verdict on one point (or run)."""

    name: str
    where: str
    ok: bool
    detail: str
    # False where the data were too few to judge (the check then passes and
    # says so, rather than failing).
    judged: bool = True

    @property
    def verdict(self) -> str:
        if not self.judged:
            return "too short to judge"
        return "ok" if self.ok else "CHECK"

    @staticmethod
    def too_short(name: str, where: str, have: float, unit: str, need: int) -> Check:
        """A check the data were too few to judge: it passes and says so
        (the verdict says "too short to judge", the detail by how much)."""
        return Check(name, where, True, f"{have:.0f} {unit}; {need} needed", judged=False)


TREND_ALPHA = trust.TREND_ALPHA  # a Mann-Kendall p below this is a trend
RATE_SHORTFALL = 0.05  # open loop: sending less than 95% of the target rate is the generator's doing
LATE_SHARE_LIMIT = 0.01  # open loop: more than 1% of sends over 1 ms late
WINDOW_LAW_TOLERANCE = 0.10  # closed loop: a window's R this far from N/X - Z


def _nan(x: object) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _count(row: pd.Series, column: str) -> int:
    """A count of a summary row; 0 where the column is absent or empty."""
    value = row.get(column, 0)
    return 0 if _nan(value) else int(value)


def run_checks(summary: pd.DataFrame, aggregate: pd.DataFrame) -> list[Check]:
    checks: list[Check] = []
    if summary.empty:
        return [Check("runs", "experiment", False, "no run finished")]
    for _, r in summary.iterrows():
        where = f"{r['point']} rep {r['rep']}"
        if r.get("status") != "ok":
            checks.append(Check("run", where, False, f"failed: {r.get('error', '')}"))
            continue
        dev = r.get("law_deviation")
        if not _nan(dev):
            checks.append(
                Check(
                    "interactive law",
                    where,
                    abs(dev) <= LAW_TOLERANCE,
                    f"R measured {r['client_rt_mean_us']:.1f} us, N/X - Z = {r['law_rt_us']:.1f} us "
                    f"(N={r['N']:.0f}, X={r['client_tput']:.0f}/s, Z={r['Z_us']:.0f} us): {dev:+.1%}",
                )
            )
        mw = r.get("mw_tput")
        if not _nan(mw):
            diff = (mw - r["client_tput"]) / r["client_tput"]
            checks.append(
                Check(
                    "client vs middleware throughput",
                    where,
                    abs(diff) <= THROUGHPUT_TOLERANCE,
                    f"clients {r['client_tput']:.0f}/s, middleware {mw:.0f}/s: {diff:+.1%}",
                )
            )
        wcv = r.get("client_window_cv")
        if not _nan(wcv):
            checks.append(
                Check(
                    "stable across windows",
                    where,
                    wcv <= WINDOWS_CV_LIMIT,
                    f"coefficient of variation of per-window throughput {wcv:.1%} "
                    f"(at most {WINDOWS_CV_LIMIT:.0%})",
                )
            )
        checks += noise_checks(r, where)
        expected, measured = r.get("delay_probe_expected_us"), r.get("delay_probe_measured_us")
        if not _nan(expected) and not _nan(measured):
            off = measured - expected
            checks.append(
                Check(
                    "link delay as configured",
                    where,
                    # (0.4 ms: a relay's wake-ups on a loaded two-core machine.)
                    abs(off) <= max(0.10 * expected, 400.0),
                    f"a probe's round trip through the delayed link ({r.get('delay_method', '')}) added "
                    f"{measured / 1e3:.2f} ms, configured {expected / 1e3:.2f} ms ({off / expected:+.1%})",
                )
            )
        checks += trust_checks(r, where)
        checks += generator_checks(r, where)
        errors, unsent = _count(r, "client_errors"), _count(r, "client_unsent")
        detail = f"{errors} of {int(r['client_requests'])} requests"
        if unsent:
            detail += f"; {unsent} arrivals not sent for want of a connection"
        checks.append(Check("errors", where, errors == 0 and unsent == 0, detail))
        misses, keys = _count(r, "client_misses"), _count(r, "client_keys")
        if keys and not _nan(r.get("client_send_tput", float("nan"))):
            # mwmq: a receive that finds nothing is part of the workload (the
            # partner's message is not there yet); many of them mean the
            # clients mostly wait on each other rather than on the system.
            share = misses / keys
            checks.append(
                Check(
                    "empty receives",
                    where,
                    share <= EMPTY_RECEIVE_LIMIT,
                    f"{misses} of {keys} requests were receives that found no message ({share:.1%})",
                )
            )
        elif keys:
            checks.append(
                Check("misses", where, misses == 0, f"{misses} of {keys} keys requested (gets and sets)")
            )
    for _, a in aggregate.iterrows():
        if a.get("reps", 0) >= 2 and not _nan(a.get("client_tput_std")) and a["client_tput"]:
            c = a["client_tput_std"] / a["client_tput"]
            checks.append(
                Check(
                    "stable across repetitions",
                    str(a["point"]),
                    c <= REPS_CV_LIMIT,
                    f"throughput {a['client_tput']:.0f} ± {a['client_tput_std']:.0f}/s "
                    f"(CV {c:.1%}, at most {REPS_CV_LIMIT:.0%})",
                )
            )
        p = a.get("reps_trend_p")
        if _nan(p) and a.get("reps", 0) in (2, 3):
            checks.append(
                Check.too_short("no drift across repetitions", str(a["point"]), a["reps"], "repetitions", 4)
            )
        if not _nan(p):
            checks.append(
                Check(
                    "no drift across repetitions",
                    str(a["point"]),
                    p >= TREND_ALPHA,
                    f"Mann-Kendall on throughput in run order over {int(a['reps'])} repetitions: p = {p:.3g}",
                )
            )
    return checks


def generator_checks(r: pd.Series, where: str) -> list[Check]:
    """Whether the load generator, not the system, limited the load."""
    out: list[Check] = []
    ratio = r.get("gen_rate_ratio")
    if not _nan(ratio):
        late = r.get("gen_late_share", float("nan"))
        p99 = r.get("gen_late_p99_us", float("nan"))
        ok = ratio >= 1 - RATE_SHORTFALL and (_nan(late) or late <= LATE_SHARE_LIMIT)
        out.append(
            Check(
                "load generator kept its schedule",
                where,
                ok,
                f"sent {ratio:.1%} of the target rate {r.get('gen_target_rate', 0):.0f}/s; "
                f"{late:.1%} of sends over 1 ms late (p99 lateness {p99:.0f} us)",
            )
        )
        exp = r.get("gen_gap_exponential")
        if not _nan(exp):
            out.append(
                Check(
                    "arrivals exponential",
                    where,
                    bool(exp),
                    f"gaps between sends over {r.get('gen_gap_resolution_us', float('nan')):.0f} us: "
                    f"Anderson-Darling A² = {r.get('gen_gap_ad', float('nan')):.2f} "
                    f"(exponential rejected above {trust.AD_EXPON_2_5PCT}); mean gap "
                    f"{r.get('gen_gap_mean_us', float('nan')):.0f} us",
                )
            )
    dev = r.get("gen_law_window_max_dev")
    if not _nan(dev):
        out.append(
            Check(
                "interactive law in every window",
                where,
                dev <= WINDOW_LAW_TOLERANCE,
                f"largest deviation of a window's R from N/X - Z: {dev:.1%}",
            )
        )
    return out


def trust_checks(r: pd.Series, where: str) -> list[Check]:
    """The warm-up the windows show against the configured one, and whether
    the measured windows are stationary (`mwlab.stats`, each at most 5% false
    alarms on steady series); "too short to judge" below 20 (warm-up) or 10
    (stationarity) windows."""
    out: list[Check] = []
    detected, configured = r.get("warmup_detected_windows"), r.get("warmup_windows")
    windows = r.get("warmup_series_windows")
    if not _nan(configured) and not _nan(windows):
        if _nan(detected):
            out.append(Check.too_short("warm-up long enough", where, windows, "windows", trust.WARMUP_MIN))
        else:
            mser, p = r.get("warmup_mser_windows", float("nan")), r.get("warmup_p", float("nan"))
            why = (
                f"the first {detected:.0f} windows differ from the rest (p = {p:.2g})"
                if detected
                else "no window differs significantly from the rest"
                + (f" (MSER-5 would cut {mser:.0f}, p = {p:.2g})" if mser else "")
            )
            out.append(
                Check(
                    "warm-up long enough",
                    where,
                    detected <= configured,
                    f"{why}; the run discarded {configured:.0f}",
                )
            )
    st = r.get("windows_stationary")
    measured = r.get("windows_measured")
    if _nan(st) and not _nan(measured):
        out.append(Check.too_short("stationary windows", where, measured, "windows", trust.STATIONARITY_MIN))
    elif not _nan(st):
        out.append(
            Check(
                "stationary windows",
                where,
                bool(st),
                f"KPSS p = {r.get('windows_kpss_p', float('nan')):.3g} (stationary above "
                f"{trust.KPSS_ALPHA}), Mann-Kendall trend p = {r.get('windows_trend_p', float('nan')):.3g} "
                f"(a trend below {trust.TREND_ALPHA}); ADF p = {r.get('windows_adf_p', float('nan')):.3g}",
            )
        )
    return out


def noise_checks(r: pd.Series, where: str) -> list[Check]:
    """Interference and saturation of one run, with the numbers."""
    out = []
    cores = r.get("cores")
    other = r.get("cpu_other_cores")
    if not _nan(other) and not _nan(cores) and cores:
        out.append(
            Check(
                "no interference",
                where,
                other <= INTERFERENCE_LIMIT * cores,
                f"other processes used {other:.2f} of {cores:g} cores ({other / cores:.0%})",
            )
        )
    host = r.get("host_util")
    if not _nan(host):
        out.append(
            Check(
                "host CPU not saturated",
                where,
                host < SATURATION_LIMIT,
                f"host CPU {host:.0%} busy" + (f" ({host * cores:.2f} of {cores:g} cores)" if cores else ""),
            )
        )
    for col in r.index:
        # Hosts reached over SSH, sampled there.
        if not col.startswith("host_util_") or _nan(r[col]):
            continue
        host = col[len("host_util_") :]
        n, other = r.get(f"cores_{host}"), r.get(f"cpu_other_{host}_cores")
        if not _nan(other) and not _nan(n) and n:
            out.append(
                Check(
                    f"no interference on {host}",
                    where,
                    other <= INTERFERENCE_LIMIT * n,
                    f"other processes on {host} used {other:.2f} of {n:g} cores ({other / n:.0%})",
                )
            )
        out.append(
            Check(
                f"{host} CPU not saturated",
                where,
                r[col] < SATURATION_LIMIT,
                f"{host}'s CPU {r[col]:.0%} busy" + (f" ({r[col] * n:.2f} of {n:g} cores)" if n else ""),
            )
        )
    gen = r.get("cl_load_thread_util")
    if not _nan(gen):
        gap = r.get("law_rt_us", float("nan")) - r.get("client_rt_mean_us", float("nan"))
        detail = f"load-generator threads {gen:.0%} busy each"
        if not _nan(gap):
            detail += f"; clients' own time between a reply and the next request {gap:.1f} µs"
        out.append(Check("load generator not saturated", where, gen < SATURATION_LIMIT, detail))
    return out + emulation_checks(r, where)


def emulation_checks(r: pd.Series, where: str) -> list[Check]:
    """Emulated hosts: whether a shaped link or a CPU quota, rather than the
    system under test, limited the run, and whether shaping dropped packets."""
    out = []
    for col in [c for c in r.index if c.startswith("link_") and c.endswith("_util")]:
        util = r[col]
        if _nan(util):
            continue
        key = col[: -len("_util")]
        _, host, direction = key.split("_", 2)
        verb = "sends" if direction == "up" else "receives"
        rate = r.get(f"{key}_rate_mbit", float("nan"))
        drops = r.get(f"{key}_drops", 0)
        achieved = r.get(f"{key}_mbit", float("nan"))
        detail = f"{host} {verb} at {util:.0%} of {rate:g} Mbit/s ({achieved:.1f} Mbit/s)"
        if not _nan(drops) and drops:
            detail += f", {int(drops)} packets dropped by the shaping"
        if util >= SATURATION_LIMIT:
            detail += ": the emulated network, not the system under test, sets the throughput"
        out.append(Check("emulated link not saturated", where, util < SATURATION_LIMIT, detail))
    for col in [c for c in r.index if c.startswith("host_") and c.endswith("_throttled")]:
        share = r[col]
        if _nan(share):
            continue
        host = col[len("host_") : -len("_throttled")]
        out.append(
            Check(
                "CPU quota not throttling",
                where,
                share < INTERFERENCE_LIMIT,
                f"{host} was throttled in {share:.0%} of its scheduling periods",
            )
        )
    return out


def to_frame(checks: list[Check]) -> pd.DataFrame:
    return pd.DataFrame(
        [{**c.__dict__, "verdict": c.verdict} for c in checks],
        columns=["name", "where", "ok", "verdict", "detail"],
    )

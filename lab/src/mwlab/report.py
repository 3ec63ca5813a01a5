"""report.html: one self-contained page (images embedded) with the spec, the
environment, the checks, the tables and the plots of an experiment."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import pandas as pd

from mwlab.analysis import factor_columns, read_experiment
from mwlab.checks import INTERFERENCE_LIMIT, SATURATION_LIMIT, Check, run_checks, to_frame
from mwlab.fit import ExperimentFit
from mwlab.plots import make_plots, save_figure

STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:0}table{border-collapse:collapse;font-size:13px;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}.ok{color:#176317}.bad{color:#a11;font-weight:bold}
pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:12px}figure{margin:1.5em 0}
img{max-width:100%}.wide{overflow-x:auto}.muted{color:#666}
"""

# After load, records how many images decoded, for the rendering test.
CHECK_IMAGES = """
<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images', ok + '/' + imgs.length);
});
</script>
"""


def _delay_text(fit: ExperimentFit) -> str:
    if len(fit.delays) > 1:
        each = ", ".join(f"{e} {d:.1f} µs" for e, d in fit.delays.items())
        return f"The delay is the one fitted parameter, fitted for each engine ({each})"
    return f"The delay, {fit.delay_us:.1f} µs, is the one fitted parameter"


def _table(df: pd.DataFrame, digits: int = 1) -> str:
    if df.empty:
        return "<p class='muted'>(none)</p>"
    return (
        "<div class='wide'>"
        + df.to_html(index=False, float_format=lambda v: f"{v:,.{digits}f}", border=0, na_rep="")
        + "</div>"
    )


def _checks_html(checks: list[Check]) -> str:
    bad = [c for c in checks if not c.ok]
    head = (
        f"<p>{len(checks) - len(bad)} of {len(checks)} checks pass"
        + (f"; <span class='bad'>{len(bad)} need a look</span>" if bad else "")
        + ".</p>"
    )
    rows = "".join(
        f"<tr><td>{html.escape(c.name)}</td><td>{html.escape(c.where)}</td>"
        f"<td class='{'ok' if c.ok else 'bad'}'>{'ok' if c.ok else 'CHECK'}</td>"
        f"<td style='text-align:left'>{html.escape(c.detail)}</td></tr>"
        for c in sorted(checks, key=lambda c: (c.ok, c.name, c.where))
    )
    return head + f"<table><tr><th>check</th><th>where</th><th></th><th>numbers</th></tr>{rows}</table>"


def _noise_html(summary: pd.DataFrame) -> str:
    """How far the runs measured the system under test rather than the machine:
    other processes' CPU, the host's and the load generator's saturation."""
    if summary.empty or "host_util" not in summary:
        return "<p class='muted'>(no CPU samples)</p>"
    ok = summary[summary.get("status", "ok") == "ok"]
    if ok.empty:
        return "<p class='muted'>(no run finished)</p>"
    cores = ok["cores"].max() if "cores" in ok else float("nan")
    other = ok.get("cpu_other_cores", pd.Series(dtype=float))
    host = ok["host_util"]
    gen = ok.get("cl_load_thread_util", pd.Series(dtype=float))
    notes = []
    busy = int((other > INTERFERENCE_LIMIT * cores).sum()) if not other.empty else 0
    if busy:
        notes.append(
            f"<li class='bad'>In {busy} of {len(ok)} runs other processes took more than "
            f"{INTERFERENCE_LIMIT:.0%} of the {cores:g} cores (up to {other.max():.2f}): those results "
            "measure the neighbours too; run them again on a quiet machine.</li>"
        )
    sat = int((host >= SATURATION_LIMIT).sum())
    if sat:
        notes.append(
            f"<li class='bad'>In {sat} of {len(ok)} runs the host CPU was at least "
            f"{SATURATION_LIMIT:.0%} busy (up to {host.max():.0%}): every process shares the same "
            f"{cores:g} cores, so the throughput there is the machine's as much as the system's.</li>"
        )
    gsat = int((gen >= SATURATION_LIMIT).sum()) if not gen.empty else 0
    if gsat:
        notes.append(
            f"<li class='bad'>In {gsat} runs the load generator's threads were saturated: the load, not "
            "the system, set the throughput.</li>"
        )
    if not notes:
        notes.append(
            f"<li class='ok'>No run was disturbed by other processes (at most {other.max():.2f} cores), "
            f"none saturated the host (at most {host.max():.0%}) or the load generator.</li>"
        )
    cols = [
        c
        for c in ("point", "rep", "host_util", "cpu_other_cores", "cl_load_thread_util", "client_window_cv")
        if c in ok
    ]
    table = ok[cols].rename(
        columns={
            "host_util": "host CPU busy",
            "cpu_other_cores": "other processes (cores)",
            "cl_load_thread_util": "load thread busy",
            "client_window_cv": "throughput CV over windows",
        }
    )
    return f"<ul>{''.join(notes)}</ul>" + _table(table, 2)


def _environment(result: Path) -> str:
    for summary in sorted(result.glob("*/rep-*/mw0/summary.json")) + sorted(
        result.glob("*/rep-*/cl0/summary.json")
    ):
        meta = json.loads(summary.read_text()).get("metadata", {})
        items = {k: meta.get(k) for k in ("host", "cpu_model", "cpu_count", "version", "git_revision")}
        return (
            "<table>"
            + "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in items.items())
            + "</table>"
        )
    return "<p class='muted'>(no metadata)</p>"


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<img alt='{html.escape(path.stem)}' src='data:image/png;base64,{data}'>"


def _ms(v: float) -> float:
    return v / 1e3


def readable_points(aggregate: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """The per-point table with units in the headers and errors as percentages."""
    if aggregate.empty:
        return aggregate
    a = aggregate
    out = pd.DataFrame({f: a[f] for f in factors if f in a})
    out["reps"] = a.get("reps")
    out["N"] = a.get("N")

    def put(name: str, col: str, f=lambda v: v) -> None:
        if col in a:
            out[name] = a[col].map(f)

    put("X clients (ops/s)", "client_tput")
    put("± (ops/s)", "client_tput_std")
    put("R clients (ms)", "client_rt_mean_us", _ms)
    put("R p99 (ms)", "client_rt_p99_us", _ms)
    put("X middleware (ops/s)", "mw_tput")
    put("R middleware (ms)", "mw_rt_mean_us", _ms)
    put("queue length", "mw_queue_len")
    put("queue time (ms)", "mw_queue_us", _ms)
    put("server time (ms)", "mw_server_us", _ms)
    put("workers busy", "mw_util", _pct_plain)
    put("host CPU busy", "host_util", _pct_plain)
    put("interactive law", "law_deviation", _pct)
    if "client_keys" in a and "client_misses" in a:
        out["miss rate"] = (a["client_misses"] / a["client_keys"].where(a["client_keys"] > 0)).map(_pct_plain)
    if "client_errors" in a:
        out["errors"] = a["client_errors"]
    return out


def _pct_plain(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


STAGES = (
    ("net thread", "mw_net"),
    ("queue", "mw_queue"),
    ("server", "mw_server"),
    ("service", "mw_service"),
    ("middleware response", "mw_rt"),
)


def stage_table(aggregate: pd.DataFrame) -> pd.DataFrame:
    """Per point and stage: mean, standard deviation, CV, p25 and p90 (seed 000, section 1.7)."""
    rows = []
    for _, r in aggregate.iterrows():
        for name, col in STAGES:
            mean = r.get(f"{col}_us" if col != "mw_rt" else "mw_rt_mean_us")
            if mean is None or (isinstance(mean, float) and math.isnan(mean)):
                continue
            sd = r.get(f"{col}_sd_us", float("nan"))
            rows.append(
                {
                    "point": r["point"],
                    "stage": name,
                    "mean (us)": mean,
                    "std (us)": sd,
                    "CV": sd / mean if mean else float("nan"),
                    "p25 (us)": r.get(f"{col}_p25_us", float("nan")),
                    "p90 (us)": r.get(f"{col}_p90_us", float("nan")),
                }
            )
        if "client_rt_sd_us" in r:
            mean, sd = r["client_rt_mean_us"], r["client_rt_sd_us"]
            rows.append(
                {
                    "point": r["point"],
                    "stage": "client response",
                    "mean (us)": mean,
                    "std (us)": sd,
                    "CV": sd / mean if mean else float("nan"),
                    "p25 (us)": r.get("client_rt_p25_us"),
                    "p90 (us)": r.get("client_rt_p90_us"),
                }
            )
    return pd.DataFrame(rows)


def _count(v) -> str:
    return "" if v is None or pd.isna(v) else f"{round(v):,}"


def link_table(aggregate: pd.DataFrame) -> pd.DataFrame:
    """Emulated hosts: per point and shaped link direction, the rate achieved
    against the configured one, bytes per request, and the shaping's drops and
    overlimits (from `tc -s`: packets that waited for tokens)."""
    rows = []
    cols = [c for c in aggregate.columns if c.startswith("link_") and c.endswith("_rate_mbit")]
    for _, r in aggregate.iterrows():
        for col in cols:
            key = col[: -len("_rate_mbit")]
            if pd.isna(r.get(col)):
                continue
            _, host, direction = key.split("_", 2)
            rows.append(
                {
                    "point": r["point"],
                    "link": f"{host} {'sends' if direction == 'up' else 'receives'}",
                    "rate (Mbit/s)": r[col],
                    "achieved (Mbit/s)": r.get(f"{key}_mbit"),
                    "utilisation": _pct_plain(r.get(f"{key}_util")),
                    "bytes/request": r.get(f"{key}_bytes_per_req"),
                    "drops": _count(r.get(f"{key}_drops")),
                    "overlimits": _count(r.get(f"{key}_overlimits")),
                }
            )
    return pd.DataFrame(rows)


def max_throughput_table(aggregate: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """Per configuration (the factors other than the client counts), the point
    of largest throughput, measured on the clients and on the middleware (seed 001)."""
    from mwlab.fit import CLIENT_FACTORS

    others = [f for f in factors if f in aggregate and f not in CLIENT_FACTORS]
    groups = [("all", aggregate)] if not others else list(aggregate.groupby(others, sort=True))
    rows = []
    for key, g in groups:
        if g["client_tput"].isna().all():
            continue
        best = g.loc[g["client_tput"].idxmax()]
        key = key if isinstance(key, tuple) else (key,)
        row = {"configuration": ", ".join(f"{f}={v}" for f, v in zip(others, key, strict=False)) or "all"}
        row.update(
            {
                "N": best.get("N"),
                "X clients (ops/s)": best.get("client_tput"),
                "X middleware (ops/s)": best.get("mw_tput", float("nan")),
                "R clients (ms)": _ms(best.get("client_rt_mean_us", float("nan"))),
                "R middleware (ms)": _ms(best.get("mw_rt_mean_us", float("nan"))),
                "queue time (ms)": _ms(best.get("mw_queue_us", float("nan"))),
                "miss rate": _pct_plain(best["client_misses"] / best["client_keys"])
                if best.get("client_keys")
                else "",
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _figure(result: Path, stem: str, draw) -> str:
    png, _ = save_figure(result / "plots", stem, draw)
    return f"<figure>{_img(png)}</figure>"


def _pct(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:+.1f}%"


def _why_not(p, row: pd.Series) -> str:
    """A reason the model misses a point, from the point's own measurements."""
    reasons = []
    other = row.get("cpu_other_cores", 0.0)
    if isinstance(other, float) and other > 0.1 * max(row.get("cores", 1.0), 1.0):
        reasons.append(f"other processes took {other:.2f} cores")
    if row.get("cl_load_thread_util", 0.0) >= 0.9:
        reasons.append("the load generator's threads were saturated")
    link = any(d.in_network and d.name.startswith("link ") for d in p.devices)
    if link and p.n <= p.knee and p.r_error > 0:
        reasons.append(
            "below the knee a reply's packets cross the emulated link while the hosts' CPUs handle the ones "
            "before: processing and transmission overlap, which a network visited one center after the "
            "other counts twice"
        )
    util = row.get("host_util", 0.0)
    if util >= 0.9:
        reasons.append(
            f"the host CPU was {100 * util:.0f}% busy: scheduling many threads on few cores costs more "
            "than an M/M/m center predicts"
        )
    elif p.knee < p.n:
        reasons.append(
            "between the knee and saturation, where waiting for the shared CPU (wake-ups, processor sharing "
            "among many threads) grows faster than in an M/M/m center"
        )
    if row.get("reps", 1) < 2:
        reasons.append("one repetition: run-to-run noise on this machine is of the same size")
    return "; ".join(reasons) or "no measured cause"


def _models_html(
    result: Path, summary: pd.DataFrame, aggregate: pd.DataFrame, factors: list[str], settings: dict
) -> str:
    from mwlab.fit import (
        HOLDS,
        bottleneck_agrees,
        factorial_fit,
        fit_experiment,
        law_table,
        model_table,
        queue_views,
        utilization_table,
    )
    from mwlab.plots import model_vs_measured, variation_chart

    parts = []
    fit = fit_experiment(aggregate, factors, settings)
    if fit is not None and fit.points:
        model_table(fit).to_csv(result / "model.csv", index=False)
        utilization_table(fit).to_csv(result / "utilization.csv", index=False)
        rows = {str(r["point"]): r for _, r in aggregate.iterrows()}
        table = pd.DataFrame(
            [
                {
                    "point": p.point,
                    "N": p.n,
                    "X measured (ops/s)": p.x_measured,
                    "X model (ops/s)": p.x_model,
                    "X error": _pct(p.x_error),
                    "R measured (ms)": p.r_measured_us / 1e3,
                    "R model (ms)": p.r_model_us / 1e3,
                    "R error": _pct(p.r_error),
                    "bottleneck": p.bottleneck,
                    "agrees with measured utilisation": {True: "yes", False: "NO", None: "?"}[
                        bottleneck_agrees(p)
                    ],
                }
                for p in fit.points
            ]
        )
        misses = [p for p in fit.points if not p.holds]
        verdict = (
            f"The model holds within {HOLDS:.0%} at all {len(fit.points)} points."
            if not misses
            else f"The model holds within {HOLDS:.0%} at {len(fit.points) - len(misses)} of "
            f"{len(fit.points)} points. Where it does not:</p><ul>"
            + "".join(
                f"<li><b>{html.escape(p.point)}</b> (X {_pct(p.x_error)}, R {_pct(p.r_error)}): "
                f"{html.escape(_why_not(p, rows.get(p.point, pd.Series(dtype=float))))}</li>"
                for p in misses
            )
            + "</ul><p>"
        )
        parts += [
            "<h3>Closed network of every point</h3>",
            "<p>Devices and their demands are measured at each point: the host CPU (CPU time per request "
            "of every process the lab started, capacity = usable cores minus what other processes took), "
            "the worker pool (the middleware's service time per request, capacity = workers), and, checked "
            "as bottlenecks, each net thread, each memcached server and the load generator (their CPU time "
            "per request, one server per thread). The network — think time, a delay for what no device "
            "accounts for, the host CPU and the worker pool as multi-server centers — is solved with MVA "
            f"at the point's population. {_delay_text(fit)} "
            f"(least squares over {len(fit.fitted_on)} point(s) below their knee, or all points when none "
            "is). With mwproxy's async engine the worker pool is replaced by the event loops (their CPU "
            "time per request, capacity = loops), which hold no request while the servers answer. "
            "The bottleneck is the device with the largest demand per server, named together with "
            f"every device within 3% of it. Files: <code>model.csv</code>, <code>utilization.csv</code>.</p>",
            f"<p>{verdict}</p>",
            _table(table, 2),
        ]
        law_rows = []
        for p in fit.points:
            t = law_table(p)
            t.insert(0, "point", p.point)
            law_rows.append(t)
        bounds = pd.DataFrame(
            [
                {
                    "point": p.point,
                    "N": p.n,
                    "D (us)": p.total_demand_us,
                    "Dmax (us)": p.max_demand_us,
                    "N*": p.knee,
                    "X bound (ops/s)": p.x_bound,
                    "R bound (ms)": p.r_bound_us / 1e3,
                    "X measured (ops/s)": p.x_measured,
                }
                for p in fit.points
            ]
        )
        parts += [
            "<h3>Operational laws per point</h3>",
            "<p>Demand D of each device per request, its utilisation predicted by the utilisation law "
            "(U = X D / servers, with the model's X) next to the measured one; then the total demand of "
            "the network D, the largest demand per server Dmax, the knee N* = (D + Z) / Dmax and the "
            "asymptotic bounds X ≤ min(N / (D + Z), 1 / Dmax), R ≥ max(D, N Dmax − Z).</p>",
            _table(pd.concat(law_rows, ignore_index=True), 3),
            _table(bounds, 1),
        ]
        by_sweep: dict[str, list] = {}
        for p in fit.points:
            by_sweep.setdefault(p.sweep, []).append(p)
        for i, (label, points) in enumerate(by_sweep.items()):
            if len({p.n for p in points}) < 2:
                continue
            parts.append(
                _figure(
                    result,
                    f"model-{i}",
                    lambda ax, points=points, label=label: model_vs_measured(points, ax, label),
                )
            )
    qv = queue_views(aggregate, settings)
    if not qv.empty:
        parts += [
            "<h3>Single-queue views of the worker pool</h3>",
            "<p>Arrival rate = the middleware's measured throughput; capacity from the measured service "
            "time S (μ = 1/S per worker, m workers; M/M/1: one server m times as fast); predicted waiting "
            "next to the measured queue length and queue time, with the error; <i>unstable</i> at or "
            "beyond ρ = 1.</p>",
            _table(qv, 2),
        ]
    pv = queue_views(aggregate, settings, center="pool")
    if not pv.empty:
        parts += [
            "<h3>Single-queue views of the database pool</h3>",
            "<p>mwmq's database connections as their own center: arrival rate = the middleware's "
            "throughput, service time S = the database time per request (μ = 1/S per connection, "
            "m connections per middleware; points with a connection per worker are left out, as nobody "
            "waits there); predicted waiting next to the measured wait for a connection (Little's law "
            "gives the measured queue length).</p>",
            _table(pv, 2),
        ]
    fact = factorial_fit(summary, factors, "client_tput")
    if fact is not None:
        rows = [
            {
                "effect": n,
                "factors": "·".join(fact.factors.get(ch, ch) for ch in n) if n != "q0" else "mean",
                "value (ops/s)": q,
                "variation": fact.variation.get(n, float("nan")),
                "interval low": fact.ci[n][0] if fact.ci else float("nan"),
                "interval high": fact.ci[n][1] if fact.ci else float("nan"),
            }
            for n, q in fact.effects.items()
        ]
        parts += [
            f"<h3>2^{len(fact.factors)} r factorial analysis of throughput "
            f"(r = {fact.replications}, {int(fact.confidence * 100)}% intervals)</h3>",
            _table(pd.DataFrame(rows), 3),
            _figure(result, "variation", lambda ax: variation_chart(fact.variation, fact.factors, ax)),
        ]
    if not parts:
        return (
            "<p class='muted'>No model applies: a network model needs measured points with a population; "
            "a factorial analysis needs every factor at two levels and repetitions.</p>"
        )
    return "".join(parts)


def write_report(result: Path, summary: pd.DataFrame, aggregate: pd.DataFrame) -> Path:
    """Writes plots, checks.csv and report.html into `result`; returns the report's path."""
    meta = read_experiment(result)
    factors = list(factor_columns(meta["factors"]))
    checks = run_checks(summary, aggregate)
    to_frame(checks).to_csv(result / "checks.csv", index=False)
    plots = make_plots(result, aggregate, factors)
    spec = (result / "spec.yaml").read_text() if (result / "spec.yaml").exists() else ""
    key = readable_points(aggregate, factors)
    failed = summary[summary.get("status", "ok") != "ok"] if "status" in summary else summary.iloc[0:0]
    links = link_table(aggregate) if not aggregate.empty else pd.DataFrame()
    body = [
        f"<h1>{html.escape(meta['name'])}</h1>",
        f"<p class='muted'>{html.escape(meta.get('description', ''))} — scale <b>{meta['scale']}</b>, "
        f"{len(summary)} runs, result directory <code>{html.escape(str(result))}</code></p>",
        "<h2>Noise and saturation</h2>",
        _noise_html(summary),
        "<h2>Checks</h2>",
        "<p>How far the figures can be trusted (<code>mwlab.stats</code>, also on any CSV column with "
        "<code>mwlab stats</code>): <b>warm-up</b> — MSER-5 on the throughput of the warm-up and measured "
        "windows, against the windows the run discarded; <b>stationary windows</b> — KPSS (level) and ADF "
        "on the measured windows' throughput and a Mann-Kendall trend test; <b>drift across "
        "repetitions</b> — Mann-Kendall on the repetitions' throughput in the order they ran. Confidence "
        "intervals: within a run, batch means over the windows (<code>client_tput_run_ci_*</code> in "
        "<code>summary.csv</code>; a Student-t interval when there are fewer than 20 windows); across "
        "repetitions, the unit of variance between runs, Student-t intervals of throughput and p99 "
        "(<code>client_tput_ci_*</code>, <code>client_rt_p99_ci_*_us</code> in <code>aggregate.csv</code>). "
        "Runs too short for a test are not judged.</p>",
        _checks_html(checks),
        "<h2>Results per point</h2>",
        "<p>Means over repetitions (±: standard deviation over repetitions). All columns: "
        "<code>aggregate.csv</code>, per run: <code>summary.csv</code>.</p>",
        _table(key, 2),
        "<h3>Maximum throughput of each configuration</h3>",
        _table(max_throughput_table(aggregate, factors) if not aggregate.empty else aggregate, 2),
        "<h3>Time per stage</h3>",
        "<details><summary>mean, standard deviation, coefficient of variation, 25th and 90th "
        "percentile of each stage of a request, per point</summary>",
        _table(stage_table(aggregate) if not aggregate.empty else aggregate, 1),
        "</details>",
        *(
            [
                "<h3>Emulated links</h3>",
                "<p>Each shaped link per point: its configured rate, the rate it carried over the "
                "measurement, and the packets the shaping held back for tokens (overlimits) or "
                "dropped over the whole run.</p>",
                _table(links, 1),
            ]
            if not links.empty
            else []
        ),
        "<h2>Plots</h2>",
        *[
            f"<figure>{_img(png)}<figcaption>{html.escape(t)} (<a href='plots/{svg.name}'>SVG</a>)"
            "</figcaption></figure>"
            for t, png, svg in plots
        ],
        "<h2>Models</h2>",
        _models_html(result, summary, aggregate, factors, meta["settings"]),
        "<h2>Failed runs</h2>",
        _table(failed[[c for c in ("point", "rep", "error") if c in failed]]),
        "<h2>Environment</h2>",
        _environment(result),
        "<h2>Spec</h2>",
        f"<pre>{html.escape(spec)}</pre>",
    ]
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(meta['name'])}</title>"
        f"<style>{STYLE}</style></head><body>{''.join(body)}{CHECK_IMAGES}</body></html>"
    )
    path = result / "report.html"
    path.write_text(page, encoding="utf-8")
    return path

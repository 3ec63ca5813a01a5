"""report.html: one self-contained page (images embedded) with the spec, the
environment, the checks, the tables and the plots of an experiment."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import pandas as pd

from mwlab.analysis import factor_columns, read_experiment
from mwlab.checks import Check, run_checks, to_frame
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


KEY_COLUMNS = [
    "point",
    "reps",
    "N",
    "client_tput",
    "client_tput_std",
    "client_rt_mean_us",
    "client_rt_mean_us_std",
    "client_rt_p99_us",
    "mw_tput",
    "mw_rt_mean_us",
    "mw_queue_len",
    "mw_queue_us",
    "mw_server_us",
    "mw_util",
    "law_rt_us",
    "client_errors",
    "client_misses",
]


def _figure(result: Path, stem: str, draw) -> str:
    png, _ = save_figure(result / "plots", stem, draw)
    return f"<figure>{_img(png)}</figure>"


def _models_html(
    result: Path, summary: pd.DataFrame, aggregate: pd.DataFrame, factors: list[str], settings: dict
) -> str:
    from mwlab.fit import factorial_fit, fit_sweep, queue_views, sweeps
    from mwlab.plots import model_vs_measured, variation_chart

    parts = []
    for i, (label, g) in enumerate(sweeps(aggregate, factors)):
        fit = fit_sweep(label, g, settings)
        if fit is None:
            continue
        title = f"Closed network for the sweep {label}" if label else "Closed network for the client sweep"
        demands = pd.DataFrame(
            [
                {"center": c.name, "kind": c.kind, "servers": c.servers, "demand (us)": c.demand * 1e6}
                for c in fit.centers
            ]
        )
        holds = (
            f"the model holds (throughput and response time within 15%) up to N = {fit.holds_up_to:.0f}"
            if fit.holds_up_to
            else "the model does not hold within 15% even at the lightest load"
        )
        parts += [
            f"<h3>{html.escape(title)}</h3>",
            f"<p>Think time Z = {fit.think_s * 1e6:.0f} us. "
            f"Bottleneck: <b>{html.escape(fit.bottleneck)}</b>; "
            f"knee N* = {fit.knee:.1f}; {holds}.</p>",
            _table(demands),
            _table(fit.table, 3),
            _figure(
                result,
                f"model-{i}",
                lambda ax, fit=fit, label=label: model_vs_measured(fit.table, fit.curve, ax, label),
            ),
        ]
        qv = queue_views(g, settings)
        if not qv.empty:
            parts += [
                "<p>Single-queue views (arrival rate = measured throughput, capacity = the sweep's "
                "largest throughput; inf = unstable at that load):</p>",
                _table(qv, 2),
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
            "<p class='muted'>No model applies: a network model needs a sweep over the number of clients "
            "through a middleware; a factorial analysis needs every factor at two levels and repetitions.</p>"
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
    key = (
        aggregate[[c for c in [*factors, *KEY_COLUMNS] if c in aggregate]]
        if not aggregate.empty
        else aggregate
    )
    failed = summary[summary.get("status", "ok") != "ok"] if "status" in summary else summary.iloc[0:0]
    body = [
        f"<h1>{html.escape(meta['name'])}</h1>",
        f"<p class='muted'>{html.escape(meta.get('description', ''))} — scale <b>{meta['scale']}</b>, "
        f"{len(summary)} runs, result directory <code>{html.escape(str(result))}</code></p>",
        "<h2>Checks</h2>",
        _checks_html(checks),
        "<h2>Results per point</h2>",
        "<p>Means over repetitions (<code>_std</code>: standard deviation); times in microseconds, "
        "throughput in requests per second. All columns: <code>aggregate.csv</code>, per run: "
        "<code>summary.csv</code>.</p>",
        _table(key),
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

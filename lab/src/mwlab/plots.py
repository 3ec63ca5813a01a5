"""Plots of an experiment. Each plot function takes a DataFrame and an Axes;
`make_plots` picks the x axis (total clients when they vary, else the first
varying factor), one line per level of the other varying factors, and writes
PNG and SVG files."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes

from mwlab.results import merge_hists, read_windows

CLIENT_FACTORS = {"vcli", "tcli", "icli", "ncli"}


def axis_and_lines(agg: pd.DataFrame, factors: list[str]) -> tuple[str, list[str]]:
    """The x column and the columns whose levels make separate lines."""
    varying = [f for f in factors if f in agg and agg[f].nunique() > 1]
    if "N" in agg and agg["N"].nunique() > 1:
        return "N", [f for f in varying if f not in CLIENT_FACTORS]
    if varying:
        return varying[0], varying[1:]
    return "point", []


def _groups(agg: pd.DataFrame, lines: list[str]):
    if not lines:
        yield "", agg
        return
    for key, g in agg.groupby(lines, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield ", ".join(f"{n}={v}" for n, v in zip(lines, key, strict=True)), g


# Per-window spread of a single run, for the figures that have one.
WINDOW_SPREAD = {"client_tput": "client_tput_window_std", "client_rt_mean_us": "client_rt_window_std_us"}


# The clients' throughput and mean response time carry 95% intervals:
# (across repetitions lo, hi, within one run lo, hi).
CI_COLUMNS = {
    "client_tput": (
        "client_tput_ci_lo",
        "client_tput_ci_hi",
        "client_tput_run_ci_lo",
        "client_tput_run_ci_hi",
    ),
    "client_rt_mean_us": (
        "client_rt_mean_ci_lo_us",
        "client_rt_mean_ci_hi_us",
        "client_rt_run_ci_lo_us",
        "client_rt_run_ci_hi_us",
    ),
}


def _errors(g: pd.DataFrame, y: str) -> pd.Series | None:
    """Error bars of `y`. Clients' throughput: the half-width of its 95%
    confidence interval — Student-t over repetitions where a point has
    several, batch means over the windows of its one run where it has one
    (`mwlab.stats`). Other series: the standard deviation over repetitions,
    or over the windows of a single run."""
    reps = g["reps"] if "reps" in g else pd.Series(1, index=g.index)
    ci = CI_COLUMNS.get(y)
    if ci and all(c in g for c in ci):
        across = (g[ci[1]] - g[ci[0]]) / 2
        within = (g[ci[3]] - g[ci[2]]) / 2
        return across.where(reps >= 2, within)
    over_reps = g[f"{y}_std"] if f"{y}_std" in g else pd.Series(float("nan"), index=g.index)
    over_windows = g[WINDOW_SPREAD[y]] if y in WINDOW_SPREAD and WINDOW_SPREAD[y] in g else None
    if over_windows is None:
        return over_reps if over_reps.notna().any() else None
    return over_reps.where(reps >= 2, over_windows)


def error_label(agg: pd.DataFrame, ci: bool = False) -> str:
    """What the error bars are, for plot titles (`ci`: the clients'
    throughput, whose bars are 95% confidence intervals)."""
    reps = agg["reps"] if "reps" in agg else pd.Series([1])
    if ci and "client_tput_ci_hi" in agg:  # (the same methods for response time)
        if (reps >= 2).all():
            return "clients: 95% CI over repetitions (Student-t)"
        if (reps < 2).all():
            return "clients: 95% CI over windows (batch means), one repetition"
        return "clients: 95% CI over repetitions, or windows (batch means) where one"
    if (reps >= 2).all():
        return "mean ± std over repetitions"
    if (reps < 2).all():
        return "mean ± std over windows, one repetition"
    return "mean ± std over repetitions, or windows where one"


def line(
    ax: Axes,
    agg: pd.DataFrame,
    x: str,
    lines: list[str],
    y: str,
    label: str,
    scale: float = 1.0,
    style: str = "-o",
) -> None:
    for name, g in _groups(agg, lines):
        g = g.sort_values(x) if x != "point" else g
        err = _errors(g, y)
        ax.errorbar(
            g[x].astype(str) if x == "point" or g[x].dtype == object else g[x],
            g[y] * scale,
            yerr=err * scale if err is not None else None,
            fmt=style,
            capsize=3,
            label=f"{label} {name}".strip(),
        )


def throughput(agg: pd.DataFrame, ax: Axes, x: str, lines: list[str]) -> None:
    line(ax, agg, x, lines, "client_tput", "clients")
    if "mw_tput" in agg:
        line(ax, agg, x, lines, "mw_tput", "middleware", style="--s")
    ax.set_ylabel("throughput (ops/s)")
    ax.set_title(f"Throughput ({error_label(agg, ci=True)})")


def response_time(agg: pd.DataFrame, ax: Axes, x: str, lines: list[str]) -> None:
    line(ax, agg, x, lines, "client_rt_mean_us", "clients", scale=1e-3)
    if "mw_rt_mean_us" in agg:
        line(ax, agg, x, lines, "mw_rt_mean_us", "middleware", scale=1e-3, style="--s")
    if "law_rt_us" in agg:
        line(ax, agg, x, lines, "law_rt_us", "N/X - Z", scale=1e-3, style=":^")
    ax.set_ylabel("response time (ms)")
    ax.set_title(f"Response time ({error_label(agg, ci=True)})")


def queue(agg: pd.DataFrame, ax: Axes, x: str, lines: list[str]) -> None:
    line(ax, agg, x, lines, "mw_queue_len", "queue length")
    ax.set_ylabel("mean queue length")
    twin = ax.twinx()
    line(twin, agg, x, lines, "mw_queue_us", "queue time", scale=1e-3, style="--s")
    twin.set_ylabel("queue time (ms)")
    ax.set_title("Request queue of the middleware")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize="small")


def breakdown(agg: pd.DataFrame, ax: Axes) -> None:
    """Stacked mean time per point: net, queue, server, rest of service, outside the middleware."""
    parts = {
        "net thread": agg["mw_net_us"],
        "queue": agg["mw_queue_us"],
        "servers": agg["mw_server_us"],
        "worker (rest of service)": (agg["mw_service_us"] - agg["mw_server_us"]).clip(lower=0),
        "network and client": (agg["client_rt_mean_us"] - agg["mw_rt_mean_us"]).clip(lower=0),
    }
    bottom = pd.Series(0.0, index=agg.index)
    labels = agg["point"].astype(str)
    for name, values in parts.items():
        ax.bar(labels, values / 1e3, bottom=bottom / 1e3, label=name)
        bottom = bottom + values
    ax.set_ylabel("time (ms)")
    ax.set_xlabel("point")
    ax.set_title("Where a request's time goes (means)")
    ax.tick_params(axis="x", labelrotation=60, labelsize="x-small")


def percentiles(agg: pd.DataFrame, ax: Axes, x: str, lines: list[str]) -> None:
    for col, name, style in (
        ("client_rt_p50_us", "p50", "-o"),
        ("client_rt_p90_us", "p90", "--s"),
        ("client_rt_p99_us", "p99", ":^"),
    ):
        line(ax, agg, x, lines, col, name, scale=1e-3, style=style)
    ax.set_ylabel("response time (ms)")
    ax.set_title("Response-time percentiles (clients)")


def _merged(windows: list[dict]):
    """The response-time histogram of merged windows (clients): of the
    multi-gets when there are any, else of the gets, else of everything."""
    op = next((o for o in ("multiget", "get", "all") if sum(w["ops"][o]["count"] for w in windows)), "all")
    return merge_hists(w["ops"][op]["response_us"]["hdr"] for w in windows if w["ops"][op]["count"])


def histograms(runs: dict[str, list[dict]], ax: Axes) -> None:
    """Response-time histograms of several runs with common bins (so their
    heights compare), up to the largest 99.5th percentile, in ms."""
    hists = {name: _merged(ws) for name, ws in runs.items() if ws}
    hists = {n: h for n, h in hists.items() if h.get_total_count()}
    if not hists:
        return
    top = max(h.get_value_at_percentile(99.5) for h in hists.values())
    step = max(1, top // 60)
    for name, h in hists.items():
        xs, ys = [], []
        for item in h.get_linear_iterator(step):
            if item.value_iterated_to > top:
                break
            xs.append(item.value_iterated_to / 1e3)
            ys.append(item.count_added_in_this_iter_step)
        ax.step(xs, ys, where="post", label=name)
    ax.set_xlabel(f"response time (ms; bins of {step / 1e3:g} ms)")
    ax.set_ylabel("requests")


def lateness(runs: dict[str, list[dict]], ax: Axes) -> None:
    """Open loop: how late sends left after their intended time (the load
    generator's own delay), as the share of sends later than x, per run."""
    for name, ws in runs.items():
        enc = [w["client"]["send_late_us"]["hdr"] for w in ws if (w.get("client") or {}).get("send_late_us")]
        if not enc:
            continue
        h = merge_hists(enc)
        n = h.get_total_count()
        xs, ys, seen = [], [], 0
        for item in h.get_recorded_iterator():
            seen += item.count_at_value_iterated_to
            xs.append(max(item.value_iterated_to, 1) / 1e3)
            ys.append(max(1 - seen / n, 1 / n))
        ax.step(xs, ys, where="post", label=name)
    ax.axvline(1.0, color="grey", linestyle=":", label="1 ms (late)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("send left later than its intended time by (ms)")
    ax.set_ylabel("share of sends")


def resources(path: Path, ax: Axes) -> None:
    df = pd.read_csv(path)
    if df.empty:
        return
    t0 = df["unix_ms"].min()
    for name, g in df.groupby("name"):
        ax.plot((g["unix_ms"] - t0) / 1000, g["cpu_percent"], label=str(name))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("CPU (% of one core)")
    ax.set_title(f"CPU use per process ({path.parent.parent.name}, {path.parent.name})")


def client_timeline(rdir: Path) -> pd.DataFrame:
    """Per window of a run, all clients together: seconds since the first window,
    throughput, failed requests (errors plus open-loop arrivals not sent) and
    phase. Partial windows shorter than half the usual length are left out."""
    per: dict[int, dict] = {}
    for d in sorted(rdir.glob("cl[0-9]*")):
        for w in read_windows(d):
            a = per.setdefault(w["start_unix_ms"], {"count": 0, "failed": 0, "ms": w["duration_ms"]})
            c = w.get("client") or {}
            a["count"] += w["ops"]["all"]["count"]
            a["failed"] += w["ops"]["all"]["errors"] + int(c.get("unsent", 0) or 0)
            a["phase"] = c.get("phase", "measure")
    if not per:
        return pd.DataFrame(columns=["t", "tput", "failed", "phase"])
    usual = sorted(a["ms"] for a in per.values())[len(per) // 2]
    t0 = min(per)
    rows = [
        {
            "t": (t - t0) / 1000,
            "tput": a["count"] / (a["ms"] / 1000),
            "failed": a["failed"],
            "phase": a["phase"],
        }
        for t, a in sorted(per.items())
        if a["ms"] >= usual / 2
    ]
    return pd.DataFrame(rows)


def timeline(runs: dict[str, pd.DataFrame], ax: Axes) -> None:
    """Throughput per window over each run (first repetition of each point,
    as [`client_timeline`] reads them); windows with failed requests are
    marked with an x, warm-up and cool-down windows are shaded."""
    shaded = set()
    for name, df in list(runs.items())[:8]:
        if df.empty:
            continue
        (drawn,) = ax.plot(df["t"], df["tput"], label=name, linewidth=1.2)
        bad = df[df["failed"] > 0]
        if not bad.empty:
            ax.scatter(bad["t"], bad["tput"], marker="x", s=30, color=drawn.get_color())
        width = df["t"].diff().median() if len(df) > 1 else 1.0
        for phase, color in (("warmup", "tab:orange"), ("cooldown", "tab:purple")):
            for t in df.loc[df["phase"] == phase, "t"]:
                ax.axvspan(
                    t, t + width, color=color, alpha=0.08, label=phase if phase not in shaded else None
                )
                shaded.add(phase)
    ax.set_xlabel("seconds since the first window")
    ax.set_ylabel("throughput per window (ops/s)")
    ax.set_title(
        "Throughput over time (first repetition; x: windows with failures; shaded: warm-up, cool-down)"
    )


def save_figure(out: Path, stem: str, draw, xlabel: str = "") -> tuple[Path, Path]:
    """Draws one plot with `draw(ax)` and writes it as `out/stem.png` and `.svg`."""
    return save_panels(out, stem, [("", draw)], xlabel)


def save_panels(
    out: Path, stem: str, panels: list[tuple[str, Callable]], xlabel: str = ""
) -> tuple[Path, Path]:
    """Draws one panel per `(title, draw)` side by side and writes `out/stem.png` and `.svg`."""
    out.mkdir(exist_ok=True)
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(7.5 if n == 1 else 5.2 * n, 4.5), squeeze=False)
    for ax, (title, draw) in zip(axes[0], panels, strict=True):
        draw(ax)
        if title:
            ax.set_title(f"{title}\n{ax.get_title()}" if ax.get_title() else title)
        if ax.get_xlabel() == "":
            ax.set_xlabel(xlabel)
        if not ax.get_legend() and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    png, svg = out / f"{stem}.png", out / f"{stem}.svg"
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    fig.savefig(svg)
    plt.close(fig)
    return png, svg


WORKLOADS = {"0:1": "read-only", "1:0": "write-only"}


def workload_name(ratio: object) -> str:
    """`0:1` -> read-only, `1:0` -> write-only, anything else -> mixed S:G."""
    return WORKLOADS.get(str(ratio), f"mixed {ratio}")


def by_op(agg: pd.DataFrame, ax: Axes, x: str, lines: list[str], what: str) -> None:
    """Throughput or mean response time of each operation class (gets and sets apart)."""
    for op in ("get", "multiget", "set", "delete"):
        col = f"client_{op}_tput" if what == "tput" else f"client_{op}_rt_mean_us"
        if col in agg and agg.get(f"client_{op}_tput", pd.Series([0])).fillna(0).gt(0).any():
            line(ax, agg, x, lines, col, op, scale=1.0 if what == "tput" else 1e-3)
    ax.set_ylabel("throughput (ops/s)" if what == "tput" else "response time (ms)")
    ax.set_title("Throughput by operation" if what == "tput" else "Response time by operation (means)")


def multiget_sizes(agg: pd.DataFrame, ax: Axes, lines: list[str]) -> None:
    """Response time against the number of keys per multi-get (seed 001, section 5)."""
    for col, name, style in (("client_rt_mean_us", "mean", "-o"), ("client_rt_p99_us", "p99", ":^")):
        line(ax, agg, "mgsize", lines, col, name, scale=1e-3, style=style)
    ax.set_xlabel("keys per multi-get")
    ax.set_ylabel("response time (ms)")
    ax.set_title("Multi-get response time by size")


def _measured_windows(first: dict[str, Path]) -> dict[str, list[dict]]:
    """The clients' measured windows of (up to nine of) the given runs."""
    return {
        name: [
            w
            for d in sorted(rdir.glob("cl[0-9]*"))
            for w in read_windows(d)
            if (w.get("client") or {}).get("phase") == "measure"
        ]
        for name, rdir in list(first.items())[:9]
    }


# The aggregate.csv columns each figure draws (by name prefix), written next
# to it as plots/STEM.csv.
FIGURE_COLUMNS = {
    "throughput": ("client_tput",),
    "response_time": ("client_rt_mean", "client_rt_sd"),
    "percentiles": ("client_rt_p",),
    "ops_throughput": ("client_get_tput", "client_set_tput"),
    "ops_response_time": ("client_get_rt", "client_set_rt"),
    "queue": ("mw_queue",),
    "breakdown": (
        "mw_net_us",
        "mw_queue_us",
        "mw_service_us",
        "mw_server_us",
        "mw_pool_us",
        "client_rt_mean_us",
    ),
    "multiget_sizes": ("client_rt_mean", "client_tput"),
}


def figure_data(agg: pd.DataFrame, factors: list[str], stem: str) -> pd.DataFrame:
    """The aggregate columns a figure draws, with the point, its factors and N."""
    keep = [c for c in ("point", *factors, "N") if c in agg]
    prefixes = FIGURE_COLUMNS.get(stem, ())
    drawn = [c for c in agg.columns if c.startswith(prefixes) and c not in keep]
    return agg[keep + drawn]


def make_plots(
    result: Path, agg: pd.DataFrame, factors: list[str]
) -> list[tuple[str, Path, Path, Path | None]]:
    """Every plot that applies; returns (title, png, svg, csv of the data drawn or None)."""
    out = result / "plots"
    plots: list[tuple[str, Path, Path, Path | None]] = []
    if agg.empty:
        return plots
    out.mkdir(exist_ok=True)

    def data(stem: str, frame: pd.DataFrame | None = None) -> Path:
        path = out / f"{stem}.csv"
        (figure_data(agg, factors, stem) if frame is None else frame).to_csv(path, index=False)
        return path

    x, lines = axis_and_lines(agg, factors)
    xlabel = "clients (N)" if x == "N" else x
    # One panel per workload when the workload varies (seed 001's read-only and write-only).
    if "wrkld" in agg and agg["wrkld"].nunique() > 1 and x != "wrkld":
        panels = [(workload_name(v), g) for v, g in agg.groupby("wrkld", sort=True)]
        lines = [f for f in lines if f != "wrkld"]
    else:
        panels = [("", agg)]

    def figure(title: str, stem: str, draw) -> None:
        plots.append(
            (
                title,
                *save_panels(out, stem, [(name, lambda ax, g=g: draw(g, ax)) for name, g in panels], xlabel),
                data(stem),
            )
        )

    figure("Throughput", "throughput", lambda g, ax: throughput(g, ax, x, lines))
    figure("Response time", "response_time", lambda g, ax: response_time(g, ax, x, lines))
    figure("Percentiles", "percentiles", lambda g, ax: percentiles(g, ax, x, lines))
    ops = [
        o
        for o in ("get", "set")
        if f"client_{o}_tput" in agg and agg[f"client_{o}_tput"].fillna(0).gt(0).any()
    ]
    if len(ops) == 2:
        figure("Throughput by operation", "ops_throughput", lambda g, ax: by_op(g, ax, x, lines, "tput"))
        figure("Response time by operation", "ops_response_time", lambda g, ax: by_op(g, ax, x, lines, "rt"))
    if "mw_queue_len" in agg and agg["mw_queue_len"].notna().any():
        figure("Queue", "queue", lambda g, ax: queue(g, ax, x, lines))
        plots.append(
            (
                "Time breakdown",
                *save_figure(out, "breakdown", lambda ax: breakdown(agg, ax), xlabel),
                data("breakdown"),
            )
        )
    if "mgsize" in agg and agg["mgsize"].nunique() > 1:
        others = [f for f in lines if f != "mgsize"] or [
            f
            for f in factors
            if f in agg and f != "mgsize" and agg[f].nunique() > 1 and f not in CLIENT_FACTORS
        ]
        plots.append(
            (
                "Multi-get sizes",
                *save_figure(out, "multiget_sizes", lambda ax: multiget_sizes(agg, ax, others)),
                data("multiget_sizes"),
            )
        )
    first = {}
    for run in sorted(result.glob("*/rep-1/run.json")):
        if json.loads(run.read_text()).get("status") == "ok":
            first[run.parent.parent.name] = run.parent
    if first and any("mgsize" in f for f in factors):

        def draw_hists(ax):
            histograms(_measured_windows(first), ax)
            ax.set_title("Response-time histograms, common bins (first repetition)")

        plots.append(("Response-time histograms", *save_figure(out, "histograms", draw_hists), None))
    if first and "gen_late_p99_us" in agg and agg["gen_late_p99_us"].notna().any():

        def draw_lateness(ax):
            lateness(_measured_windows(first), ax)
            ax.set_title("How late the load generator sent (open loop, first repetition)")

        plots.append(("Send lateness", *save_figure(out, "lateness", draw_lateness), None))
    if first:
        series = {name: client_timeline(rdir) for name, rdir in first.items()}
        plots.append(
            (
                "Throughput over time",
                *save_figure(out, "timeline", lambda ax: timeline(series, ax)),
                data(
                    "timeline", pd.concat([df.assign(point=n) for n, df in series.items()], ignore_index=True)
                ),
            )
        )
        rdir = next(iter(first.values()))
        if (rdir / "resources.csv").exists():
            plots.append(
                (
                    "Resource use",
                    *save_figure(out, "resources", lambda ax: resources(rdir / "resources.csv", ax)),
                    Path(shutil.copyfile(rdir / "resources.csv", out / "resources.csv")),
                )
            )
    return plots


def model_vs_measured(points: list, ax: Axes, label: str) -> None:
    """Measured throughput and response time against the model at each point
    of a sweep, with the asymptotic throughput bound."""
    points = sorted(points, key=lambda p: p.n)
    n = [p.n for p in points]
    ax.plot(n, [p.x_measured for p in points], "o-", label="measured throughput")
    ax.plot(n, [p.x_model for p in points], "x--", label="model throughput")
    ax.plot(n, [p.x_bound for p in points], ":", color="gray", label="throughput bound")
    ax.set_xlabel("clients (N)")
    ax.set_ylabel("throughput (ops/s)")
    twin = ax.twinx()
    twin.plot(
        n, [p.r_measured_us / 1e3 for p in points], "s-", color="tab:red", label="measured response time"
    )
    twin.plot(n, [p.r_model_us / 1e3 for p in points], "+--", color="tab:red", label="model response time")
    twin.set_ylabel("response time (ms)")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize="small", loc="center right")
    ax.set_title(f"Model and measurement {label}".strip())


def variation_chart(variation: dict[str, float], factors: dict[str, str], ax: Axes) -> None:
    """Allocation of variation of a 2^k r design."""
    names = list(variation)
    labels = [
        "".join(factors.get(ch, ch) + "·" for ch in n).rstrip("·") if n != "error" else "error" for n in names
    ]
    ax.bar(labels, [100 * variation[n] for n in names])
    ax.set_ylabel("share of variation (%)")
    ax.set_title("Allocation of variation")
    ax.tick_params(axis="x", labelrotation=30, labelsize="small")

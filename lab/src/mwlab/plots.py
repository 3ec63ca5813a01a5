"""Plots of an experiment. Each plot function takes a DataFrame and an Axes;
`make_plots` picks the x axis (total clients when they vary, else the first
varying factor), one line per level of the other varying factors, and writes
PNG and SVG files."""

from __future__ import annotations

import json
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


def _line(
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
        err = g[f"{y}_std"] * scale if f"{y}_std" in g else None
        ax.errorbar(
            g[x].astype(str) if x == "point" else g[x],
            g[y] * scale,
            yerr=err,
            fmt=style,
            capsize=3,
            label=f"{label} {name}".strip(),
        )


def throughput(agg: pd.DataFrame, ax: Axes, x: str, lines: list[str]) -> None:
    _line(ax, agg, x, lines, "client_tput", "clients")
    if "mw_tput" in agg:
        _line(ax, agg, x, lines, "mw_tput", "middleware", style="--s")
    ax.set_ylabel("throughput (ops/s)")
    ax.set_title("Throughput (mean ± std over repetitions)")


def response_time(agg: pd.DataFrame, ax: Axes, x: str, lines: list[str]) -> None:
    _line(ax, agg, x, lines, "client_rt_mean_us", "clients", scale=1e-3)
    if "mw_rt_mean_us" in agg:
        _line(ax, agg, x, lines, "mw_rt_mean_us", "middleware", scale=1e-3, style="--s")
    if "law_rt_us" in agg:
        _line(ax, agg, x, lines, "law_rt_us", "N/X - Z", scale=1e-3, style=":^")
    ax.set_ylabel("response time (ms)")
    ax.set_title("Response time (mean ± std over repetitions)")


def queue(agg: pd.DataFrame, ax: Axes, x: str, lines: list[str]) -> None:
    _line(ax, agg, x, lines, "mw_queue_len", "queue length")
    ax.set_ylabel("mean queue length")
    twin = ax.twinx()
    _line(twin, agg, x, lines, "mw_queue_us", "queue time", scale=1e-3, style="--s")
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
        _line(ax, agg, x, lines, col, name, scale=1e-3, style=style)
    ax.set_ylabel("response time (ms)")
    ax.set_title("Response-time percentiles (clients)")


def histogram(windows: list[dict], ax: Axes, label: str) -> None:
    """Response-time histogram of merged windows (clients), in ms: of the
    multi-gets when there are any, else of the gets, else of everything."""
    op = next((o for o in ("multiget", "get", "all") if sum(w["ops"][o]["count"] for w in windows)), "all")
    h = merge_hists(w["ops"][op]["response_us"]["hdr"] for w in windows if w["ops"][op]["count"])
    if h.get_total_count() == 0:
        return
    top = h.get_value_at_percentile(99.5)
    step = max(1, top // 60)
    xs, ys = [], []
    for item in h.get_linear_iterator(step):
        if item.value_iterated_to > top:
            break
        xs.append(item.value_iterated_to / 1e3)
        ys.append(item.count_added_in_this_iter_step)
    ax.step(xs, ys, where="post", label=label)
    ax.set_xlabel("response time (ms)")
    ax.set_ylabel("requests")


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


def timeline(runs: dict[str, Path], ax: Axes) -> None:
    """Throughput per window over each run (first repetition of each point);
    windows with failed requests are marked with an x."""
    for name, rdir in list(runs.items())[:8]:
        df = client_timeline(rdir)
        if df.empty:
            continue
        (line,) = ax.plot(df["t"], df["tput"], label=name, linewidth=1.2)
        bad = df[df["failed"] > 0]
        if not bad.empty:
            ax.scatter(bad["t"], bad["tput"], marker="x", s=30, color=line.get_color())
    ax.set_xlabel("seconds since the first window")
    ax.set_ylabel("throughput per window (ops/s)")
    ax.set_title("Throughput over time (first repetition; x: windows with failures)")


def save_figure(out: Path, stem: str, draw, xlabel: str = "") -> tuple[Path, Path]:
    """Draws one plot with `draw(ax)` and writes it as `out/stem.png` and `.svg`."""
    out.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    draw(ax)
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


def make_plots(result: Path, agg: pd.DataFrame, factors: list[str]) -> list[tuple[str, Path, Path]]:
    """Every plot that applies; returns (title, png, svg)."""
    out = result / "plots"
    plots: list[tuple[str, Path, Path]] = []
    if agg.empty:
        return plots
    x, lines = axis_and_lines(agg, factors)
    xlabel = "clients (N)" if x == "N" else x

    def figure(title: str, stem: str, draw) -> None:
        plots.append((title, *save_figure(out, stem, draw, xlabel)))

    figure("Throughput", "throughput", lambda ax: throughput(agg, ax, x, lines))
    figure("Response time", "response_time", lambda ax: response_time(agg, ax, x, lines))
    figure("Percentiles", "percentiles", lambda ax: percentiles(agg, ax, x, lines))
    if "mw_queue_len" in agg and agg["mw_queue_len"].notna().any():
        figure("Queue", "queue", lambda ax: queue(agg, ax, x, lines))
        figure("Time breakdown", "breakdown", lambda ax: breakdown(agg, ax))
    first = {}
    for run in sorted(result.glob("*/rep-1/run.json")):
        if json.loads(run.read_text()).get("status") == "ok":
            first[run.parent.parent.name] = run.parent
    if first and any("mgsize" in f for f in factors):

        def draw_hists(ax):
            for name, rdir in list(first.items())[:9]:
                ws = [
                    w
                    for d in sorted(rdir.glob("cl[0-9]*"))
                    for w in read_windows(d)
                    if (w.get("client") or {}).get("phase") == "measure"
                ]
                histogram(ws, ax, name)
            ax.set_title("Response-time histograms (first repetition)")

        figure("Response-time histograms", "histograms", draw_hists)
    if first:
        figure("Throughput over time", "timeline", lambda ax: timeline(first, ax))
        rdir = next(iter(first.values()))
        if (rdir / "resources.csv").exists():
            figure("Resource use", "resources", lambda ax: resources(rdir / "resources.csv", ax))
    return plots


def model_vs_measured(table: pd.DataFrame, curve: pd.DataFrame, ax: Axes, label: str) -> None:
    """Measured throughput and response time against the MVA prediction."""
    ax.plot(curve["N"], curve["X"], "-", label="MVA throughput")
    ax.plot(table["N"], table["X measured"], "o", label="measured throughput")
    ax.set_xlabel("clients (N)")
    ax.set_ylabel("throughput (ops/s)")
    twin = ax.twinx()
    twin.plot(curve["N"], curve["R_us"] / 1e3, "--", color="tab:red", label="MVA response time")
    twin.plot(
        table["N"], table["R measured (us)"] / 1e3, "s", color="tab:red", label="measured response time"
    )
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

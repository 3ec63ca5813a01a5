"""`mwlab compare` on synthetic results with a known difference, and the
runner's behaviour when it is stopped (SIGTERM), when every run fails and
when a spec asks for the impossible."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_analysis import window

from mwlab.analysis import aggregate_runs
from mwlab.compare import compare, write_page
from mwlab.spec import SpecError, parse


def result_set(
    path: Path, values: dict[str, list[float]], window_tputs: dict[str, list[int]] | None = None
) -> Path:
    """A result directory whose points have these per-repetition throughputs
    (and, optionally, these per-window request counts in one run)."""
    path.mkdir(parents=True)
    (path / "experiment.json").write_text(json.dumps({"name": "synthetic", "factors": {}, "settings": {}}))
    rows = []
    for point, reps in values.items():
        for i, x in enumerate(reps):
            rows.append({"point": point, "rep": i + 1, "status": "ok", "client_tput": x, "N": 4.0})
            counts = (window_tputs or {}).get(point)
            if counts:
                d = path / point / f"rep-{i + 1}" / "cl0"
                d.mkdir(parents=True)
                lines = [
                    json.dumps({**window(1000 * j, n, [100] * n), "format": "mwlab/1", "source": "mwload"})
                    + "\n"
                    for j, n in enumerate(counts)
                ]
                (d / "windows.jsonl").write_text("".join(lines))
    summary = pd.DataFrame(rows)
    summary.to_csv(path / "summary.csv", index=False)
    aggregate_runs(summary, []).to_csv(path / "aggregate.csv", index=False)
    return path


def test_a_known_difference_over_repetitions_is_found_and_noise_is_not(tmp_path: Path):
    a = result_set(tmp_path / "a", {"p": [1000, 1010, 990, 1005], "q": [500, 520, 480, 510]})
    b = result_set(tmp_path / "b", {"p": [1500, 1490, 1510, 1495], "q": [505, 490, 515, 500]})
    df = compare(a, b).set_index(["point", "figure"])
    p = df.loc[("p", "client_tput")]
    assert p["verdict"] == "different" and p["p"] < 0.001 and p["test"] == "repetitions"
    assert p["B/A"] == pytest.approx(1.4925, rel=0.01)
    assert df.loc[("q", "client_tput")]["verdict"] == "no significant difference"


def test_the_comparison_page_shows_both_curves_the_verdicts_and_what_differs(tmp_path: Path, capsys):
    from mwlab.cli import main

    a = result_set(tmp_path / "a", {"p": [1000, 1010, 990, 1005], "q": [500, 520, 480, 510]})
    b = result_set(tmp_path / "b", {"p": [1500, 1490, 1510, 1495], "q": [505, 490, 515, 500]})
    meta = json.loads((b / "experiment.json").read_text())
    meta["settings"] = {"middleware": {"workers": 16}}
    (b / "experiment.json").write_text(json.dumps(meta))
    page = write_page(a, b, compare(a, b))
    assert page == b / "compare.html"
    html = page.read_text()
    assert "middleware.workers: 8 -&gt; 16" in html
    assert html.count("data:image/png;base64,") == 1, "self-contained: the curves are inside the page"
    assert "different" in html and "no significant difference" in html
    assert main(["compare", str(a), str(a), "--html", str(tmp_path / "same.html")]) == 0
    assert "page: " in capsys.readouterr().out
    assert "the same experiment run twice" in (tmp_path / "same.html").read_text()


def test_one_repetition_is_tested_over_its_windows_or_says_not_enough_data(tmp_path: Path):
    a = result_set(tmp_path / "a", {"p": [1000]}, {"p": [1000, 1020, 980, 1010, 990, 1000]})
    b = result_set(tmp_path / "b", {"p": [1470]}, {"p": [1460, 1480, 1470, 1490, 1450, 1470]})
    row = compare(a, b).set_index("figure").loc["client_tput"]
    assert row["test"] == "windows" and row["verdict"] == "different"
    c = result_set(tmp_path / "c", {"p": [1000]})
    d = result_set(tmp_path / "d", {"p": [1470]})
    row = compare(c, d).set_index("figure").loc["client_tput"]
    assert row["verdict"] == "not enough data", "never a silent 'not significant'"


def test_impossible_trimming_and_durations_are_refused_before_anything_starts():
    base = {"name": "t", "topology": {"servers": 1}}
    with pytest.raises(SpecError, match="leave nothing of the 3 measured windows"):
        parse({**base, "run": {"duration": 3, "trim_start": 2, "trim_end": 1}})
    with pytest.raises(SpecError, match=r"run.duration \(ttime\): Input should be greater than 0 \(got -1\)"):
        parse({**base, "run": {"duration": -1}})
    with pytest.raises(SpecError, match=r"greater than 0 \(got 0\)"):
        parse({**base, "run": {"duration": 0}})
    with pytest.raises(SpecError, match=r"run.trim_start: Input should be greater than or equal to 0"):
        parse({**base, "run": {"trim_start": -1}})


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _mwlab(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mwlab.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_sigterm_stops_every_process_and_prints_the_resume_command(tmp_path: Path):
    spec = tmp_path / "long.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "long",
                "topology": {"servers": 2, "middlewares": 1, "threads": 1},
                "factors": {"vcli": [1, 2]},
                # (Long enough that nothing ends by itself while the test waits.)
                "run": {"duration": 600, "warmup": 0, "repetitions": 1, "reference": False},
            }
        )
    )
    runner = _mwlab(["run", str(spec), "--results", str(tmp_path / "results")], tmp_path)
    deadline = time.monotonic() + 30
    started: list[int] = []
    while time.monotonic() < deadline and len(started) < 4:
        started = _children(runner.pid)
        time.sleep(0.1)
    assert len(started) >= 4, "memcached x 2, mwproxy and mwload started"
    time.sleep(0.5)
    runner.send_signal(signal.SIGTERM)
    _out, err = runner.communicate(timeout=30)
    assert runner.returncode == 130, err
    assert "Continue with:" in err and "--resume" in err and str(tmp_path / "results" / "long") in err
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in started if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes left behind: {left}"


def test_a_run_whose_points_all_fail_ends_with_a_message_not_a_traceback(tmp_path: Path):
    spec = tmp_path / "broken.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "broken",
                "topology": {"servers": 1, "middlewares": 1, "threads": 1},
                "run": {"duration": 1, "warmup": 0, "repetitions": 1},
            }
        )
    )
    env = {**os.environ, "MWPROXY_BIN": str(tmp_path / "no-such-binary")}
    done = subprocess.run(
        [sys.executable, "-m", "mwlab.cli", "run", str(spec), "--results", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "every run failed" in done.stderr and "Traceback" not in done.stderr


def test_until_ci_adds_repetitions_and_says_when_it_gives_up(tmp_path: Path, capsys, monkeypatch):
    """A target no run can meet: repetitions are added until a point has the
    most a point may have (two here), then it gives up and says so; with no
    time left in the budget it adds none and says why; a loose target is met
    (repetitions added until the intervals are that narrow: the budget is a
    deadline, not how long it takes); a target of 0% is refused."""
    from mwlab import runner
    from mwlab.cli import main
    from mwlab.runner import run_until_ci
    from mwlab.spec import load

    spec = tmp_path / "ci.yaml"
    spec.write_text(
        "name: until-ci\n"
        "topology: {servers: 1, middlewares: 0, threads: 1, virtual_clients: 2}\n"
        "workload: {ratio: '1:10', keys: 1000, value_size: 64}\n"
        "run: {duration: 1, warmup: 0.2, cooldown: 0, repetitions: 1, reference: false}\n"
    )
    cmd = ["run", str(spec), "--results", str(tmp_path / "r")]
    with monkeypatch.context() as m:
        m.setattr(runner, "MAX_REPS", 2)
        assert main([*cmd, "--until-ci", "0.0001", "--budget", "600"]) == 0
    out = capsys.readouterr().out
    assert "until-ci: gave up: a point reached 2 repetitions" in out, out
    result = next((tmp_path / "r" / "until-ci").iterdir())
    res = json.loads((result / "until_ci.json").read_text())
    assert res["status"].startswith("gave up") and res["rounds"] == 1
    runs = list(result.glob("*/rep-*/run.json"))
    assert len(runs) == 2, runs
    assert res["points"][next(iter(res["points"]))]["reps"] == len(runs)
    exp = load(spec)
    spent = run_until_ci(exp, result, 0.0001, budget_s=0)
    assert spent["rounds"] == 0 and "would exceed the budget of 0 s" in spent["status"], spent
    loose = run_until_ci(exp, result, 99, budget_s=300)
    assert loose["status"] == "met", loose
    assert main([*cmd, "--until-ci", "0"]) == 2
    assert "--until-ci" in capsys.readouterr().err


def test_free_port_never_hands_out_a_port_twice():
    from mwlab.procs import free_port

    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_a_port_another_process_handed_out_is_not_handed_out_again():
    """Two lab processes (or test workers) side by side: a port one of them
    handed out, not yet bound by the server it is for, is not offered by the
    other."""
    import subprocess
    import sys

    from mwlab import procs

    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from mwlab.procs import free_port; import sys;"
            " print(*[free_port() for _ in range(20)], flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = [int(p) for p in other.stdout.readline().split()]
        assert len(theirs) == 20
        # This process walks from where the other one started.
        saved = procs._NEXT_PORT[0]
        procs._NEXT_PORT[0] = theirs[0]
        try:
            mine = [procs.free_port() for _ in range(20)]
        finally:
            procs._NEXT_PORT[0] = saved
        assert not set(mine) & set(theirs), sorted(set(mine) & set(theirs))
    finally:
        other.stdin.close()
        other.wait(timeout=10)
        other.stdout.close()


def test_the_host_cpu_counts_the_cpus_the_lab_may_use():
    """A run pinned to some CPUs (taskset) would count what others run on the
    other CPUs as CPU taken from it (its host CPU center then had almost no
    capacity left): the host's busy time, against which the other processes'
    share is measured, is that of the CPUs it may use, as its usable cores are."""
    from collections import namedtuple

    from mwlab.procs import host_busy

    t = namedtuple("t", "user nice system idle iowait")
    per_cpu = [t(10, 0, 0, 90, 0), t(70, 0, 10, 15, 5)]
    assert host_busy(per_cpu, {1}) == (80, 100), "CPU 0's busy time is not the lab's business"
    assert host_busy(per_cpu, {0, 1}) == (90, 200)

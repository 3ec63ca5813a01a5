"""`mwlab model ...`: a stable command line with one JSON object per call."""

from __future__ import annotations

import json

import pytest

from mwlab.cli import main


def run(capsys, *args: str) -> tuple[int, dict]:
    code = main(["model", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_mva_json_shape(capsys):
    code, r = run(
        capsys,
        "mva",
        "--center",
        "net=0.001",
        "--center",
        "workers=0.01:multi:4",
        "--center",
        "lan=0.002:delay",
        "--think",
        "0.005",
        "--users",
        "6",
    )
    assert code == 0
    assert r["users"] == [1, 2, 3, 4, 5, 6]
    assert len(r["throughput"]) == len(r["response_time"]) == 6
    assert set(r["centers"]) == {"net", "workers", "lan"}
    assert set(r["centers"]["workers"]) == {"utilization", "queue_length", "residence_time"}
    assert r["throughput"][0] == pytest.approx(1 / (0.001 + 0.01 + 0.002 + 0.005))
    code, approx = run(capsys, "mva", "--center", "a=0.01", "--users", "5", "--approx")
    assert code == 0 and len(approx["throughput"]) == 5


def test_single_queues(capsys):
    code, r = run(capsys, "mmm", "--arrival-rate", "1", "--service-rate", "1", "--servers", "2")
    assert code == 0 and r["prob_queueing"] == pytest.approx(1 / 3)
    for field in (
        "utilization",
        "p0",
        "mean_jobs",
        "mean_queue_length",
        "mean_response_time",
        "mean_waiting_time",
    ):
        assert field in r
    code, r = run(capsys, "mmmb", "--arrival-rate", "2", "--service-rate", "1", "--capacity", "1")
    assert code == 0 and r["loss_probability"] == pytest.approx(2 / 3)
    code, r = run(capsys, "mg1", "--arrival-rate", "4", "--service-rate", "5", "--scv", "0")
    assert code == 0 and r["mean_waiting_time"] == pytest.approx(0.4)
    code, r = run(capsys, "mm1", "--arrival-rate", "6", "--service-rate", "5")
    assert code == 2 and "unstable" in r["error"]


def test_bounds(capsys):
    code, r = run(
        capsys, "bounds", "--center", "cpu=0.02", "--center", "disk=0.05", "--think", "0.5", "--users", "10"
    )
    assert code == 0
    assert r["bottleneck"] == "disk" and r["knee"] == pytest.approx(11.4)
    assert r["throughput_upper"] == pytest.approx(min(10 / 0.57, 20))


def test_factorial_from_csv(capsys, tmp_path, jain_18_1):
    path = tmp_path / "design.csv"
    labels = {
        ("-", "-"): ("4M", "1K"),
        ("+", "-"): ("16M", "1K"),
        ("-", "+"): ("4M", "2K"),
        ("+", "+"): ("16M", "2K"),
    }
    rows, y = jain_18_1
    lines = ["memory,cache,mips"] + [
        f"{labels[r][0]},{labels[r][1]},{v}" for r, v in zip(rows, y, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    code, r = run(capsys, "factorial", str(path), "--response", "mips", "--confidence", "0.90")
    assert code == 0
    assert r["effects"] == pytest.approx({"q0": 41.0, "A": 21.5, "B": 9.5, "AB": 5.0})
    assert r["variation"]["A"] == pytest.approx(0.7888, abs=1e-4)
    assert r["ci"]["AB"] == pytest.approx([3.08, 6.92], abs=0.01)
    code, r = run(capsys, "factorial", str(path), "--response", "nope")
    assert code == 2 and "no column" in r["error"]


def test_bad_centers_are_explained(capsys):
    code, r = run(capsys, "mva", "--center", "cpu", "--users", "3")
    assert code == 2 and "NAME=DEMAND" in r["error"]
    code, r = run(capsys, "mva", "--center", "w=0.1:multi", "--users", "3")
    assert code == 2 and "multi:M" in r["error"]

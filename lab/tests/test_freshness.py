"""A binary older than its sources is said, not run silently: which source
is newer and what rebuilds it, judged on a checkout laid out in a temporary
directory with file times set by hand (no clock is read), and once per
`mwlab run` on stderr and in every run.json, with the real mwproxy behind a
link in such a checkout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from mwlab import freshness
from mwlab.cli import main
from mwlab.procs import binary

T = 1_000_000_000.0  # the sources' time in the fake checkout


def checkout(root: Path) -> Path:
    """A checkout's layout: mwproxy depends on mcproto (and, for its tests
    only, on mctest); mwmq is another crate; mwsample is mwload's."""
    files = {
        "Cargo.lock": "",
        "Cargo.toml": "[workspace]\n",
        "crates/mwproxy/Cargo.toml": (
            "[package]\nname = 'mwproxy'\n[dependencies]\nmcproto.workspace = true\nserde = '1'\n"
            "[dev-dependencies]\nmctest.workspace = true\n"
        ),
        "crates/mwproxy/src/main.rs": "",
        "crates/mwproxy/src/routes/tree.rs": "",
        "crates/mcproto/Cargo.toml": "[package]\nname = 'mcproto'\n",
        "crates/mcproto/src/lib.rs": "",
        "crates/mctest/src/lib.rs": "",
        "crates/mwmq/src/main.rs": "",
        "crates/mwload/Cargo.toml": "[package]\nname = 'mwload'\n",
        "crates/mwload/src/bin/mwsample.rs": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
        os.utime(root / name, (T, T))
    return root


def built(path: Path, at: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    os.utime(path, (at, at))
    return path


def test_a_binary_older_than_a_source_of_its_crates_is_stale_and_says_what_rebuilds_it(tmp_path: Path):
    root = checkout(tmp_path / "co")
    release = built(root / "target/release/mwproxy", T + 10)
    assert freshness.staleness(release) is None, "newer than every source"
    # A source of a crate it depends on, changed after the build.
    os.utime(root / "crates/mcproto/src/lib.rs", (T + 20, T + 20))
    why = freshness.staleness(release)
    assert why is not None and why.startswith(f"{release} is older than its sources")
    assert "crates/mcproto/src/lib.rs changed after it was built" in why
    assert "`make release` rebuilds it (or `cargo build --release -p mwproxy`)" in why
    assert "target/debug" not in why
    # A newer debug build is named, and not taken: the release build is what measures.
    debug = built(root / "target/debug/mwproxy", T + 30)
    assert "target/debug/mwproxy is newer, but the lab keeps to the release build" in freshness.staleness(
        release
    )
    assert freshness.staleness(debug) is None
    os.utime(root / "Cargo.lock", (T + 40, T + 40))
    assert "Cargo.lock changed" in freshness.staleness(debug) and "`cargo build -p mwproxy`" in (
        freshness.staleness(debug)
    )
    # Other crates (a dev-dependency, a crate it does not use) do not make it stale.
    fresh = checkout(tmp_path / "co2")
    release = built(fresh / "target/release/mwproxy", T + 10)
    for other in ("crates/mctest/src/lib.rs", "crates/mwmq/src/main.rs"):
        os.utime(fresh / other, (T + 20, T + 20))
    assert freshness.staleness(release) is None
    # mwsample is mwload's; a binary outside a checkout is not judged.
    sample = built(fresh / "target/release/mwsample", T + 10)
    os.utime(fresh / "crates/mwload/src/bin/mwsample.rs", (T + 20, T + 20))
    assert "cargo build --release -p mwload" in freshness.staleness(sample)
    assert freshness.staleness(built(tmp_path / "bin" / "mwproxy", 0)) is None


SPEC = {
    "name": "stale",
    "topology": {"servers": 1, "middlewares": 1, "threads": 1},
    "workload": {"keys": 100},
    "factors": {"vcli": [1, 2]},
    "run": {
        "duration": 1,
        "warmup": 0.5,
        "cooldown": 0,
        "repetitions": 1,
        "window_ms": 250,
        "reference": False,
    },
}


def test_mwlab_warns_once_per_run_and_each_run_json_says_so(tmp_path: Path, monkeypatch, capsys):
    """The real mwproxy, linked into a checkout whose sources are newer."""
    real = binary("mwproxy").resolve()
    root = checkout(tmp_path / "co")
    later = real.stat().st_mtime + 3600
    os.utime(root / "crates/mwproxy/src/routes/tree.rs", (later, later))
    stale = root / "target" / "release" / "mwproxy"
    stale.parent.mkdir(parents=True)
    stale.symlink_to(real)
    monkeypatch.setenv("MWPROXY_BIN", str(stale))
    spec = tmp_path / "stale.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    results = tmp_path / "results"
    assert main(["run", str(spec), "--results", str(results)]) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if str(stale) in x]
    assert len(said) == 1, said
    assert said[0].startswith(f"mwlab: {stale} is older than its sources (crates/mwproxy/src/routes/tree.rs")
    records = [json.loads(p.read_text()) for p in results.glob("stale/*/*/rep-1/run.json")]
    assert len(records) == 2 and all(r["status"] == "ok" for r in records)
    assert all(r["stale_binaries"] == {"mwproxy": said[0].removeprefix("mwlab: ")} for r in records)

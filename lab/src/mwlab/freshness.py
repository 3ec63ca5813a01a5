"""Whether a binary the lab runs is older than the sources it was built from.

The lab runs `target/release/<name>` of the checkout when it exists
(`procs.binary`; `<NAME>_BIN` names another), whatever its age: a release
binary built before a change is run as if it had the change, and a spec that
the current mwproxy refuses is accepted, or a run measures the old code. A
binary under a checkout's `target/<profile>/` is judged against that checkout
(the directory holding `target/`, `Cargo.lock` and `crates/`): it is stale
when some source of its crate, or of the workspace crates it depends on
(their `src/`, `Cargo.toml` and `build.rs`), or the workspace's `Cargo.toml`
or `Cargo.lock`, was modified after it. That is cargo's own test (file
times), so it errs the same way: a checkout of other files touches them.

The release build stays the one the lab runs even when the debug build is
newer (a debug build's figures would measure the debug build): the warning
says so and how to rebuild. A binary elsewhere (installed, on the PATH) is
not judged. `mwlab run` and `mwlab validate` warn once on stderr; each run's
run.json keeps the warnings of the binaries it started (`stale_binaries`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

# The crate of each binary that is not named as its crate.
BINARY_CRATES = {"mwsample": "mwload"}
# Dependency tables of a crate's Cargo.toml (not dev-dependencies: tests are not in the binary).
_DEP_TABLES = re.compile(r"^\[(?:target\..*\.)?(?:build-)?dependencies\]$")
_KEY = re.compile(r"^([A-Za-z0-9_-]+)\s*(?:\.|=)")

_JUDGED: dict[Path, str | None] = {}
_WARNED: set[Path] = set()


def checkout_of(path: Path) -> Path | None:
    """The source checkout whose `target/<profile>/` holds `path`, if it is one."""
    if path.parent.parent.name != "target":
        return None
    root = path.parent.parent.parent
    return root if (root / "Cargo.lock").is_file() and (root / "crates").is_dir() else None


def crate_deps(root: Path, crate: str) -> list[str]:
    """`crate` and the workspace crates it depends on, directly or not (its
    Cargo.toml's dependency tables, keys naming a directory of `crates/`)."""
    out, todo = [], [crate]
    while todo:
        c = todo.pop()
        if c in out:
            continue
        out.append(c)
        try:
            lines = (root / "crates" / c / "Cargo.toml").read_text().splitlines()
        except OSError:
            continue
        in_deps = False
        for line in (x.strip() for x in lines):
            if line.startswith("["):
                in_deps = bool(_DEP_TABLES.match(line))
            elif in_deps and (m := _KEY.match(line)) and (root / "crates" / m[1]).is_dir():
                todo.append(m[1])
    return out


def newest_source(root: Path, name: str) -> tuple[Path, float] | None:
    """The most recently modified source of binary `name` in checkout `root`, and its time."""
    crate = BINARY_CRATES.get(name, name)
    files = [root / "Cargo.lock", root / "Cargo.toml"]
    for c in crate_deps(root, crate):
        d = root / "crates" / c
        files += [d / "Cargo.toml", d / "build.rs", *(p for p in (d / "src").rglob("*") if p.is_file())]
    times = [(p, p.stat().st_mtime) for p in files if p.is_file()]
    return max(times, key=lambda t: t[1]) if times else None


def staleness(path: Path) -> str | None:
    """What is wrong with binary `path`, if it is older than its sources; None otherwise."""
    root = checkout_of(path)
    if root is None or not path.is_file():
        return None
    name, profile = path.name, path.parent.name
    newest = newest_source(root, name)
    built = path.stat().st_mtime
    if newest is None or newest[1] <= built:
        return None
    crate = BINARY_CRATES.get(name, name)
    release = profile == "release"
    rebuild = (
        f"`make release` rebuilds it (or `cargo build --release -p {crate}`)"
        if release
        else f"`cargo build -p {crate}` rebuilds it"
    )
    text = (
        f"{path} is older than its sources ({newest[0].relative_to(root)} changed after it was "
        f"built), so it may not be the code of this checkout: in {root}, {rebuild}"
    )
    debug = root / "target" / "debug" / name
    if release and debug.is_file() and debug.stat().st_mtime > built:
        text += (
            f"; target/debug/{name} is newer, but the lab keeps to the release build "
            "(a debug build's figures would measure the debug build)"
        )
    return text


def stale(path: Path | str) -> str | None:
    """`staleness` of `path`, judged once per process (a long experiment
    does not read the sources' times before every run)."""
    p = Path(path)
    if p not in _JUDGED:
        _JUDGED[p] = staleness(p)
    return _JUDGED[p]


def stale_of(commands: Iterable[list[str]]) -> dict[str, str]:
    """The binaries of `commands` (their first word) that are stale, by name, with why."""
    out = {}
    for cmd in commands:
        why = stale(cmd[0]) if cmd else None
        if why:
            out[Path(cmd[0]).name] = why
    return out


def warn_once(paths: Iterable[Path], warn: Callable[[str], None]) -> None:
    """Tells `warn` of every stale binary among `paths` not told of before in this process."""
    for p in paths:
        why = stale(p)
        if why and p not in _WARNED:
            _WARNED.add(p)
            warn(why)

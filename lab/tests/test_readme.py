"""README.md's command examples, run in the order they appear, as doc tests run
a library's examples.

Every fenced `console`, `sh` or `sql` block of the README carries a mark on
the line before it: `<!-- test -->` runs it, `<!-- not tested: REASON -->`
says why not (a block with neither fails: a new example is a decision).

- `console`: lines starting `$ ` are commands (a trailing backslash continues
  one on the next line); the lines up to the next command are what it
  prints, compared line by line: `[..]` in a line stands for any text, a
  line `...` for any lines, and `<name>` for a word that is the same
  wherever the name appears again in the block, in output or in commands
  (the id a SEND gave is the one the ACK acknowledges).
- `sh`: every command must exit 0; what they print is not compared.
- `sql`: psql runs it in the database of `make run-mq` (stopping at an error).

`make run-proxy` and `make run-mq` start their scripts (scripts/run-local.sh,
scripts/run-mq.sh) on free ports with the binaries under test (MWPROXY_BIN,
MWMQ_BIN, as the lab's), and stay up until the end; the README's default
ports in the commands and outputs that follow become the ports they got. Their
"output" is what the script prints until its banner ends. Every other command
runs in a scratch directory, `target/release/` standing for the binaries
under test, within a time limit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from mwlab.procs import binary, free_port

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# A command's time limit; a service's, to print its banner.
COMMAND_SECONDS = 30
SERVICE_SECONDS = 90

MARK = re.compile(r"^<!-- (test|not tested: (?P<reason>.+\S)) -->$")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")
PLACEHOLDER = re.compile(r"<([a-z][a-z0-9_-]*)>")


@dataclass
class Block:
    """A fenced block: its language, first line number, lines, and mark."""

    lang: str
    line: int
    lines: list[str]
    tested: bool
    reason: str | None


def blocks(text: str) -> list[Block]:
    """The README's fenced blocks, each with the mark on the line before it."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m["lang"]:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        mark = MARK.match(lines[i - 1]) if i > 0 else None
        tested, reason = bool(mark and mark[1] == "test"), mark["reason"] if mark else None
        found.append(Block(m["lang"], i + 1, lines[i + 1 : end], tested, reason))
        i = end + 1
    return found


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """A block's commands, each with the output it shows (none for `sh`)."""
    out: list[tuple[str, list[str]]] = []
    lines = iter(block.lines)
    for line in lines:
        if block.lang == "console" and not line.startswith("$ "):
            assert out, f"README.md:{block.line}: output before any command: {line!r}"
            out[-1][1].append(line)
            continue
        cmd = line[2:] if block.lang == "console" else line
        while cmd.endswith("\\"):
            cmd += "\n" + next(lines)
        if cmd.strip() and not cmd.lstrip().startswith("#"):
            out.append((cmd, []))
    return out


def line_pattern(expected: str, bound: dict[str, str]) -> re.Pattern[str]:
    """A regular expression for one expected line: `[..]` any text, `<name>` a word (its bound value)."""
    parts, seen = [], set()
    for piece in re.split(r"(\[\.\.\]|<[a-z][a-z0-9_-]*>)", expected):
        if piece == "[..]":
            parts.append(".*")
        elif m := PLACEHOLDER.fullmatch(piece):
            name = m[1]
            if name in bound:
                parts.append(re.escape(bound[name]))
            elif name in seen:
                parts.append(f"(?P={name})")
            else:
                parts.append(rf"(?P<{name}>\S+)")
                seen.add(name)
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


def matches(expected: list[str], actual: list[str], bound: dict[str, str]) -> dict[str, str] | None:
    """The placeholders bound if `actual` matches `expected` (with `...` lines), else None."""
    if not expected:
        return bound if not actual else None
    if expected[0] == "...":
        for k in range(len(actual) + 1):
            got = matches(expected[1:], actual[k:], bound)
            if got is not None:
                return got
        return None
    if not actual:
        return None
    m = line_pattern(expected[0], bound).fullmatch(actual[0])
    return matches(expected[1:], actual[1:], {**bound, **m.groupdict()}) if m else None


def trimmed(lines: list[str]) -> list[str]:
    lines = [x.rstrip() for x in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


class Service:
    """A `make run-*` target's script, started on free ports until `stop`."""

    SCRIPTS: ClassVar[dict[str, str]] = {"make run-proxy": "run-local.sh", "make run-mq": "run-mq.sh"}

    def __init__(self, target: str, scratch: Path):
        self.target = target
        if target == "make run-proxy":
            mc = [free_port() for _ in range(3)]
            env = {"PROXY_PORT": free_port(), "ADMIN_PORT": free_port(), "MC_PORTS": " ".join(map(str, mc))}
            self.ports = {"11311": env["PROXY_PORT"], "9100": env["ADMIN_PORT"]}
            self.ports |= {str(21211 + i): p for i, p in enumerate(mc)}
        else:
            env = {"MQ_PORT": free_port(), "ADMIN_PORT": free_port()}
            self.ports = {"6380": env["MQ_PORT"], "9380": env["ADMIN_PORT"]}
        name = "mwproxy" if target == "make run-proxy" else "mwmq"
        env[f"{name.upper()}_BIN"] = binary(name)
        self.log = scratch / f"{self.SCRIPTS[target]}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [REPO / "scripts" / self.SCRIPTS[target]],
                env={**os.environ, **{k: str(v) for k, v in env.items()}},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + SERVICE_SECONDS
        while "\noptions: " not in self.output():
            assert self.proc.poll() is None, f"{target} exited:\n{self.output()}"
            late = time.monotonic() > deadline
            assert not late, f"{target} printed no banner in {SERVICE_SECONDS} s:\n{self.output()}"
            time.sleep(0.1)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def banner(self) -> list[str]:
        """What it printed, up to the end of its banner."""
        lines = self.output().splitlines()
        end = next(i for i, x in enumerate(lines) if x.startswith("options: "))
        return lines[: end + 1]

    def stop(self) -> None:
        """SIGTERM to the script, which stops what it started; SIGKILL to its group past 30 s."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


class Reader:
    """Runs the README's tested blocks in order, with the services they start."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.services: dict[str, Service] = {}
        self.ports: dict[str, int] = {}

    def substitute(self, text: str) -> str:
        for default, port in self.ports.items():
            text = re.sub(rf"(?<![0-9]){default}(?![0-9])", str(port), text)
        return text

    def run(self, block: Block) -> None:
        if block.lang == "sql":
            self.sql(block)
            return
        bound: dict[str, str] = {}
        for cmd, shown in commands(block):
            where = f"README.md:{block.line}: {cmd}"
            if cmd.split("#")[0].strip() in Service.SCRIPTS:
                target = cmd.split("#")[0].strip()
                if target not in self.services:
                    self.services[target] = Service(target, self.scratch)
                service = self.services[target]
                self.ports |= service.ports
                actual, errors = service.banner(), ""
            else:
                done = self.shell(self.command(cmd, bound), where)
                actual, errors = done.stdout.splitlines(), done.stderr
            if block.lang == "console" and shown:
                expected = [self.substitute(x) for x in shown]
                got = matches(trimmed(expected), trimmed(actual), bound)
                printed, wanted = "\n".join(actual), "\n".join(expected)
                assert got is not None, f"{where}\nprinted:\n{printed}\nnot as shown:\n{wanted}\n{errors}"
                bound = got

    def command(self, cmd: str, bound: dict[str, str]) -> str:
        def value(m: re.Match[str]) -> str:
            assert m[1] in bound, f"<{m[1]}> is used in {cmd!r} before an output gave it"
            return bound[m[1]]

        cmd = PLACEHOLDER.sub(value, self.substitute(cmd))
        for name in ("mwproxy", "mwmq", "mwload"):
            if f"target/release/{name}" in cmd:
                cmd = cmd.replace(f"target/release/{name}", str(binary(name)))
        return cmd.replace("scripts/", f"{REPO}/scripts/")

    def shell(self, cmd: str, where: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", cmd],
                cwd=self.scratch,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=COMMAND_SECONDS,
            )
        except subprocess.TimeoutExpired as e:
            said = f"{e.stdout!r} {e.stderr!r}"
            raise AssertionError(f"{where}\ndid not finish within {COMMAND_SECONDS} s: {said}") from e
        assert done.returncode == 0, f"{where}\nexited {done.returncode}:\n{done.stdout}{done.stderr}"
        return done

    def sql(self, block: Block) -> None:
        mq = self.services.get("make run-mq")
        assert mq, f"README.md:{block.line}: an SQL example needs `make run-mq` before it"
        db = re.search(r'^the database: psql "(.+)"$', mq.output(), re.MULTILINE)
        assert db, mq.output()
        script = "\n".join(block.lines)
        self.shell(f"psql '{db[1]}' -X -q -v ON_ERROR_STOP=1", f"README.md:{block.line}", script)

    def stop(self) -> None:
        for s in self.services.values():
            s.stop()


@pytest.fixture
def reader() -> Iterator[Reader]:
    with tempfile.TemporaryDirectory(prefix="mwlab-readme-") as d:
        r = Reader(Path(d))
        try:
            yield r
        finally:
            r.stop()


def test_every_example_is_marked_tested_or_not():
    found = blocks(README.read_text())
    unmarked = [f"README.md:{b.line} ({b.lang})" for b in found if not b.tested and not b.reason]
    assert not unmarked, (
        "mark each example block on the line before it with <!-- test --> or <!-- not tested: REASON -->: "
        + ", ".join(unmarked)
    )


def test_readme_examples_run_in_order(reader: Reader):
    tested = [b for b in blocks(README.read_text()) if b.tested]
    assert len(tested) >= 3, "the quick starts of mwproxy and mwmq, streams and SQL"
    for block in tested:
        reader.run(block)


def test_the_output_patterns():
    """`[..]`, `...` and `<name>` as the module says: the checker checks what it claims."""
    assert matches(["a [..] c"], ["a b b c"], {}) == {}
    assert matches(["a", "...", "z"], ["a", "b", "c", "z"], {}) == {}
    assert matches(["a", "...", "z"], ["a", "z"], {}) == {}
    assert matches(["a", "z"], ["a", "b", "z"], {}) is None
    assert matches(["<id>", "x <id>"], ["17", "x 17"], {}) == {"id": "17"}
    assert matches(["<id>", "x <id>"], ["17", "x 18"], {}) is None
    assert matches(["<id>"], ["18"], {"id": "17"}) is None
    assert matches(["<id>"], ["two words"], {}) is None
    block = Block("console", 1, ["$ echo a \\", "  b", "a b", "$ true  # a comment"], True, None)
    assert commands(block) == [("echo a \\\n  b", ["a b"]), ("true  # a comment", [])]

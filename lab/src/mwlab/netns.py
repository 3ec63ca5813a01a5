"""Emulated hosts on one machine: a network namespace per host, joined by veth
pairs to a bridge, each host's link shaped in both directions, and each
host's processes in a cgroup of their own.

    root namespace: bridge mwb<pid>s<k> (10.87.<s>.254/24)
      |-- veth mw<pid>s<k>h<n> ==== eth0 in namespace mwlab-<pid>-<k>-<host> (10.87.<s>.<n+1>)

A host's **uplink** (what it sends) is shaped on the egress of its eth0, its
**downlink** (what it receives) on the egress of the bridge's end of the veth,
each with tbf at its own rate (a cloud VM's egress and ingress limits
differ), segmentation offloads off (a tbf meters
what it is given: 64 KiB segments would pass as one packet). Link delay needs
netem, which not every kernel has; this module says so instead of silently
not delaying. CPUs: a CPU quota (`cpus: 1.5`) or a cpuset (`cpus: "0"`), in
cgroup v2 if the machine has it, else in v1's cpu / cpuset hierarchies.

Everything is named after the runner's pid, so a later run can remove what a
killed run left behind (`clean_stale`), and `Emulation.close` removes
everything, whatever happened. `measure_link` measures what a link carries
under a sender that offers all it can (the tests and bench/lab.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mwlab.procs import LabError

PREFIX = "mwlab-"
_SEQUENCE = 0
SUBNET = "10.87"
CGROUP_ROOT = Path("/sys/fs/cgroup")

UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def parse_rate(text: str) -> float:
    """`100mbit` -> bits per second (tc's units: bit, kbit, mbit, gbit; bps... are bytes)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", str(text))
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(
            f"a link rate is a number and a unit ({', '.join(UNITS)}), such as 100mbit; not {text!r}"
        )
    return float(m.group(1)) * UNITS[m.group(2).lower()]


def parse_delay(text: str) -> float:
    """`1ms` or `250us` -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)\s*", str(text))
    if not m:
        raise ValueError(f"a link delay is a number and us, ms or s, such as 1ms; not {text!r}")
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise LabError(f"`{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip()}")
    return done


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "emulated hosts (hosts: emulation: netns) need root for network namespaces, tc and cgroups; "
            "run as root, or use emulation: local"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise LabError(f"emulated hosts need `{tool}` (Debian package iproute2)")


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (tried on a throwaway dummy link)."""
    name = f"mwlabnt{os.getpid() % 100000}"
    if _run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=False).returncode:
        return False
    try:
        return (
            _run(["tc", "qdisc", "add", "dev", name, "root", "netem", "delay", "1ms"], check=False).returncode
            == 0
        )
    finally:
        _run(["ip", "link", "del", name], check=False)


def tbf_burst(rate_bps: float) -> int:
    """The bucket (bytes) of a link shaped to `rate_bps`: over any stretch of
    time T the link carries at most rate x T plus this. A small bucket (two
    full frames, or 100 µs at the rate) makes the link serialise packets
    nearly as a real one does; a large one would let a light load through at
    the veth's speed, and one of a single frame loses a sixth of the rate to
    timer granularity."""
    return max(int(rate_bps / 8 * 100e-6), 2 * 1514)


@dataclass
class HostSpec:
    """One emulated host."""

    name: str
    up_bps: float | None = None  # what the host sends
    down_bps: float | None = None  # what it receives
    cpus: float | str | None = None
    delay_s: float | None = None
    jitter_s: float | None = None

    @property
    def shaped(self) -> bool:
        return bool(self.up_bps or self.down_bps or self.delay_s)


@dataclass
class Host:
    """A created host."""

    spec: HostSpec
    netns: str
    veth: str
    addr: str
    cgroups: list[Path] = field(default_factory=list)


def _cgroup_version() -> int:
    return 2 if (CGROUP_ROOT / "cgroup.controllers").exists() else 1


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale() -> list[str]:
    """Removes namespaces, links and cgroups left by runs whose runner is gone; returns their names."""
    removed = []
    for ns in _run(["ip", "netns", "list"], check=False).stdout.split():
        m = re.match(rf"{PREFIX}(\d+)-", ns)
        if m and not _pid_alive(int(m.group(1))):
            _run(["ip", "netns", "del", ns], check=False)
            removed.append(ns)
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        m = re.match(r"\d+:\s+(mwb?(\d+)s\d+(?:h\d+)?)[:@]", line)
        if m and not _pid_alive(int(m.group(2))):
            _run(["ip", "link", "del", m.group(1)], check=False)
            removed.append(m.group(1))
    for base in (CGROUP_ROOT, CGROUP_ROOT / "cpu", CGROUP_ROOT / "cpuset"):
        if not base.is_dir():
            continue
        for d in base.glob(f"{PREFIX}*"):
            m = re.match(rf"{PREFIX}(\d+)-", d.name)
            if m and not _pid_alive(int(m.group(1))):
                _remove_cgroup(d)
                removed.append(str(d))
    return removed


def _remove_cgroup(d: Path) -> None:
    procs = d / "cgroup.procs"
    with contextlib.suppress(OSError):
        for pid in procs.read_text().split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
    with contextlib.suppress(OSError):
        d.rmdir()


class Emulation:
    """A set of emulated hosts; a context manager that removes them on every way out."""

    def __init__(self, hosts: list[HostSpec]):
        require_root()
        if any(h.delay_s for h in hosts) and not netem_available():
            raise LabError(
                "link delay needs the netem qdisc, which this kernel does not have (tc: Specified qdisc kind "
                "is unknown); remove hosts.delay, or run on a kernel with sch_netem"
            )
        clean_stale()
        global _SEQUENCE
        _SEQUENCE += 1
        self.id = os.getpid()
        self.tag = f"{self.id}s{_SEQUENCE % 100}"
        self.subnet = f"{SUBNET}.{(self.id + _SEQUENCE) % 250}"
        self.bridge = f"mwb{self.tag}"
        self.hosts: dict[str, Host] = {}
        self._specs = hosts
        self.offloads_off = shutil.which("ethtool") is not None

    def __enter__(self) -> Emulation:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for n, spec in enumerate(self._specs):
            ns = f"{PREFIX}{self.id}-{_SEQUENCE}-{spec.name}"
            veth = f"mw{self.tag}h{n}"
            addr = f"{self.subnet}.{n + 1}"
            host = Host(spec, ns, veth, addr)
            self.hosts[spec.name] = host
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            if self.offloads_off:
                _run(["ethtool", "-K", veth, "tso", "off", "gso", "off", "gro", "off"], check=False)
                _run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        "ethtool",
                        "-K",
                        "eth0",
                        "tso",
                        "off",
                        "gso",
                        "off",
                        "gro",
                        "off",
                    ],
                    check=False,
                )
            if spec.down_bps or spec.delay_s:
                self._shape(["tc"], veth, spec.down_bps, spec.delay_s, spec.jitter_s)
            if spec.up_bps or spec.delay_s:
                self._shape(
                    ["ip", "netns", "exec", ns, "tc"], "eth0", spec.up_bps, spec.delay_s, spec.jitter_s
                )
            if spec.cpus is not None:
                host.cgroups = self._cgroup(ns, spec.cpus)

    @staticmethod
    def _shape(
        tc: list[str], dev: str, rate_bps: float | None, delay_s: float | None, jitter_s: float | None = None
    ) -> None:
        parent = ["root"]
        if delay_s:
            _run(
                [
                    *tc,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "handle",
                    "1:",
                    "netem",
                    "delay",
                    f"{delay_s * 1e6:.0f}us",
                    *([f"{jitter_s * 1e6:.0f}us"] if jitter_s else []),
                ]
            )
            parent = ["parent", "1:1"]
        if rate_bps:
            rate = rate_bps
            burst = tbf_burst(rate)
            _run(
                [
                    *tc,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    *parent,
                    "tbf",
                    "rate",
                    f"{rate:.0f}bit",
                    "burst",
                    str(burst),
                    "latency",
                    "50ms",
                ]
            )

    def _cgroup(self, name: str, cpus: float | str) -> list[Path]:
        made = []
        if _cgroup_version() == 2:
            d = CGROUP_ROOT / name
            d.mkdir()
            made.append(d)
            if isinstance(cpus, str):
                (d / "cpuset.cpus").write_text(cpus)
            else:
                (d / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
            return made
        if isinstance(cpus, str):
            d = CGROUP_ROOT / "cpuset" / name
            d.mkdir()
            (d / "cpuset.cpus").write_text(cpus)
            (d / "cpuset.mems").write_text((CGROUP_ROOT / "cpuset" / "cpuset.mems").read_text().strip())
            made.append(d)
        d = CGROUP_ROOT / "cpu" / name
        d.mkdir()
        made.append(d)
        if not isinstance(cpus, str):
            (d / "cpu.cfs_period_us").write_text("100000")
            (d / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
        return made

    def close(self) -> None:
        """Removes every namespace, link and cgroup of this emulation (idempotent)."""
        for host in list(self.hosts.values()):
            for d in host.cgroups:
                _remove_cgroup(d)
            # Deleting one end removes the pair at once; a namespace is only
            # destroyed when its last reference goes, which may be later.
            _run(["ip", "link", "del", host.veth], check=False)
            _run(["ip", "netns", "del", host.netns], check=False)
        self.hosts.clear()
        _run(["ip", "link", "del", self.bridge], check=False)

    def addr(self, host: str) -> str:
        return self.hosts[host].addr

    def ping(self, host: str, count: int = 20) -> float | None:
        """The mean round trip (µs) from `host` to the bridge: its own link's
        delay both ways (what netem added, plus microseconds of path)."""
        rtts = self.ping_rtts(host, count)
        return rtts[1] if rtts else None

    def ping_rtts(self, host: str, count: int = 20) -> tuple[float, float] | None:
        """The shortest and the mean round trip (µs) of `ping`."""
        out = _run(
            self.wrap(host, ["ping", "-q", "-n", "-c", str(count), "-i", "0.01", f"{self.subnet}.254"]),
            check=False,
        ).stdout
        m = re.search(r"= ([0-9.]+)/([0-9.]+)/", out)
        return (float(m.group(1)) * 1000, float(m.group(2)) * 1000) if m else None

    def wrap(self, host: str, cmd: list[str]) -> list[str]:
        """`cmd` run inside `host`: its namespace and its cgroups."""
        h = self.hosts[host]
        netns = ["ip", "netns", "exec", h.netns, *cmd]
        if not h.cgroups:
            return netns
        # The cgroup first: inside the namespace `ip netns exec` mounts a sysfs
        # of its own, without the cgroup hierarchies.
        join = "".join(f"echo $$ > {d / 'cgroup.procs'} && " for d in h.cgroups)
        return ["sh", "-c", f'{join}exec "$@"', "sh", *netns]

    def link_counters(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Per host and direction (`up`: what it sent, `down`: what it received), (bytes, packets)
        as counted on the bridge's end of its veth, after shaping."""
        out = {}
        for name, h in self.hosts.items():
            base = Path("/sys/class/net") / h.veth / "statistics"
            with contextlib.suppress(OSError, ValueError):
                out[(name, "down")] = (
                    int((base / "tx_bytes").read_text()),
                    int((base / "tx_packets").read_text()),
                )
                out[(name, "up")] = (
                    int((base / "rx_bytes").read_text()),
                    int((base / "rx_packets").read_text()),
                )
        return out

    def qdisc_stats(self) -> dict[tuple[str, str], dict[str, int]]:
        """Per host and direction: the shaping qdiscs' sent bytes, drops and overlimits (from `tc -s`)."""
        out = {}
        for name, h in self.hosts.items():
            for direction, tc, dev, shaped in (
                ("down", ["tc"], h.veth, h.spec.down_bps or h.spec.delay_s),
                ("up", ["ip", "netns", "exec", h.netns, "tc"], "eth0", h.spec.up_bps or h.spec.delay_s),
            ):
                if not shaped:
                    continue
                text = _run([*tc, "-s", "qdisc", "show", "dev", dev], check=False).stdout
                stats = {"bytes": 0, "drops": 0, "overlimits": 0}
                for m in re.finditer(r"Sent (\d+) bytes \d+ pkt \(dropped (\d+), overlimits (\d+)", text):
                    stats["bytes"] = max(stats["bytes"], int(m.group(1)))
                    stats["drops"] += int(m.group(2))
                    stats["overlimits"] += int(m.group(3))
                out[(name, direction)] = stats
        return out

    def cpu_counters(self) -> dict[str, tuple[float, int, int]]:
        """Per host with a CPU quota: (seconds throttled, periods throttled, periods)."""
        out = {}
        for name, h in self.hosts.items():
            for d in h.cgroups:
                stat = d / "cpu.stat"
                if not stat.exists():
                    continue
                fields = dict(
                    line.split() for line in stat.read_text().splitlines() if len(line.split()) == 2
                )
                if "throttled_usec" in fields:
                    throttled = int(fields["throttled_usec"]) / 1e6
                else:
                    throttled = int(fields.get("throttled_time", 0)) / 1e9
                out[name] = (throttled, int(fields.get("nr_throttled", 0)), int(fields.get("nr_periods", 0)))
        return out


@dataclass
class LinkSample:
    """What one direction of a link carried while a sender offered all it could."""

    bits: float
    # An interval that contains both readings of the counters (load can only lengthen it).
    seconds: float
    # Packets the link's shaper held back for want of tokens meanwhile, and
    # the bytes it passed (None: not shaped), read between the two readings.
    overlimits: int | None
    shaped_bytes: int | None

    @property
    def bps(self) -> float:
        return self.bits / self.seconds


def measure_link(
    emu: Emulation, src: str, dst: str, port: int, link: tuple[str, str], seconds: float = 1.0
) -> LinkSample:
    """`src` sends to `dst` (TCP, on `port`) as fast as it can; once the bytes
    flow, what `link` (a host and `up` or `down`) carried over `seconds` by
    its counters, and what its shaper held back meanwhile. The interval is
    read before the first reading and after the second: the rate it gives is
    never above the link's."""
    receiver = subprocess.Popen(
        emu.wrap(
            dst,
            [
                sys.executable,
                "-c",
                "import socket\n"
                f"s = socket.socket(); s.bind(('{emu.addr(dst)}', {port})); s.listen(1)\n"
                "c, _ = s.accept()\n"
                "while c.recv(1 << 16): pass\n",
            ],
        )
    )
    sender = subprocess.Popen(
        emu.wrap(
            src,
            [
                sys.executable,
                "-c",
                "import socket, time\n"
                "while True:\n"
                f"    try: c = socket.create_connection(('{emu.addr(dst)}', {port})); break\n"
                "    except OSError: time.sleep(0.05)\n"
                "while True: c.sendall(b'x' * 65536)\n",
            ],
        )
    )
    try:
        first = emu.link_counters()[link][0]
        deadline = time.monotonic() + 30
        while emu.link_counters()[link][0] - first < 1 << 18:
            if time.monotonic() > deadline:
                raise LabError(f"no data flowed from {src} to {dst} in 30 s")
            time.sleep(0.05)
        t0 = time.monotonic()
        before = emu.link_counters()[link][0]
        q0 = emu.qdisc_stats().get(link)
        time.sleep(seconds)
        q1 = emu.qdisc_stats().get(link)
        after = emu.link_counters()[link][0]
        t1 = time.monotonic()
    finally:
        for p in (sender, receiver):
            p.kill()
            p.wait()
    held = q1["overlimits"] - q0["overlimits"] if q0 and q1 else None
    passed = q1["bytes"] - q0["bytes"] if q0 and q1 else None
    return LinkSample((after - before) * 8, t1 - t0, held, passed)

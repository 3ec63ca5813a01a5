"""The Debian packages of mwproxy, mwmq and mwload (`make deb`,
scripts/dist.sh), built from the binaries this test run built (target/debug:
the same packaging as the release binaries, nothing rebuilt here).

Without root: what the packages hold (control fields, files, owners,
conffiles, maintainer scripts), the man pages rendered by `man -l` against
the programs' own `--help`, and the packaged configurations checked by the
programs themselves: each `#key = value` line is the true default; the
units' hardening and limits; `make install` into a staging root and `make
uninstall`.

As root: the packages installed on this machine with `dpkg -i`, as an
operator would — the service users, the configurations readable by them
alone, `--version` and `--help` of the installed binaries, `systemd-analyze
verify` of the installed units, `man NAME` — then purged, which must leave
nothing behind. The purge runs whatever happened (a fixture's finalizer); a
machine where the packages were already installed by someone else is left
alone (skipped).
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = ["mwproxy", "mwmq", "mwload"]
SERVICES = ["mwproxy", "mwmq"]
# Clients the services serve at once by default, which LimitNOFILE must leave room for.
MAX_CONNECTIONS = {"mwproxy": 4096, "mwmq": 10000}
# flock()ed while the packages are installed, so that two test runs on one
# machine take turns (dpkg's own locks are fcntl locks on files inside it).
LOCK = Path("/var/lib/dpkg")
# Left while they are installed: a run that died before its purge is recognised as such.
MARK = Path("/tmp/mwlab-package-test.installed")


def run(*cmd: str | Path, **kw) -> subprocess.CompletedProcess[str]:
    """A command that must succeed; its output when it does not."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def bin_dir() -> Path:
    """The binaries this run built: where MWPROXY_BIN is (scripts/testrun.py sets it), else target/debug."""
    env = os.environ.get("MWPROXY_BIN")
    return Path(env).parent if env else REPO / "target" / "debug"


@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> dict[str, Path]:
    """The three packages, uncompressed (compression is the slow part and checks nothing)."""
    missing = [p for p in [*PROGRAMS, "mwdist"] if not (bin_dir() / p).exists()]
    assert not missing, f"not built in {bin_dir()}: {missing} (cargo build --workspace --bins)"
    out = tmp_path_factory.mktemp("debs")
    env = dict(os.environ, BIN_DIR=str(bin_dir()), DEB_COMPRESS="none")
    made = run(REPO / "scripts" / "dist.sh", "deb", out, env=env).stdout.split()
    found = {Path(m).name.split("_")[0]: Path(m) for m in made}
    assert sorted(found) == sorted(PROGRAMS), made
    return found


@pytest.fixture(scope="module")
def tree(debs, tmp_path_factory) -> Path:
    """The packages' files unpacked into one directory (no root needed)."""
    root = tmp_path_factory.mktemp("tree")
    for deb in debs.values():
        run("dpkg-deb", "-x", deb, root)
    return root


def field(info: str, name: str) -> str:
    m = re.search(rf"^ {name}: (.*)$", info, re.M)
    assert m, f"no {name} in\n{info}"
    return m.group(1)


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_package_holds_what_an_operator_needs(debs, name):
    info = run("dpkg-deb", "--info", debs[name]).stdout
    assert field(info, "Package") == name
    version = run(bin_dir() / name, "--version").stdout.split()[1]
    assert field(info, "Version") == version
    assert field(info, "Architecture") == run("dpkg", "--print-architecture").stdout.strip()
    assert field(info, "Depends").startswith("libc6 (>= 2.")
    # Every library the binary links is depended on (libgcc_s had been left
    # out at random by a pipe that lost its writer).
    needed = run("objdump", "-p", bin_dir() / name).stdout
    if "libgcc_s" in needed:
        assert "libgcc-s1" in field(info, "Depends")
    assert "<" in field(info, "Maintainer") and field(info, "Description")
    listing = run("dpkg-deb", "--contents", debs[name]).stdout.splitlines()
    # "-rwxr-xr-x root/root 123 2025-01-01 00:00 ./usr/bin/mwproxy"
    files = {line.split()[-1].removeprefix("."): line.split()[0] for line in listing}
    assert all(" root/root " in line for line in listing), "every file belongs to root"
    assert files["/"] == "drwxr-xr-x", "the package's root directory is 755, as /'s"
    assert files[f"/usr/bin/{name}"] == "-rwxr-xr-x"
    expected = [
        f"/usr/share/man/man1/{name}.1.gz",
        f"/usr/share/bash-completion/completions/{name}",
        f"/usr/share/zsh/vendor-completions/_{name}",
        f"/usr/share/fish/vendor_completions.d/{name}.fish",
        f"/usr/share/doc/{name}/copyright",
        f"/usr/share/doc/{name}/changelog.gz",
    ]
    if name in SERVICES:
        expected += [
            f"/etc/{name}/{name}.toml",
            f"/usr/lib/systemd/system/{name}.service",
            f"/usr/lib/sysusers.d/{name}.conf",
        ]
    missing = [f for f in expected if f not in files]
    assert not missing, f"{name}'s package lacks {missing}"
    assert not [f for f in files if f.startswith("/usr/local")], "a package stays out of /usr/local"
    if name in SERVICES:
        assert run("dpkg-deb", "-I", debs[name], "conffiles").stdout.split() == [f"/etc/{name}/{name}.toml"]
        for script in ("postinst", "prerm", "postrm"):
            text = run("dpkg-deb", "-I", debs[name], script).stdout
            assert "@NAME@" not in text and name in text
            run("sh", "-n", "-c", text)
    else:
        assert "postinst" not in info, "a program that is no service needs no maintainer scripts"


def test_binaries_are_stripped_of_their_debug_info(tree):
    for name in PROGRAMS:
        sections = run("objdump", "-h", tree / "usr" / "bin" / name).stdout
        assert ".debug_info" not in sections, f"{name} carries its DWARF (tens of MB)"


def rendered(page: Path) -> str:
    """A man page as `man -l` shows it: ASCII, wide, unhyphenated, so flags stay whole."""
    env = dict(os.environ, LC_ALL="C", MANWIDTH="200", MANROFFOPT="-rHY=0", MANPAGER="cat")
    r = run("man", "-l", page, env=env)
    assert not r.stderr.strip(), f"man -l {page}: {r.stderr}"
    return r.stdout


@pytest.mark.parametrize("name", PROGRAMS)
def test_man_pages_render_every_flag_of_the_help(tree, name):
    page = rendered(tree / "usr/share/man/man1" / f"{name}.1.gz")
    assert re.search(rf"^NAME\n\s+{name} - \S", page, re.M), page[:400]
    for heading in ("SYNOPSIS", "OPTIONS", "EXIT STATUS", "SEE ALSO"):
        assert re.search(rf"^{heading}$", page, re.M), f"{name}(1) has no {heading}"
    # The page is made from the same command line as the binary's --help.
    helped = set(re.findall(r"--[a-z][a-z0-9-]+", run(tree / "usr/bin" / name, "--help").stdout))
    shown = set(re.findall(r"--[a-z][a-z0-9-]+", page))
    assert helped and helped <= shown, f"{name}(1) lacks {sorted(helped - shown)}"
    if name in SERVICES:
        assert f"/etc/{name}/{name}.toml" in page and "SIGTERM" in page
    if name == "mwmq":
        # The commands clients send, which the flags alone do not show.
        assert re.search(r"^COMMANDS$", page, re.M), "mwmq(1) has no COMMANDS"
        listed = ("SEND q body", "PRIORITY n", "BACKOFF base_ms max_ms", "QSCHEDULE name q cron", "QINFO q")
        for command in listed:
            assert command in page, f"mwmq(1) does not show {command!r}"
    # Every page a SEE ALSO or a SUBCOMMANDS section names that this package makes is there.
    for other in set(re.findall(rf"\b({name}-[a-z-]+)\(1\)", page)):
        sub = rendered(tree / "usr/share/man/man1" / f"{other}.1.gz")
        assert re.search(rf"^NAME\n\s+{other}", sub, re.M), sub[:300]


@pytest.mark.parametrize(("name", "flag"), [("mwproxy", "servers"), ("mwmq", "db"), ("mwload", "servers")])
def test_completions_know_the_flags(tree, name, flag):
    # What bash offers for `NAME --<first three letters><TAB>`.
    bash = tree / "usr/share/bash-completion/completions" / name
    typed = f"--{flag[:3]}"
    script = (
        f"source {bash} && COMP_WORDS=({name} {typed}) && COMP_CWORD=1 && "
        f'_{name} {name} {typed} {name} && echo "${{COMPREPLY[@]}}"'
    )
    assert f"--{flag}" in run("bash", "-c", script).stdout.split()
    assert f"-l {flag}" in (tree / "usr/share/fish/vendor_completions.d" / f"{name}.fish").read_text()
    zsh = (tree / "usr/share/zsh/vendor-completions" / f"_{name}").read_text()
    assert zsh.startswith(f"#compdef {name}") and f"--{flag}" in zsh


def settings(text: str) -> set[str]:
    return set(re.findall(r"^([a-z_]+) = ", text, re.M))


@pytest.mark.parametrize("name", SERVICES)
def test_packaged_configuration_states_the_true_defaults(tree, tmp_path, name):
    """Each `#key = value` of the packaged file, uncommented, changes
    nothing (it is the program's default), and every setting the program
    has is in the file; what is set is on loopback."""
    binary = tree / "usr/bin" / name
    conf = tree / "etc" / name / f"{name}.toml"
    text = conf.read_text()
    assert "@" + "SYSCONFDIR@" not in text
    as_packaged = run(binary, "--config", conf, "--print-config").stdout
    uncommented = tmp_path / "all.toml"
    uncommented.write_text(re.sub(r"^#([a-z_]+ = )", r"\1", text, flags=re.M))
    assert run(binary, "--config", uncommented, "--print-config").stdout == as_packaged
    unmentioned = settings(as_packaged) - set(re.findall(r"^#?([a-z_]+) = ", text, re.M))
    assert not unmentioned, f"{conf.name} does not mention {sorted(unmentioned)}"
    for addr in re.findall(r'^(?:listen|admin) = "([^"]+)"', as_packaged, re.M):
        assert addr.startswith("127.0.0.1:"), f"{name} listens beyond loopback by default: {addr}"


def unit(tree: Path, name: str) -> dict[str, list[str]]:
    """A unit file's settings: key -> values (in order)."""
    out: dict[str, list[str]] = {}
    for line in (tree / "usr/lib/systemd/system" / f"{name}.service").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


@pytest.mark.parametrize("name", SERVICES)
def test_units_are_hardened_and_sized(tree, name):
    u = unit(tree, name)
    assert u["ExecStart"] == [f"/usr/bin/{name} --config /etc/{name}/{name}.toml"]
    assert u["User"] == [name] and u["Restart"] == ["on-failure"]
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert u.get(key) == [value], f"{name}.service: {key}={u.get(key)}"
    assert int(u["LimitNOFILE"][0]) > MAX_CONNECTIONS[name] + 1024
    # mwproxy reloads on SIGHUP; mwmq does not, and says so instead of pretending.
    assert ("ExecReload" in u) == (name == "mwproxy")
    if name == "mwmq":
        assert "postgresql.service" in u["Wants"][0] and "postgresql.service" in u["After"][0]
        assert "Requires" not in u


def test_make_install_into_a_staging_root_and_uninstall(tmp_path):
    """`make install PREFIX=/usr/local DESTDIR=...` installs the packages' files
    with the prefix's paths; `make uninstall` removes them but a changed configuration."""
    stage = tmp_path / "stage"
    env = dict(os.environ, BIN_DIR=str(bin_dir()), PREFIX="/usr/local", DESTDIR=str(stage))
    run(REPO / "scripts" / "dist.sh", "install", env=env)
    local = stage / "usr/local"
    for name in PROGRAMS:
        assert run(local / "bin" / name, "--version").stdout.startswith(f"{name} ")
        assert (local / "share/man/man1" / f"{name}.1.gz").exists()
        assert (local / "share/zsh/site-functions" / f"_{name}").exists()
    for name in SERVICES:
        service = (local / "lib/systemd/system" / f"{name}.service").read_text()
        assert f"ExecStart=/usr/local/bin/{name} --config /usr/local/etc/{name}/{name}.toml\n" in service
        conf = local / "etc" / name / f"{name}.toml"
        assert f"-c /usr/local/etc/{name}/{name}.toml" in conf.read_text()
        assert (local / "lib/sysusers.d" / f"{name}.conf").read_text().count(f"\nu {name} ") == 1
    changed = local / "etc/mwmq/mwmq.toml"
    changed.write_text(changed.read_text() + "# changed here\n")
    run(REPO / "scripts" / "dist.sh", "install", env=env)
    assert changed.read_text().endswith("# changed here\n"), "install keeps a changed configuration"
    assert (local / "etc/mwmq/mwmq.toml.default").exists()
    run(REPO / "scripts" / "dist.sh", "uninstall", env=env)
    left = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file())
    assert left == ["usr/local/etc/mwmq/mwmq.toml"], left


def installed_by_someone_else() -> bool:
    """Whether a package is on this machine (installed, or its configuration left), not by this test."""
    query = ["dpkg-query", "-W", "-f", "${db:Status-Status} ", *PROGRAMS]
    r = subprocess.run(query, capture_output=True, text=True, check=False)
    return any(s != "not-installed" for s in r.stdout.split()) and not MARK.exists()


def purge() -> None:
    run("dpkg", "--purge", *PROGRAMS)
    MARK.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def installed(debs) -> Iterator[None]:
    """The packages installed on this machine with dpkg -i, purged afterwards whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("installing packages needs root")
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: make test installs it (the systemd package)")
    lock = os.open(LOCK, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed_by_someone_else():
            pytest.skip(f"{', '.join(PROGRAMS)} already installed on this machine: left alone")
        MARK.touch()
        try:
            run("dpkg", "-i", *debs.values())
            yield
        finally:
            purge()
    finally:
        os.close(lock)


@pytest.mark.parametrize("name", SERVICES)
def test_installed_service_runs_as_its_user_with_its_configuration(installed, name):
    user = pwd.getpwnam(name)
    assert user.pw_uid < 1000 and user.pw_shell.endswith("nologin"), "a system user without a login"
    conf = Path("/etc") / name / f"{name}.toml"
    st = conf.stat()
    assert (st.st_uid, grp.getgrgid(st.st_gid).gr_name, st.st_mode & 0o777) == (0, name, 0o640)
    # What the unit starts, as the unit's user: the configuration is readable and accepted.
    run("runuser", "-u", name, "--", f"/usr/bin/{name}", "--config", conf, "--print-config")
    verify = ["systemd-analyze", "verify", f"/usr/lib/systemd/system/{name}.service"]
    r = subprocess.run(verify, capture_output=True, text=True, check=False)
    # The verdict on this unit: other units of the machine may draw remarks of their own.
    mine = [line for line in (r.stdout + r.stderr).splitlines() if f"{name}.service" in line]
    assert r.returncode == 0 and not mine, f"systemd-analyze verify {name}.service:\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize("name", PROGRAMS)
def test_installed_binaries_answer_version_help_and_man(installed, name):
    version = run(f"/usr/bin/{name}", "--version").stdout
    assert version.startswith(f"{name} ")
    assert "Usage:" in run(f"/usr/bin/{name}", "--help").stdout
    assert run("man", "-w", name).stdout.strip() == f"/usr/share/man/man1/{name}.1.gz"


def test_purge_leaves_nothing_behind(installed, debs):
    """Last in the file: purges (the fixture's purge then finds nothing to do) and installs nothing back."""
    purge()
    for name in PROGRAMS:
        assert not Path(f"/usr/bin/{name}").exists()
    for name in SERVICES:
        assert not Path(f"/etc/{name}").exists()
        with pytest.raises(KeyError):
            pwd.getpwnam(name)
        with pytest.raises(KeyError):
            grp.getgrnam(name)

//! The `mwproxy` binary as a user runs it: flags, configuration errors,
//! `--print-config`, `--help` and `--version`, the warnings and the logs of
//! its first minute, `stats`' CPU times, and a clean stop on SIGTERM that
//! finishes in-flight requests.

use mwproxy::ServiceConfig;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mctest::{free_port, wait_for_port, Client, Memcached};

mod common;

fn mwproxy() -> Command {
    common::mwproxy_binary()
}

#[test]
fn print_config_shows_the_effective_configuration() {
    let out = mwproxy()
        .args(["-m", "127.0.0.1:11211", "127.0.0.1:11212:2", "-t", "16", "-s", "false", "--print-config"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("workers = 16"), "{text}");
    assert!(text.contains("\"127.0.0.1:11212:2\""), "{text}");
    assert!(text.contains("multiget = \"non-sharded\""), "{text}");
    let parsed = mwproxy::Config::from_toml(&text).unwrap();
    assert_eq!(parsed.routing.servers.len(), 2);
}

#[test]
fn bad_configurations_are_explained() {
    let cases: &[(&[&str], &str)] = &[
        (&[], "no servers"),
        (&["-m", "127.0.0.1:11211", "-r", "2"], "replication"),
        (&["-m", "nonsense"], "expected host:port"),
        (&["-m", "127.0.0.1:11211", "-t", "0"], "workers"),
        (&["-m", "127.0.0.1:11211", "--bogus"], "--bogus"),
        (&["-m", "127.0.0.1:11211", "--read-policy", "random"], "random"),
    ];
    for (args, needle) in cases {
        let out = mwproxy().args(*args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let dir = std::env::temp_dir().join(format!("mwproxy-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[routing]\nservers = [\"127.0.0.1:1\"]\nreplicas = 2\n").unwrap();
    let out = mwproxy().arg("-c").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("replicas"));
    std::fs::remove_dir_all(&dir).ok();
}

/// Bytes that wait unread in the connections accepted on 127.0.0.1:`port`
/// (their receive queues, from /proc/net/tcp): what has reached a stopped
/// server and waits for it.
fn unread_at(port: u16) -> u64 {
    let local = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local address, remote address, state (01: established), tx_queue:rx_queue.
            (f.len() > 4 && f[1] == local && f[3] == "01").then(|| f[4].split(':').nth(1)).flatten()
        })
        .map(|rx| u64::from_str_radix(rx, 16).unwrap())
        .sum()
}

#[test]
fn sigterm_finishes_in_flight_requests_then_exits_zero() {
    let server = Memcached::start().unwrap();
    let port = free_port();
    // Timeouts and grace far beyond any delay of a loaded machine, so that
    // only the stop itself decides what the request gets; no health checks,
    // so that the only bytes waiting at the frozen server are the request's.
    let dir = std::env::temp_dir().join(format!("mwproxy-bin-grace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("grace.toml");
    std::fs::write(&conf, "[proxy]\nshutdown_grace_secs = 60\n").unwrap();
    let mut child = mwproxy()
        .arg("-c")
        .arg(&conf)
        .args(["-p", &port.to_string(), "-m", &server.endpoint(), "--timeout-ms", "60000", "--check-ms", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_for_port(addr, common::PATIENCE).unwrap();
    // Ready when it answers, not only when its port accepts (something else
    // may have held the port a moment: the first connection is retried).
    let t0 = std::time::Instant::now();
    let mut c = loop {
        let attempt = Client::connect(addr).and_then(|mut c| c.call_str("set k 0 0 2\r\nhi\r\n").map(|r| (c, r)));
        match attempt {
            Ok((c, reply)) => {
                assert_eq!(reply, "STORED\r\n");
                break c;
            }
            Err(e) => {
                assert!(t0.elapsed() < common::PATIENCE, "mwproxy does not answer: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    // Hold the request inside the proxy: the server is frozen, and the
    // request has reached it (it waits in the server's socket).
    server.pause().unwrap();
    assert_eq!(unread_at(server.port()), 0, "nothing waits at the server before the request");
    c.send(b"get k\r\n").unwrap();
    assert!(
        common::eventually(common::PATIENCE, || unread_at(server.port()) > 0),
        "the request reached the frozen server"
    );
    let ok = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success();
    assert!(ok);
    assert!(
        common::eventually(common::PATIENCE, || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err()
        }),
        "no new connections after SIGTERM"
    );
    server.resume().unwrap();
    assert_eq!(String::from_utf8(c.read_reply().unwrap()).unwrap(), "VALUE k 0 2\r\nhi\r\nEND\r\n");
    let deadline = Instant::now() + common::PATIENCE;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "mwproxy did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The binary with only the flags a test gives (no engine of the tests' own).
fn bare() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mwproxy"))
}

/// Text with every run of white space made one space: what `--help` says,
/// however it is wrapped.
fn words(text: &[u8]) -> String {
    String::from_utf8_lossy(text).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `-t 4` on the async engine (the default) was accepted and ignored without
/// a word (`engine="async" threads=1`). Now a flag the engine in use does
/// not read is named in one warning line with what to use instead, and the
/// process goes on: the seed reports' `-t workers` still starts.
#[test]
fn a_flag_the_engine_ignores_is_one_warning_naming_what_to_use() {
    let warnings = |args: &[&str]| -> Vec<String> {
        let out = bare().args(["-m", "127.0.0.1:11211", "--print-config"]).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        err.lines().filter(|l| l.contains(" WARN ")).map(str::to_string).collect()
    };
    let lines = warnings(&["-t", "4"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("-t/--workers 4 is ignored by the async engine") && lines[0].contains("--threads"));
    let lines = warnings(&["--engine", "async", "--threads", "2", "--net-threads", "3", "--queue-capacity", "10"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("--net-threads 3 is ignored by the async engine"), "{lines:?}");
    assert!(lines[1].contains("--queue-capacity 10 is ignored by the async engine"), "{lines:?}");
    let lines = warnings(&["--engine", "pool", "-t", "4", "--threads", "2"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("--threads 2 is ignored by the pool engine") && lines[0].contains("-t/--workers"));
    let quiet = warnings(&["--engine", "pool", "-t", "4", "--net-threads", "2", "--queue-capacity", "10"]);
    assert!(quiet.is_empty(), "the pool engine reads them all: {quiet:?}");
}

/// `-V` named the version, but `--help` said `Worker threads [default: 8]`
/// whatever the engine, and `--admin` listed paths of mwmq's. Now each
/// engine-specific flag says which engine reads it, `--admin` lists what
/// this endpoint serves, and the flags are grouped under the headings
/// mwmq and mwload use too.
#[test]
fn version_and_help_say_what_each_engine_reads() {
    let out = bare().arg("--version").output().unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("mwproxy {}\n", env!("CARGO_PKG_VERSION")));
    let help = words(&bare().arg("--help").output().unwrap().stdout);
    for needle in [
        "-t, --workers <N> Worker threads of the pool engine (the async engine's threads are --threads) [default: 8]",
        "--threads <N> Event loops of the async engine, 0 = half the cores, at least one (the pool engine's \
         threads are -t/--workers) [default: 0]",
        "--net-threads <N> Threads of the pool engine",
        "--queue-capacity <N> Requests that may wait for a worker (pool engine; the async engine has no queue)",
        "HTTP admin endpoint (/metrics, /stats, /healthz, /readyz, POST /reload): host:port",
        "--log-format <FORMAT>",
        "Exit status: 0",
    ] {
        assert!(help.contains(needle), "{needle:?} not in {help}");
    }
    assert!(!help.contains("/ui"), "mwproxy serves no /ui: {help}");
    let headings = ["Clients:", "Servers:", "Engine:", "Measurement:", "Process:"];
    let at: Vec<usize> = headings.iter().map(|h| help.find(h).unwrap_or_else(|| panic!("no {h}"))).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "in this order: {headings:?}");
}

/// A server that does not answer at start (nothing listens on its port) is
/// a warning naming it, in either log format, and `/readyz` says 503 with it
/// among the servers down while the proxy goes on serving. The log written
/// to a file has no colour codes, and `--log-format json` writes one JSON
/// object per line.
#[test]
fn a_dead_server_at_start_is_a_warning_naming_it_in_text_or_json_without_colour() {
    let dir = std::env::temp_dir().join(format!("mwproxy-bin-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dead = format!("127.0.0.1:{}", free_port());
    for format in ["text", "json"] {
        let (port, admin) = (free_port(), free_port());
        let path = dir.join(format!("{format}.log"));
        let mut child = mwproxy()
            .args(["-p", &port.to_string(), "-m", &dead, "--admin", &admin.to_string(), "--log-format", format])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&path).unwrap())
            .spawn()
            .unwrap();
        let log = || std::fs::read_to_string(&path).unwrap_or_default();
        let named = |l: &str| match format {
            "json" => serde_json::from_str::<serde_json::Value>(l)
                .is_ok_and(|v| v["level"] == "WARN" && v["server"] == dead.as_str()),
            _ => l.contains(" WARN ") && l.contains(&format!("server={dead}")),
        };
        assert!(common::eventually(common::PATIENCE, || log().lines().any(named)), "{format}: {}", log());
        let admin_addr = format!("127.0.0.1:{admin}").parse().unwrap();
        wait_for_port(admin_addr, common::PATIENCE).unwrap();
        let (status, body) = mctest::http_get(admin_addr, "/readyz");
        assert!(status.contains(" 503 ") && body.contains(&dead), "{status} {body}");
        let mut c = Client::connect(format!("127.0.0.1:{port}").parse().unwrap()).unwrap();
        assert!(c.call_str("stats\r\n").unwrap().contains("STAT servers 1\r\n"), "it goes on serving");
        let _ = child.kill();
        let _ = child.wait();
        let text = std::fs::read(&path).unwrap();
        assert!(!text.contains(&0x1b), "{format}: colour codes in a file: {}", String::from_utf8_lossy(&text));
        if format == "json" {
            for line in String::from_utf8(text).unwrap().lines() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
                assert!(v["timestamp"].is_string() && v["level"].is_string() && v["message"].is_string(), "{line}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `stats` said `rusage_user 0.000000` for a proxy that had worked: its
/// CPU times came in clock ticks of 10 ms. Now they are getrusage(2)'s, in
/// microseconds, as memcached's: a fresh proxy that answered a few requests
/// has used some.
#[test]
fn stats_shows_the_cpu_time_used() {
    let server = Memcached::start().unwrap();
    let port = free_port();
    let mut child = mwproxy()
        .args(["-p", &port.to_string(), "-m", &server.endpoint()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_for_port(addr, common::PATIENCE).unwrap();
    let mut c = Client::connect(addr).unwrap();
    let seconds = |stats: &str, name: &str| -> f64 {
        let prefix = format!("STAT {name} ");
        stats.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {name}")).parse().unwrap()
    };
    // The kernel may account CPU time by ticks: work until some shows (it
    // was always 0 before, whatever the work), within the usual patience.
    let mut stats = String::new();
    let used = common::eventually(common::PATIENCE, || {
        for i in 0..500 {
            assert_eq!(c.call_str(&format!("set k{i} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
        }
        stats = c.call_str("stats\r\n").unwrap();
        seconds(&stats, "rusage_user") > 0.0
    });
    assert!(used, "{stats}");
    assert!(seconds(&stats, "rusage_system") >= 0.0, "{stats}");
    let _ = child.kill();
    let _ = child.wait();
}

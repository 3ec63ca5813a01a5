//! The `mwproxy` binary as a user runs it: flags, configuration errors,
//! `--print-config`, and a clean stop on SIGTERM that finishes in-flight requests.

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

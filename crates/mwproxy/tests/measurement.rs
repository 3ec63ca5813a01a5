//! mwproxy's measurements: a scripted client sends a known mix and the
//! results files, the trace and the admin endpoint must account for exactly it.

mod common;

use mctest::http_get;
use mwproxy::Service;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mctest::Client;
use mwstats::reader::{read_summary, read_windows};
use mwstats::WindowRecord;

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mwproxy-measure-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Sends the known mix; returns (op -> count, op -> keys, op -> hits).
fn known_mix(c: &mut Client) -> [(&'static str, u64, u64, u64); 5] {
    for i in 0..30 {
        assert_eq!(c.call_str(&format!("set m{i} 0 0 2\r\nok\r\n")).unwrap(), "STORED\r\n");
    }
    for i in 0..50 {
        // m0..m24 exist, x25..x49 do not
        let key = if i < 25 { format!("m{i}") } else { format!("x{i}") };
        c.call_str(&format!("get {key}\r\n")).unwrap();
    }
    for i in 0..20 {
        // two of three keys exist
        c.call_str(&format!("get m{} m{} nope{i}\r\n", i, i + 1)).unwrap();
    }
    for i in 0..10 {
        assert_eq!(c.call_str(&format!("delete m{i}\r\n")).unwrap(), "DELETED\r\n");
    }
    for _ in 0..5 {
        c.call_str("incr counter 1\r\n").unwrap();
    }
    [("set", 30, 30, 0), ("get", 50, 50, 25), ("multiget", 20, 60, 40), ("delete", 10, 10, 0), ("other", 5, 5, 0)]
}

fn sum_windows(windows: &[WindowRecord], op: &str, field: fn(&mwstats::record::OpRecord) -> u64) -> u64 {
    windows.iter().map(|w| field(&w.ops[op])).sum()
}

#[test]
fn windows_and_summary_account_for_every_request() {
    let servers = common::servers(2);
    let dir = out_dir("mix");
    let proxy = common::proxy(&servers, |c| {
        c.stats.out = Some(dir.to_string_lossy().into_owned());
        c.stats.window_ms = 200;
        c.stats.trace_every = 1;
    });
    let mut c = common::client(&proxy);
    let expected = known_mix(&mut c);
    std::thread::sleep(Duration::from_millis(450));
    for _ in 0..5 {
        c.call_str("get m20\r\n").unwrap();
    }
    drop(c);
    common::stop(proxy);

    let windows = read_windows(&dir).unwrap();
    let summary = read_summary(&dir).unwrap();
    assert!(windows.len() >= 3, "several 200 ms windows: {}", windows.len());
    for (op, count, keys, hits) in expected {
        let extra = if op == "get" { 5 } else { 0 };
        assert_eq!(sum_windows(&windows, op, |o| o.count), count + extra, "{op} count");
        assert_eq!(sum_windows(&windows, op, |o| o.keys), keys + extra, "{op} keys");
        assert_eq!(sum_windows(&windows, op, |o| o.hits), hits + extra, "{op} hits");
        let misses = if op.contains("get") { keys - hits } else { 0 };
        assert_eq!(sum_windows(&windows, op, |o| o.misses), misses, "{op} misses");
        let s = &summary.ops[op];
        assert_eq!((s.count, s.keys, s.hits), (count + extra, keys + extra, hits + extra), "{op} in summary");
        assert_eq!(s.response_us.count, s.count);
    }
    for op in ["get", "multiget", "set", "delete", "other", "all"] {
        let f = |o: &mwstats::record::OpRecord| o.response_us.count;
        assert_eq!(sum_windows(&windows, op, f), summary.ops[op].response_us.count, "{op} histogram");
    }
    // Windows follow each other on wall-clock multiples of their length.
    for pair in windows.windows(2) {
        assert_eq!(pair[0].start_unix_ms + pair[0].duration_ms, pair[1].start_unix_ms);
        assert_eq!(pair[1].start_unix_ms % 200, 0);
    }
    // Middleware figures add up too.
    let mw: Vec<_> = windows.iter().map(|w| w.middleware.clone().unwrap()).collect();
    let smw = summary.middleware.clone().unwrap();
    let requests: u64 = mw.iter().map(|m| m.backends.values().map(|b| b.requests).sum::<u64>()).sum();
    assert_eq!(requests, smw.backends.values().map(|b| b.requests).sum::<u64>());
    assert!(requests >= 120, "every request reached a server: {requests}");
    assert_eq!(mw.iter().map(|m| m.connections.accepted).sum::<u64>(), 1);
    assert_eq!(mw.iter().map(|m| m.bytes_in).sum::<u64>(), smw.bytes_in);
    assert!(smw.bytes_out > 0 && smw.queue_us.count == summary.ops["all"].count);
    let meta = summary.metadata.clone().unwrap();
    assert!(meta.version.starts_with("mwproxy-") && meta.cpu_count > 0 && meta.end_unix_ms >= meta.start_unix_ms);
    assert_eq!(meta.config["stats"]["window_ms"], 200);
    assert_eq!(meta.config["proxy"]["engine"], common::engine().name(), "the engine is in the metadata");
    let workers = smw.workers;
    assert_eq!(
        workers,
        if common::engine() == mwproxy::config::Engine::Pool { 4 } else { 2 },
        "threads carrying requests"
    );
    check_trace(&dir.join("trace.csv"), summary.ops["all"].count);
    std::fs::remove_dir_all(&dir).ok();
}

/// Every traced request's timestamps are in order, hence server <= service <= response.
fn check_trace(path: &Path, expected_rows: u64) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next().unwrap(), mwstats::writer::TRACE_HEADER);
    let mut rows = 0;
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 13, "{line}");
        let t: Vec<u64> = f[4..11].iter().map(|x| x.parse().unwrap()).collect();
        assert!(t.windows(2).all(|p| p[0] <= p[1]), "timestamps in order: {line}");
        let (server, service, response) = (t[5] - t[4], t[6] - t[3], t[6] - t[0]);
        assert!(server <= service && service <= response, "{line}");
        rows += 1;
    }
    assert_eq!(rows, expected_rows, "trace-every 1 traces every request");
}

fn closed_loop(addr: SocketAddr, clients: usize, requests: usize) {
    // Values large enough that serving one takes a while: queueing behind
    // other clients then stands out from scheduling noise on a busy machine.
    let mut c = Client::connect(addr).unwrap();
    let value = vec![b'v'; 64 * 1024];
    for k in 0..20 {
        let mut req = format!("set q{k} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        assert_eq!(c.call(&req).unwrap(), b"STORED\r\n");
    }
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                for i in 0..requests {
                    let reply = c.call(format!("get q{}\r\n", (t * 7 + i) % 20).as_bytes()).unwrap();
                    assert!(reply.starts_with(b"VALUE q") && reply.len() > 64 * 1024, "a whole value");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

fn queue_mean(clients: usize) -> (f64, f64) {
    let servers = common::servers(1);
    let dir = out_dir(&format!("queue{clients}"));
    let proxy = common::proxy(&servers, |c| {
        c.proxy.workers = 1;
        c.stats.out = Some(dir.to_string_lossy().into_owned());
    });
    closed_loop(proxy.local_addr(), clients, 300);
    common::stop(proxy);
    let s = read_summary(&dir).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let mw = s.middleware.unwrap();
    (mw.queue_us.mean, mw.queue_length_mean)
}

#[test]
fn queue_time_is_near_zero_alone_and_grows_when_clients_outnumber_workers() {
    let (alone, alone_len) = queue_mean(1);
    let (crowded, crowded_len) = queue_mean(12);
    // A connection has one request in the queue or in a worker at a time, so
    // the time-weighted queue length is at most the number of clients.
    assert!(alone_len <= 1.0, "one client queues at most one request: {alone_len}");
    assert!(crowded_len <= 12.0, "12 clients queue at most 12 requests: {crowded_len}");
    assert!(crowded > alone, "12 clients on 1 worker queue longer: {crowded} us vs {alone} us");
    assert!(crowded_len > alone_len, "queue length grows: {crowded_len} vs {alone_len}");
}

fn metric(page: &str, sample: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(sample).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{sample} not in page"))
        .parse()
        .unwrap()
}

#[test]
fn admin_endpoint_serves_metrics_stats_and_health() {
    let servers = common::servers(2);
    let dir = out_dir("admin");
    let proxy = common::proxy(&servers, |c| {
        c.stats.out = Some(dir.to_string_lossy().into_owned());
        c.stats.window_ms = 100;
        c.stats.admin = Some("127.0.0.1:0".into());
    });
    let admin = proxy.admin_addr().unwrap();
    let mut c = common::client(&proxy);
    known_mix(&mut c);
    std::thread::sleep(Duration::from_millis(350));
    let (status, health) = http_get(admin, "/healthz");
    assert!(status.contains("200") && health.starts_with("ok"), "{status} {health}");
    let (status, stats) = http_get(admin, "/stats");
    assert!(status.contains("200"));
    let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(v["last"]["format"], "mwlab/1");
    assert!(v["current"]["ops"]["all"]["count"].is_u64());
    let (_, page) = http_get(admin, "/metrics");
    assert!(http_get(admin, "/nope").0.contains("404"));
    drop(c);
    common::stop(proxy);
    let summary = read_summary(&dir).unwrap();
    for op in ["get", "multiget", "set", "delete", "other"] {
        let sample = format!("mwproxy_requests_total{{op=\"{op}\"}}");
        assert_eq!(metric(&page, &sample) as u64, summary.ops[op].count, "{op}");
        let sample = format!("mwproxy_response_seconds_count{{op=\"{op}\"}}");
        assert_eq!(metric(&page, &sample) as u64, summary.ops[op].response_us.count, "{op}");
    }
    assert_eq!(metric(&page, "mwproxy_connections_accepted_total") as u64, 1);
    assert_eq!(metric(&page, "mwproxy_config_generation"), 1.0);
    for name in ["auth_commands", "tls_handshake_failures", "config_reloads", "config_reload_failures"] {
        assert_eq!(metric(&page, &format!("mwproxy_{name}_total")), 0.0, "{name}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `/metrics` showed the closed windows only: a `get` just answered was
/// `mwproxy_requests_total{op="get"} 0` until its window closed. Now it
/// counts the window in progress too; with hour-long windows none closes
/// during the test, so only the live count can pass.
#[test]
fn metrics_count_a_request_as_soon_as_it_is_answered() {
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |c| {
        c.stats.window_ms = 3_600_000;
        c.stats.admin = Some("127.0.0.1:0".into());
    });
    let admin = proxy.admin_addr().unwrap();
    let mut c = common::client(&proxy);
    let now = |sample: &str| metric(&http_get(admin, "/metrics").1, sample);
    assert_eq!(c.call_str("get k\r\n").unwrap(), "END\r\n");
    // Recorded off the request path, just after the reply: polled for, never a window long.
    let get = r#"mwproxy_requests_total{op="get"}"#;
    assert!(common::eventually(common::PATIENCE, || now(get) == 1.0), "{}", now(get));
    assert_eq!(now(r#"mwproxy_misses_total{op="get"}"#), 1.0);
    assert_eq!(now("mwproxy_connections_accepted_total"), 1.0);
    assert!(now("mwproxy_received_bytes_total") >= 7.0, "the bytes of the get");
    drop(c);
    common::stop(proxy);
}

#[test]
fn readyz_answers_503_while_some_key_has_no_reachable_replica() {
    let mut servers = common::servers(3);
    let proxy = common::proxy(&servers, |c| {
        c.stats.admin = Some("127.0.0.1:0".into());
        c.routing.replication = 2;
        c.backend.retry_min_ms = 50;
        c.backend.retry_max_ms = 100;
    });
    let admin = proxy.admin_addr().unwrap();
    let ready = || {
        // (A readiness check's answer is served again for READY_FOR: wait it
        // out, so that this answer is a new check's.)
        std::thread::sleep(mwserve::http::READY_FOR);
        let (status, body) = http_get(admin, "/readyz");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        (status.contains("200"), v)
    };
    // Ready once the health checker's first look at each server is over.
    assert!(
        common::eventually(Duration::from_secs(30), || {
            let (ok, v) = ready();
            ok && v["ready"] == true && v["down"].as_array().unwrap().is_empty()
        }),
        "{}",
        ready().1
    );
    let mut c = common::client(&proxy);
    let touch = |c: &mut Client| {
        for k in 0..40 {
            c.call_str(&format!("set k{k} 0 0 1\r\nx\r\n")).unwrap();
        }
    };
    // One server of three down under R = 2: every key still has a replica.
    servers[0].stop();
    touch(&mut c);
    let (ok, v) = ready();
    assert!(ok && v["down"].as_array().unwrap().len() == 1, "{v}");
    // Two down: the keys they both hold have none.
    servers[1].stop();
    touch(&mut c);
    let (ok, v) = ready();
    assert!(!ok && v["ready"] == false && v["down"].as_array().unwrap().len() == 2, "{v}");
    assert!(http_get(admin, "/healthz").0.contains("200"), "the process itself is alive");
    // Back again: ready once the probes find them.
    servers[0].restart().unwrap();
    servers[1].restart().unwrap();
    assert!(
        common::eventually(common::PATIENCE, || {
            touch(&mut c);
            ready().0
        }),
        "ready again once the servers answer"
    );
    drop(c);
    common::stop(proxy);
}

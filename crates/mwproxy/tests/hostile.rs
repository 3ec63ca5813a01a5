//! Hostile conditions: a stalled server, clients that never read or that
//! pipeline hard, a server that closes in the middle of a reply, replicas
//! left different by a failed write, too few file descriptors, and servers
//! that stream garbage or trickle. Each must hurt nobody else.

mod common;

use mwproxy::Service;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcproto::ring::{HashKind, Ring, ServerSpec};
use mctest::{Client, Memcached};

fn ring_of(endpoints: &[String]) -> Ring {
    let specs: Vec<ServerSpec> = endpoints.iter().map(|e| e.parse().unwrap()).collect();
    Ring::new(HashKind::Ketama, &specs)
}

fn endpoints(servers: &[Memcached]) -> Vec<String> {
    servers.iter().map(|s| s.endpoint()).collect()
}

/// The 99th percentile of some latencies.
fn p99(mut v: Vec<Duration>) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

/// The servers' timeout in the stall tests: long, so that waiting it out
/// (what these tests catch) is told apart from a busy machine's delays.
const STALL_TIMEOUT: Duration = Duration::from_secs(4);

/// Three servers behind a proxy with 8 workers and a 4 s timeout, `n` keys
/// `{prefix}{i}` stored through it, the ring, and the client that stored them.
fn three_servers_with_keys(
    prefix: &str,
    n: usize,
) -> (Vec<mctest::Memcached>, mwproxy::Proxy, Ring, Vec<String>, Client) {
    let servers = common::servers(3);
    let proxy = common::proxy(&servers, |c| {
        c.proxy.workers = 8;
        c.backend.timeout_ms = STALL_TIMEOUT.as_millis() as u64;
    });
    let ring = ring_of(&endpoints(&servers));
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let mut c = common::client(&proxy);
    for k in &keys {
        assert_eq!(c.call_str(&format!("set {k} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    (servers, proxy, ring, keys, c)
}

#[test]
fn a_stalled_server_leaves_the_other_servers_keys_fast() {
    let (servers, proxy, ring, keys, mut c) = three_servers_with_keys("stall", 300);
    let healthy: Vec<String> = keys.iter().filter(|k| ring.server_for(k.as_bytes()) != 0).cloned().collect();
    let addr = proxy.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    // Background load over every key, the stalled server's included.
    let loaders: Vec<_> = (0..6)
        .map(|t| {
            let (stop, keys) = (stop.clone(), keys.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut i = t * 7;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    c.call_str(&format!("get {}\r\n", keys[i % keys.len()])).unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    // A probe that asks only for keys of the healthy servers.
    let probe = |c: &mut Client, run: Duration| {
        let (mut times, mut bad) = (Vec::new(), 0);
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < run {
            let k = &healthy[i % healthy.len()];
            let t = Instant::now();
            let reply = c.call_str(&format!("get {k}\r\n")).unwrap();
            times.push(t.elapsed());
            if reply != format!("VALUE {k} 0 1\r\nx\r\nEND\r\n") {
                bad += 1;
            }
            i += 1;
        }
        (times, bad)
    };
    let (before, bad_before) = probe(&mut c, Duration::from_millis(1000));
    servers[0].pause().unwrap();
    let (during, bad_during) = probe(&mut c, Duration::from_millis(2500));
    let stalled_key = keys.iter().find(|k| ring.server_for(k.as_bytes()) == 0).unwrap();
    let reply = c.call_str(&format!("get {stalled_key}\r\n")).unwrap();
    servers[0].resume().unwrap();
    stop.store(true, Ordering::Relaxed);
    for l in loaders {
        l.join().unwrap();
    }
    assert_eq!((bad_before, bad_during), (0, 0), "healthy keys are always served");
    // Failed at once (stalled or down), not after waiting out the timeout.
    assert!(reply.starts_with("SERVER_ERROR backend"), "{reply}");
    assert!(!reply.contains("timeout"), "the stalled server's keys fail at once: {reply}");
    let rate = |v: &Vec<Duration>, secs: f64| v.len() as f64 / secs;
    let (p99_before, p99_during) = (p99(before.clone()), p99(during.clone()));
    eprintln!(
        "healthy keys: {:.0}/s p99 {p99_before:?} before, {:.0}/s p99 {p99_during:?} during the stall",
        rate(&before, 1.0),
        rate(&during, 2.5)
    );
    // Every worker waiting out the 4 s timeout would put p99 near the whole
    // 2.5 s of the probe and the rate near zero; a busy machine's delays show
    // in the baseline's p99 too.
    let bound = (STALL_TIMEOUT / 4).max(p99_before * 4);
    assert!(p99_during < bound, "p99 of healthy keys during the stall: {p99_during:?} (before: {p99_before:?})");
    assert!(
        common::eventually(common::PATIENCE, || {
            c.call_str(&format!("get {stalled_key}\r\n")).unwrap() == format!("VALUE {stalled_key} 0 1\r\nx\r\nEND\r\n")
        }),
        "the server serves again once it answers"
    );
    common::stop(proxy);
}

#[test]
fn many_clients_on_a_stalled_servers_hot_key_leave_the_other_servers_keys_fast() {
    // Every carrier ends up waiting on the frozen server (16 clients keep
    // asking for its hot key, 8 workers): nobody else answers meanwhile, yet
    // the others' keys, queued behind them, must not wait for the timeout.
    let (servers, proxy, ring, keys, mut c) = three_servers_with_keys("hot", 200);
    let hot = keys.iter().find(|k| ring.server_for(k.as_bytes()) == 0).unwrap().clone();
    let healthy: Vec<String> = keys.iter().filter(|k| ring.server_for(k.as_bytes()) != 0).cloned().collect();
    let healthy_get = |c: &mut Client, run: Duration| {
        let mut times = Vec::new();
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < run {
            let k = &healthy[i % healthy.len()];
            let t = Instant::now();
            assert_eq!(c.call_str(&format!("get {k}\r\n")).unwrap(), format!("VALUE {k} 0 1\r\nx\r\nEND\r\n"));
            times.push(t.elapsed());
            i += 1;
        }
        times
    };
    let before = p99(healthy_get(&mut c, Duration::from_millis(500)));
    servers[0].pause().unwrap();
    let addr = proxy.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..16)
        .map(|_| {
            let (stop, hot) = (stop.clone(), hot.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                let deadline = Instant::now() + Duration::from_secs(20);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    c.call_str(&format!("get {hot}\r\n")).unwrap();
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let times = healthy_get(&mut c, Duration::from_millis(2500));
    servers[0].resume().unwrap();
    stop.store(true, Ordering::Relaxed);
    for h in hammers {
        h.join().unwrap();
    }
    let (worst, p) = (*times.iter().max().unwrap(), p99(times.clone()));
    eprintln!(
        "other servers' keys during the stall: {} requests, p99 {p:?}, max {worst:?} (p99 before {before:?})",
        times.len()
    );
    // Unfixed, every worker sat out the timeout: the other keys waited for
    // most of it (0.7-1 s of a 1 s timeout). A busy machine's own delays
    // show in the baseline's p99 too.
    let bound = (STALL_TIMEOUT / 4).max(before * 4);
    assert!(p < bound, "p99 of the other servers' keys: {p:?} (max {worst:?}, p99 before {before:?})");
    common::stop(proxy);
}

/// Sends `bytes` and never reads; gives up writing when the proxy stops reading.
fn flood(addr: std::net::SocketAddr, bytes: Vec<u8>) -> std::thread::JoinHandle<TcpStream> {
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.write_all(&bytes);
        s
    })
}

#[test]
fn clients_that_never_read_keep_memory_bounded_and_neighbours_served() {
    let server = Memcached::start_with(&["-m", "256"]).unwrap();
    // Under a 2 GiB address-space limit, as in production containers: running
    // out of memory would abort the process and drop every client.
    let mut proxy =
        common::ProxyProcess::start("ulimit -v 2097152;", &["-m", &server.endpoint(), "--memory-budget", "32m"]);
    let mut c = Client::connect(proxy.addr()).unwrap();
    let big = "b".repeat(512 * 1024);
    assert_eq!(c.call_str(&format!("set big 0 0 {}\r\n{big}\r\n", big.len())).unwrap(), "STORED\r\n");
    let rss_before = proxy.rss_mb();
    // 100 clients pipeline gets of a 512 KiB value and never read; one sends
    // 1,500 of them; one pipelines sets of 256 KiB values without reading.
    let mut floods: Vec<_> = (0..100).map(|_| flood(proxy.addr(), "get big\r\n".repeat(300).into_bytes())).collect();
    floods.push(flood(proxy.addr(), "get big\r\n".repeat(1500).into_bytes()));
    let value = "s".repeat(256 * 1024);
    let sets = (0..300).map(|i| format!("set in{i} 0 0 {}\r\n{value}\r\n", value.len())).collect::<String>();
    floods.push(flood(proxy.addr(), sets.into_bytes()));
    let held: Vec<TcpStream> = floods.into_iter().map(|f| f.join().unwrap()).collect();
    std::thread::sleep(Duration::from_millis(500));
    // A neighbour is served all along.
    let mut served = 0;
    let start = Instant::now();
    for i in 0..200 {
        let v = format!("v{i}");
        let ok = c.call_str(&format!("set n 0 0 {}\r\n{v}\r\n", v.len())).unwrap() == "STORED\r\n"
            && c.call_str("get n\r\n").unwrap() == format!("VALUE n 0 {}\r\n{v}\r\nEND\r\n", v.len());
        served += usize::from(ok);
    }
    let took = start.elapsed();
    let rss = proxy.rss_mb();
    let stats = c.call_str("stats\r\n").unwrap();
    eprintln!(
        "RSS {rss_before:.0} MB before, {rss:.0} MB with 102 clients not reading; neighbour: 400 requests in {took:?}; \
         unread replies {} B",
        common::stat(&stats, "pending_output_bytes")
    );
    assert_eq!(served, 200);
    // 102 connections x (1 MiB budget + one 512 KiB reply) + 32 MiB in total
    // would be ~185 MB at worst; without budgets it was gigabytes.
    assert!(rss - rss_before < 250.0, "RSS grew by {:.0} MB", rss - rss_before);
    drop(held);
    assert!(
        common::eventually(common::PATIENCE, || {
            common::stat(&c.call_str("stats\r\n").unwrap(), "curr_connections") == 1
        }),
        "the greedy clients are cleaned up once they leave"
    );
    let stats = c.call_str("stats\r\n").unwrap();
    assert_eq!(common::stat(&stats, "pending_output_bytes"), 0);
    assert_eq!(common::stat(&stats, "pending_input_bytes"), 0);
    assert!(proxy.child.try_wait().unwrap().is_none(), "still running: {}", proxy.log());
}

/// Operations per second of a client with one request at a time, over `run`.
fn ordinary_rate(addr: std::net::SocketAddr, run: Duration) -> f64 {
    let mut c = Client::connect(addr).unwrap();
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < run {
        assert_eq!(c.call_str("get ordinary\r\n").unwrap(), "VALUE ordinary 0 1\r\nx\r\nEND\r\n");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

#[test]
fn pipelining_neighbours_do_not_starve_an_ordinary_client() {
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |c| {
        c.proxy.workers = 8;
        // Every carrier waits for the one server here: on a busy machine a
        // memcached kept off the CPU for 50 ms (the default) would be taken
        // for stalled, and this test is about fairness, not stalls.
        c.backend.timeout_ms = 10_000;
        c.backend.stall_ms = 2000;
    });
    let addr = proxy.local_addr();
    let mut c = common::client(&proxy);
    assert_eq!(c.call_str("set ordinary 0 0 1\r\nx\r\n").unwrap(), "STORED\r\n");
    let alone = ordinary_rate(addr, Duration::from_millis(1000));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    // Each keeps 16 requests in flight all the time: its line never empties.
    let pipeliners: Vec<_> = (0..16)
        .map(|t| {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                let get = format!("get p{t}\r\n");
                c.send(get.repeat(16).as_bytes()).unwrap();
                let deadline = Instant::now() + Duration::from_secs(20);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    assert_eq!(c.read_reply().unwrap(), b"END\r\n");
                    c.send(get.as_bytes()).unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let before = done.load(Ordering::Relaxed);
    let t = Instant::now();
    let crowded = ordinary_rate(addr, Duration::from_millis(1500));
    let pipelined = (done.load(Ordering::Relaxed) - before) as f64 / t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for p in pipeliners {
        p.join().unwrap();
    }
    eprintln!("ordinary client: {alone:.0}/s alone, {crowded:.0}/s next to 16 pipelining clients ({pipelined:.0}/s)");
    // Behind pipelining connections that never let go of their worker, it
    // got about 0.2% of its rate alone; memcached itself, sharing the same
    // cores, leaves it 10-25% — and 1.3% on a host loaded 14 times over its
    // two cores, hence the bound at 0.5%.
    assert!(crowded > alone / 200.0, "{crowded:.0}/s next to the pipelining clients vs {alone:.0}/s alone");
    // And the pipelining clients are not held to the ordinary client's pace
    // (measured: pool 10-30x its rate; async, which serves every ready
    // connection a batch per loop turn, 7x on a busy machine to 170x).
    assert!(pipelined > 3.0 * crowded, "the pipelining clients keep their throughput");
    common::stop(proxy);
}

#[test]
fn a_server_that_closes_mid_reply_never_gets_a_request_twice() {
    let received = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = received.clone();
    // On every connection: the first request is answered, the second gets
    // half a reply and the connection is closed.
    let fake = common::FakeServer::start(move |s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        for n in 0.. {
            let Some(line) = common::read_request(&mut r) else { return };
            seen.lock().unwrap().push(line.trim_end().to_string());
            let incr = line.starts_with("incr");
            let reply: &[u8] = match (n, incr) {
                (0, true) => b"1\r\n",
                (0, false) => b"STORED\r\n",
                (_, true) => b"2",
                (_, false) => b"STOR",
            };
            let _ = w.write_all(reply);
            if n > 0 {
                return;
            }
        }
    });
    let proxy = common::proxy_for(&[fake.endpoint()], |c| {
        c.proxy.workers = 1;
        c.backend.retry_min_ms = 1;
        c.backend.retry_max_ms = 1;
        // The fake follows its script whatever it is sent: a health check's
        // `version` would find it broken and mark it down.
        c.backend.check_ms = 0;
    });
    let mut c = common::client(&proxy);
    let mut answered = 0;
    for _ in 0..10 {
        let reply = c.call_str("incr ctr 1\r\n").unwrap();
        answered += usize::from(!reply.starts_with("SERVER_ERROR backend"));
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..4 {
        let reply = c.call_str("append b 0 0 1\r\nb\r\n").unwrap();
        answered += usize::from(!reply.starts_with("SERVER_ERROR backend"));
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = received.lock().unwrap().clone();
    assert_eq!(got.iter().filter(|l| l.starts_with("incr")).count(), 10, "one incr per request: {got:?}");
    assert_eq!(got.iter().filter(|l| l.starts_with("append")).count(), 4, "one append per request: {got:?}");
    assert_eq!(answered, 7, "every other request got half a reply and SERVER_ERROR");
    common::stop(proxy);
}

#[test]
fn a_restarted_server_is_reconnected_without_failing_a_request() {
    let mut servers = common::servers(1);
    let proxy = common::proxy(&servers, |c| c.proxy.workers = 2);
    let mut c = common::client(&proxy);
    for i in 0..20 {
        assert_eq!(c.call_str(&format!("set r{i} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    servers[0].restart().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The workers' connections were closed by the old process while idle.
    for i in 0..20 {
        assert_eq!(c.call_str(&format!("set r{i} 0 0 1\r\ny\r\n")).unwrap(), "STORED\r\n", "request {i}");
    }
    common::stop(proxy);
}

/// Asks every server directly for `key`.
fn direct_values(servers: &[Memcached], key: &str) -> Vec<String> {
    servers.iter().map(|s| Client::connect(s.addr()).unwrap().call_str(&format!("get {key}\r\n")).unwrap()).collect()
}

#[test]
fn replicas_converge_after_a_write_that_failed_on_one_of_them() {
    let servers = common::servers(2);
    let proxy = common::proxy(&servers, |c| {
        c.routing.replication = 2;
        c.backend.timeout_ms = 300;
    });
    let mut c = common::client(&proxy);
    assert_eq!(c.call_str("set k 0 0 2\r\nv1\r\n").unwrap(), "STORED\r\n");
    servers[1].pause().unwrap();
    let r2 = c.call_str("set k 0 0 2\r\nv2\r\n").unwrap();
    let r3 = c.call_str("set k 0 0 2\r\nv3\r\n").unwrap();
    assert!(r2.starts_with("SERVER_ERROR backend") && r3.starts_with("SERVER_ERROR backend"), "{r2} {r3}");
    servers[1].resume().unwrap();
    assert!(
        common::eventually(common::PATIENCE, || {
            // Requests are what probe a server that is down.
            c.call_str("set other 0 0 1\r\nx\r\n").unwrap() == "STORED\r\n"
                && common::stat(&c.call_str("stats\r\n").unwrap(), "servers_down") == 0
        }),
        "the paused server comes back"
    );
    let reads: Vec<String> = (0..20).map(|_| c.call_str("get k\r\n").unwrap()).collect();
    assert!(reads.iter().all(|r| r == &reads[0]), "reads agree: {reads:?}");
    let direct = direct_values(&servers, "k");
    assert_eq!(direct[0], direct[1], "the replicas hold the same");
    let stats = c.call_str("stats\r\n").unwrap();
    assert!(common::stat(&stats, "replica_write_failures") >= 2, "{stats}");
    assert!(common::stat(&stats, "repairs_done") >= 1, "{stats}");
    // A later write reaches both again.
    assert_eq!(c.call_str("set k 0 0 2\r\nv4\r\n").unwrap(), "STORED\r\n");
    assert_eq!(direct_values(&servers, "k"), vec!["VALUE k 0 2\r\nv4\r\nEND\r\n".to_string(); 2]);
    common::stop(proxy);
}

#[test]
fn a_write_quorum_keeps_writes_available_and_miss_failover_hides_an_empty_replica() {
    let mut servers = common::servers(2);
    let proxy = common::proxy(&servers, |c| {
        c.routing.replication = 2;
        c.routing.write_quorum = 1;
        c.routing.miss_failover = true;
    });
    let mut c = common::client(&proxy);
    for i in 0..30 {
        assert_eq!(c.call_str(&format!("set q{i} 0 0 1\r\na\r\n")).unwrap(), "STORED\r\n");
    }
    servers[1].stop();
    for i in 0..30 {
        assert_eq!(c.call_str(&format!("set q{i} 0 0 1\r\nb\r\n")).unwrap(), "STORED\r\n", "quorum of one");
    }
    servers[1].restart().unwrap();
    // The restarted replica is empty (and its repairs delete what it never had):
    // every read still finds the value on the other replica.
    for round in 0..3 {
        for i in 0..30 {
            let reply = c.call_str(&format!("get q{i}\r\n")).unwrap();
            assert_eq!(reply, format!("VALUE q{i} 0 1\r\nb\r\nEND\r\n"), "round {round}");
        }
    }
    let stats = c.call_str("stats\r\n").unwrap();
    assert_eq!(common::stat(&stats, "get_misses"), 0, "{stats}");
    assert!(common::stat(&stats, "replica_write_failures") >= 30, "{stats}");
    common::stop(proxy);
}

#[test]
fn over_the_file_limit_clients_are_refused_and_servers_stay_reachable() {
    let mut server = Memcached::start().unwrap();
    // 4 workers x 1 server, the health checker's connection and 2 (or 2
    // loops x 1 server, the checker's and 2 x 2) + 64 descriptors are kept:
    // 29 clients fit in 100.
    let proxy = common::ProxyProcess::start("ulimit -n 100;", &["-m", &server.endpoint(), "-t", "4"]);
    assert!(
        common::eventually(common::PATIENCE, || proxy.log().contains("does not fit")),
        "the start-up says the limit is too low: {}",
        proxy.log()
    );
    let mut clients: Vec<Client> = Vec::new();
    let mut refused = 0;
    for _ in 0..60 {
        let mut c = Client::connect(proxy.addr()).unwrap();
        let reply = c.call_str("version\r\n").expect("an answer, not a hang");
        if reply.starts_with("VERSION") {
            clients.push(c);
        } else {
            assert_eq!(reply, "SERVER_ERROR Too many open connections\r\n");
            refused += 1;
        }
    }
    assert_eq!(clients.len(), 29, "as many clients as fit are served");
    assert_eq!(refused, 31, "the others are refused, not left hanging");
    // With every client slot taken, a restarted server is reconnected.
    server.restart().unwrap();
    assert!(common::eventually(common::PATIENCE, || {
        clients[0].call_str("set x 0 0 1\r\nx\r\n").is_ok_and(|r| r == "STORED\r\n")
    }));
    // A soft limit below the hard one is raised at start.
    let raised = common::ProxyProcess::start("ulimit -Sn 100; ulimit -Hn 4096;", &["-m", &server.endpoint()]);
    let mut c = Client::connect(raised.addr()).unwrap();
    let max = common::stat(&c.call_str("stats\r\n").unwrap(), "max_connections");
    assert_eq!(max, 4096 - common::reserved_fds(8, 1) - 64, "{}", raised.log());
}

#[test]
fn a_server_streaming_a_huge_value_is_cut_off_at_the_value_limit() {
    // Announces a 2 GB value and streams it as fast as it can.
    let fake = common::FakeServer::start(|s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        while let Some(line) = common::read_request(&mut r) {
            if line.starts_with("get") {
                let _ = w.write_all(b"VALUE huge 0 2000000000\r\n");
                let chunk = vec![b'z'; 64 * 1024];
                while w.write_all(&chunk).is_ok() {}
                return;
            }
        }
    });
    let proxy = common::proxy_for(&[fake.endpoint()], |c| {
        c.backend.timeout_ms = 5000;
        c.backend.check_ms = 0; // the fake answers `get` only
    });
    let mut c = common::client(&proxy);
    let reply = c.call_str("get huge\r\n").unwrap();
    // Cut off by the value limit (this reply), not by the 5 s timeout (a `timeout` reply).
    assert_eq!(reply, format!("SERVER_ERROR backend {} reply too large\r\n", fake.endpoint()));
    common::stop(proxy);
}

#[test]
fn a_trickling_server_times_out_at_the_deadline() {
    // Sends a reply one byte every 50 ms: every read returns something, but
    // the reply never completes.
    let fake = common::FakeServer::start(|s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        if common::read_request(&mut r).is_some() {
            for b in b"VALUE k 0 100000\r\n".iter().cycle().take(10_000) {
                if w.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    });
    let proxy = common::proxy_for(&[fake.endpoint()], |c| {
        c.backend.timeout_ms = 400;
        c.backend.check_ms = 0; // a check would meet the trickle first and mark the server down
    });
    let mut c = common::client(&proxy);
    let t = Instant::now();
    let reply = c.call_str("get k\r\n").unwrap();
    let took = t.elapsed();
    assert_eq!(reply, format!("SERVER_ERROR backend {} timeout\r\n", fake.endpoint()));
    // Not before the deadline; and at it, not reset by every byte (which
    // would take the whole 500 s trickle).
    assert!(took >= Duration::from_millis(350) && took < Duration::from_secs(60), "{took:?}");
    common::stop(proxy);
}

#[test]
fn a_server_answering_garbage_is_logged_once_not_per_request() {
    let fake = common::FakeServer::start(|s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        while common::read_request(&mut r).is_some() {
            if w.write_all(b"\x17\x99garbage\r\n").is_err() {
                return;
            }
        }
    });
    let proxy = common::ProxyProcess::start(
        "",
        &["-m", &fake.endpoint(), "--retry-min-ms", "1", "--retry-max-ms", "2", "-t", "2"],
    );
    let mut c = Client::connect(proxy.addr()).unwrap();
    let mut errors = 0;
    for _ in 0..300 {
        let reply = c.call_str("get k\r\n").unwrap();
        errors += usize::from(reply.starts_with("SERVER_ERROR backend"));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(errors, 300);
    let log = proxy.log();
    assert!(log.contains("server down"), "{log}");
    assert!(log.lines().count() < 10, "failures of a down server are summed up, not logged one by one:\n{log}");
}

#[test]
fn ten_thousand_connections_are_held_with_bounded_memory() {
    mctest::raise_fd_limit(20_500);
    let server = Memcached::start().unwrap();
    let proxy = common::ProxyProcess::start("", &["-m", &server.endpoint(), "--max-connections", "10000"]);
    let mut good = Client::connect(proxy.addr()).unwrap();
    assert_eq!(good.call_str("set k 0 0 1\r\nv\r\n").unwrap(), "STORED\r\n");
    let before = proxy.rss_mb();
    let mut held = Vec::with_capacity(10_000);
    while held.len() < 9_999 {
        let mut c = TcpStream::connect(proxy.addr()).unwrap();
        // Every hundredth one has talked once, so it holds buffers.
        if held.len() % 100 == 0 {
            c.write_all(b"get k\r\n").unwrap();
        }
        held.push(c);
    }
    assert!(
        common::eventually(Duration::from_secs(30), || {
            common::stat(&good.call_str("stats\r\n").unwrap(), "curr_connections") == 10_000
        }),
        "every connection is accepted and counted"
    );
    let mut over = Client::connect(proxy.addr()).unwrap();
    // Refused and closed: read until it closes.
    let (reply, closed) = over.read_until_quiet(common::PATIENCE).unwrap();
    assert_eq!(String::from_utf8_lossy(&reply), "SERVER_ERROR Too many open connections\r\n");
    assert!(closed, "the refused connection is closed");
    assert_eq!(good.call_str("get k\r\n").unwrap(), "VALUE k 0 1\r\nv\r\nEND\r\n", "the others are still served");
    let rss = proxy.rss_mb();
    eprintln!("RSS {before:.1} MB before, {rss:.1} MB with 10,000 connections");
    assert!(rss < 100.0, "10,000 connections take {rss:.1} MB of RSS");
    assert!(rss - before < 40.0, "10,000 connections grew RSS by {:.1} MB", rss - before);
    drop(held);
    assert!(
        common::eventually(Duration::from_secs(30), || {
            common::stat(&good.call_str("stats\r\n").unwrap(), "curr_connections") == 1
        }),
        "closed connections are noticed"
    );
}

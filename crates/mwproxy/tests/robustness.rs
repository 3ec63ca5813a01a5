//! Pipelining, many clients, bad clients and failing servers: each gets the
//! answer a memcached user expects and the proxy keeps serving everybody else.

mod common;

use mwproxy::Service;
use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcproto::ring::{HashKind, Ring, ServerSpec};
use mctest::Client;

/// A tiny model of memcached for the pipelining test.
#[derive(Default)]
struct Model {
    items: HashMap<String, String>,
}

impl Model {
    fn apply(&mut self, i: usize, req: &mut Vec<u8>) -> String {
        let key = format!("p{}", i % 37);
        match i % 5 {
            0 => {
                let v = format!("v{i}");
                req.extend_from_slice(format!("set {key} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
                self.items.insert(key, v);
                "STORED\r\n".into()
            }
            1 | 4 => {
                req.extend_from_slice(format!("get {key}\r\n").as_bytes());
                match self.items.get(&key) {
                    Some(v) => format!("VALUE {key} 0 {}\r\n{v}\r\nEND\r\n", v.len()),
                    None => "END\r\n".into(),
                }
            }
            2 => {
                req.extend_from_slice(format!("delete {key}\r\n").as_bytes());
                if self.items.remove(&key).is_some() { "DELETED\r\n" } else { "NOT_FOUND\r\n" }.into()
            }
            _ => {
                req.extend_from_slice(b"incr counter 1\r\n");
                let n: u64 = self.items.get("counter").map(|v| v.parse().unwrap()).unwrap_or(0) + 1;
                self.items.insert("counter".into(), n.to_string());
                format!("{n}\r\n")
            }
        }
    }
}

#[test]
fn a_thousand_pipelined_requests_come_back_complete_and_in_order() {
    let servers = common::servers(3);
    let proxy = common::proxy(&servers, |c| c.proxy.workers = 4);
    let mut c = common::client(&proxy);
    assert_eq!(c.call_str("set counter 0 0 1\r\n0\r\n").unwrap(), "STORED\r\n");
    let mut model = Model::default();
    model.items.insert("counter".into(), "0".into());
    let mut req = Vec::new();
    let mut expected = Vec::new();
    for i in 0..1000 {
        expected.push(model.apply(i, &mut req));
    }
    c.send(&req).unwrap();
    for (i, e) in expected.iter().enumerate() {
        let got = String::from_utf8(c.read_reply().unwrap()).unwrap();
        assert_eq!(&got, e, "reply {i}");
    }
    common::stop(proxy);
}

#[test]
fn five_hundred_concurrent_clients_all_succeed() {
    let servers = common::servers(3);
    let proxy = common::proxy(&servers, |c| {
        c.routing.replication = 2;
        // 500 client threads on a small machine can keep one memcached off
        // the CPU for longer than the 50 ms stall rule (which then answers
        // its waiting requests with an error, as it should); this test is
        // about concurrency, the stall rule has tests of its own: off here.
        c.backend.stall_ms = 0;
    });
    let addr = proxy.local_addr();
    let failures = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..500)
        .map(|t| {
            let failures = failures.clone();
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    let mut c = Client::connect(addr).unwrap();
                    for i in 0..100 {
                        let key = format!("c{t}k{}", i % 10);
                        let v = format!("{t}-{i}");
                        let set = c.call_str(&format!("set {key} 0 0 {}\r\n{v}\r\n", v.len())).unwrap();
                        let get = c.call_str(&format!("get {key}\r\n")).unwrap();
                        let ok = set == "STORED\r\n" && get == format!("VALUE {key} 0 {}\r\n{v}\r\nEND\r\n", v.len());
                        if !ok {
                            eprintln!("client {t} request {i}: {set:?} then {get:?}");
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
                .unwrap()
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(failures.load(Ordering::Relaxed), 0);
    let stats = common::client(&proxy).call_str("stats\r\n").unwrap();
    assert!(stats.contains("STAT total_connections 501\r\n"), "{stats}");
    common::stop(proxy);
}

#[test]
fn garbage_and_vanishing_clients_do_not_hurt_others() {
    let servers = common::servers(2);
    let proxy = common::proxy(&servers, |_| {});
    let addr = proxy.local_addr();
    let mut good = common::client(&proxy);
    // Clients that send random bytes, or half a request, then vanish.
    let mut seed: u64 = 0x9e3779b97f4a7c15;
    for round in 0..40 {
        let mut s = TcpStream::connect(addr).unwrap();
        let len = 10 + (round * 97) % 3000;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect();
        let _ = s.write_all(&bytes);
        if round % 3 == 0 {
            let _ = s.write_all(b"set half 0 0 100\r\nonly a little");
        }
        if round % 4 == 0 {
            let _ = s.write_all(b"get a b c\r\n");
        }
        drop(s);
        let v = format!("r{round}");
        assert_eq!(good.call_str(&format!("set good 0 0 {}\r\n{v}\r\n", v.len())).unwrap(), "STORED\r\n");
        assert_eq!(good.call_str("get good\r\n").unwrap(), format!("VALUE good 0 {}\r\n{v}\r\nEND\r\n", v.len()));
    }
    assert!(
        common::eventually(common::PATIENCE, || {
            good.call_str("stats\r\n").unwrap().contains("STAT curr_connections 1\r\n")
        }),
        "vanished clients are cleaned up"
    );
    common::stop(proxy);
}

#[test]
fn a_client_that_closes_right_after_half_a_line_is_cleaned_up() {
    // The bytes and the end of the stream often reach the proxy together, in
    // one readiness edge; the proxy must still notice the end.
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |_| {});
    let mut good = common::client(&proxy);
    // Connected and served first, so that the half line and the end of the
    // stream reach an established connection.
    let mut clients: Vec<_> = (0..100).map(|_| common::client(&proxy)).collect();
    for c in &mut clients {
        assert!(c.call_str("version\r\n").unwrap().starts_with("VERSION "));
    }
    for (round, c) in clients.iter_mut().enumerate() {
        c.send(&b"get half-a-li"[..3 + round % 10]).unwrap();
        c.shutdown_write().unwrap();
    }
    assert!(
        common::eventually(common::PATIENCE, || {
            good.call_str("stats\r\n").unwrap().contains("STAT curr_connections 1\r\n")
        }),
        "every half-line client is cleaned up: {}",
        good.call_str("stats\r\n").unwrap()
    );
    common::stop(proxy);
}

#[test]
fn a_killed_server_fails_only_its_keys_and_rejoins_by_itself() {
    let mut servers = common::servers(3);
    let proxy = common::proxy(&servers, |c| c.proxy.workers = 4);
    let ports: Vec<u16> = servers.iter().map(|s| s.port()).collect();
    let specs: Vec<ServerSpec> = ports.iter().map(|p| format!("127.0.0.1:{p}").parse().unwrap()).collect();
    let ring = Ring::new(HashKind::Ketama, &specs);
    let keys: Vec<String> = (0..60).map(|i| format!("kill{i}")).collect();
    let mut c = common::client(&proxy);
    for k in &keys {
        assert_eq!(c.call_str(&format!("set {k} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    // Load from several clients while server 2 dies.
    let stop = Arc::new(AtomicBool::new(false));
    let bad_other = Arc::new(AtomicU64::new(0));
    let addr = proxy.local_addr();
    let loaders: Vec<_> = (0..4)
        .map(|t| {
            let (stop, bad_other, keys, ring) = (stop.clone(), bad_other.clone(), keys.clone(), ring.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                let mut i = t;
                let deadline = Instant::now() + Duration::from_secs(20);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let k = &keys[i % keys.len()];
                    let reply = c.call_str(&format!("get {k}\r\n")).unwrap();
                    if ring.server_for(k.as_bytes()) != 2 && reply != format!("VALUE {k} 0 1\r\nx\r\nEND\r\n") {
                        bad_other.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    servers[2].stop();
    let dead_key = keys.iter().find(|k| ring.server_for(k.as_bytes()) == 2).unwrap();
    let reply = c.call_str(&format!("get {dead_key}\r\n")).unwrap();
    assert!(reply.starts_with(&format!("SERVER_ERROR backend 127.0.0.1:{}", ports[2])), "{reply}");
    std::thread::sleep(Duration::from_millis(300));
    servers[2].restart().unwrap();
    assert!(
        common::eventually(common::PATIENCE, || {
            c.call_str(&format!("set {dead_key} 0 0 1\r\ny\r\n")).unwrap() == "STORED\r\n"
        }),
        "server 2 rejoins"
    );
    assert_eq!(c.call_str(&format!("get {dead_key}\r\n")).unwrap(), format!("VALUE {dead_key} 0 1\r\ny\r\nEND\r\n"));
    stop.store(true, Ordering::Relaxed);
    for l in loaders {
        l.join().unwrap();
    }
    assert_eq!(bad_other.load(Ordering::Relaxed), 0, "keys of live servers were always served");
    common::stop(proxy);
}

#[test]
fn a_stalled_server_times_out_without_holding_up_other_keys() {
    let servers = common::servers(2);
    let proxy = common::proxy(&servers, |c| {
        c.backend.timeout_ms = 3000;
        c.proxy.workers = 4;
    });
    let ports: Vec<u16> = servers.iter().map(|s| s.port()).collect();
    let specs: Vec<ServerSpec> = ports.iter().map(|p| format!("127.0.0.1:{p}").parse().unwrap()).collect();
    let ring = Ring::new(HashKind::Ketama, &specs);
    let key_on = |s: usize| (0..).map(|i| format!("stall{i}")).find(|k| ring.server_for(k.as_bytes()) == s).unwrap();
    let (stalled_key, healthy_key) = (key_on(0), key_on(1));
    let mut c = common::client(&proxy);
    for k in [&stalled_key, &healthy_key] {
        assert_eq!(c.call_str(&format!("set {k} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    servers[0].pause().unwrap();
    let addr = proxy.local_addr();
    let stalled_key2 = stalled_key.clone();
    let waiting = std::thread::spawn(move || {
        let mut c = Client::connect(addr).unwrap();
        let t = Instant::now();
        let reply = c.call_str(&format!("get {stalled_key2}\r\n")).unwrap();
        (reply, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..20 {
        assert_eq!(
            c.call_str(&format!("get {healthy_key}\r\n")).unwrap(),
            format!("VALUE {healthy_key} 0 1\r\nx\r\nEND\r\n")
        );
    }
    // All 20 served while the stalled server's request still waits for its 3 s timeout.
    assert!(!waiting.is_finished(), "healthy keys were served while the other server stalls");
    let (reply, waited) = waiting.join().unwrap();
    assert!(reply.starts_with(&format!("SERVER_ERROR backend 127.0.0.1:{} timeout", ports[0])), "{reply}");
    assert!(waited >= Duration::from_millis(2900), "answered after the timeout, not before ({waited:?})");
    servers[0].resume().unwrap();
    assert!(
        common::eventually(common::PATIENCE, || {
            c.call_str(&format!("get {stalled_key}\r\n")).unwrap() == format!("VALUE {stalled_key} 0 1\r\nx\r\nEND\r\n")
        }),
        "the server is used again once it answers"
    );
    common::stop(proxy);
}

#[test]
fn connections_over_the_limit_are_refused_politely() {
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |c| c.proxy.max_connections = 3);
    let mut held: Vec<Client> = (0..3).map(|_| common::client(&proxy)).collect();
    for c in &mut held {
        assert_eq!(c.call_str("get x\r\n").unwrap(), "END\r\n");
    }
    let (reply, closed) = common::exchange_until_closed(proxy.local_addr(), b"get x\r\n");
    assert_eq!(String::from_utf8_lossy(&reply), "SERVER_ERROR Too many open connections\r\n");
    assert!(closed);
    drop(held.pop());
    assert!(common::eventually(common::PATIENCE, || {
        Client::connect(proxy.local_addr()).and_then(|mut c| c.call_str("get x\r\n")).is_ok_and(|r| r == "END\r\n")
    }));
    common::stop(proxy);
}

#[test]
fn a_full_queue_applies_backpressure_and_loses_nothing() {
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |c| {
        c.proxy.workers = 1;
        c.proxy.queue_capacity = 1;
    });
    let addr = proxy.local_addr();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                let mut req = Vec::new();
                for i in 0..200 {
                    req.extend_from_slice(format!("set bp{t}-{i} 0 0 1\r\n{}\r\n", i % 10).as_bytes());
                }
                c.send(&req).unwrap();
                c.read_replies(200).unwrap().iter().all(|r| r == b"STORED\r\n")
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap());
    }
    // Counters are exact per connection; another connection's last replies
    // may be recorded a moment after they were written.
    let mut stats = String::new();
    let counted = common::eventually(common::PATIENCE, || {
        stats = common::client(&proxy).call_str("stats\r\n").unwrap();
        stats.contains("STAT cmd_set 1600\r\n")
    });
    let full: u64 = stats.lines().find_map(|l| l.strip_prefix("STAT queue_full ")).unwrap().parse().unwrap();
    if common::engine() == mwproxy::config::Engine::Pool {
        assert!(full > 0, "the queue filled up at least once");
    } else {
        assert_eq!(full, 0, "the async engine has no queue between threads");
    }
    assert!(counted, "{stats}");
    common::stop(proxy);
}

#[test]
fn a_client_that_never_reads_only_stalls_itself() {
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |c| c.proxy.max_pending_output = 64 * 1024);
    let mut c = common::client(&proxy);
    let big = "b".repeat(100_000);
    assert_eq!(c.call_str(&format!("set big 0 0 {}\r\n{big}\r\n", big.len())).unwrap(), "STORED\r\n");
    // A client floods gets for a large value and never reads.
    let mut flood = TcpStream::connect(proxy.local_addr()).unwrap();
    flood.set_write_timeout(Some(Duration::from_millis(500))).unwrap();
    let req = "get big\r\n".repeat(1000);
    let _ = flood.write_all(req.as_bytes());
    for _ in 0..20 {
        assert_eq!(c.call_str("get nothing\r\n").unwrap(), "END\r\n");
    }
    drop(flood);
    common::stop(proxy);
}

#[test]
fn stats_count_what_clients_did() {
    let servers = common::servers(2);
    let proxy = common::proxy(&servers, |c| c.routing.replication = 2);
    let mut c = common::client(&proxy);
    for i in 0..10 {
        c.call_str(&format!("set s{i} 0 0 1\r\nx\r\n")).unwrap();
    }
    c.call_str("get s0 s1 s2 nope\r\n").unwrap();
    c.call_str("get nope\r\n").unwrap();
    c.call_str("delete s0\r\n").unwrap();
    c.call_str("delete s0\r\n").unwrap();
    c.call_str("bogus\r\n").unwrap();
    let s = c.call_str("stats\r\n").unwrap();
    assert_eq!(common::stat(&s, "cmd_set"), 10);
    assert_eq!(common::stat(&s, "cmd_get"), 5);
    assert_eq!(common::stat(&s, "get_hits"), 3);
    assert_eq!(common::stat(&s, "get_misses"), 2);
    assert_eq!(common::stat(&s, "delete_hits"), 1);
    assert_eq!(common::stat(&s, "delete_misses"), 1);
    assert_eq!(common::stat(&s, "protocol_errors"), 1);
    assert_eq!(common::stat(&s, "curr_connections"), 1);
    assert_eq!(common::stat(&s, "replication"), 2);
    let b = c.call_str("stats backends\r\n").unwrap();
    // Every set and delete reaches both servers, the gets at most both, and
    // `stats` asks both servers for their figures.
    let sent = common::stat(&b, "backend:0:requests") + common::stat(&b, "backend:1:requests");
    assert!((26..=30).contains(&sent), "{b}");
    assert!(b.contains("STAT backend:0:status up\r\n"));
    let settings = c.call_str("stats settings\r\n").unwrap();
    assert!(settings.contains("STAT replication 2\r\n"), "{settings}");
    // A list is one line (it was cut to `STAT servers [`).
    let servers = settings.lines().find(|l| l.starts_with("STAT servers ")).unwrap();
    assert!(servers.starts_with("STAT servers [") && servers.ends_with(']'), "{settings}");
    assert_eq!(c.call_str("stats reset\r\n").unwrap(), "RESET\r\n");
    assert_eq!(common::stat(&c.call_str("stats\r\n").unwrap(), "cmd_set"), 0);
    common::stop(proxy);
}

#[test]
fn several_net_threads_share_the_clients() {
    let servers = common::servers(2);
    // (The backend's deadline is a hang guard here, not the 500 ms of the
    // other tests: 30 clients on a loaded 2-core machine once waited longer
    // than that for a server, and the proxy rightly answered SERVER_ERROR.)
    let proxy = common::proxy(&servers, |c| {
        c.proxy.net_threads = 3;
        c.backend.timeout_ms = 30_000;
    });
    let addr = proxy.local_addr();
    let threads: Vec<_> = (0..30)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                for i in 0..50 {
                    let v = format!("{t}.{i}");
                    let set = c.call_str(&format!("set nt{t} 0 0 {}\r\n{v}\r\n", v.len())).unwrap();
                    if set != "STORED\r\n" {
                        return Err(format!("client {t}, set {i}: {set:?}"));
                    }
                    let got = c.call_str(&format!("get nt{t}\r\n")).unwrap();
                    if got != format!("VALUE nt{t} 0 {}\r\n{v}\r\nEND\r\n", v.len()) {
                        return Err(format!("client {t}, get {i}: {got:?}"));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap().unwrap();
    }
    common::stop(proxy);
}

//! Key placement, replication and multi-gets, checked by asking the memcached
//! servers directly which keys they hold.

mod common;

use std::time::Duration;

use mcproto::ring::{HashKind, Ring, ServerSpec};
use mctest::Client;
use mwproxy::config::{MultigetMode, ReadPolicy};

fn specs(ports: &[u16], weights: &[u32]) -> Vec<ServerSpec> {
    ports.iter().zip(weights).map(|(p, w)| format!("127.0.0.1:{p}:{w}").parse().unwrap()).collect()
}

#[test]
fn ketama_spreads_keys_evenly_and_a_new_server_takes_a_quarter() {
    let three = Ring::new(HashKind::Ketama, &specs(&[11211, 11212, 11213], &[1, 1, 1]));
    let four = Ring::new(HashKind::Ketama, &specs(&[11211, 11212, 11213, 11214], &[1, 1, 1, 1]));
    let n = 100_000;
    let mut counts = [0usize; 3];
    let mut moved = 0;
    for i in 0..n {
        let key = format!("key:{i}");
        let before = three.server_for(key.as_bytes());
        let after = four.server_for(key.as_bytes());
        counts[before] += 1;
        if before != after {
            moved += 1;
            assert_eq!(after, 3, "{key} moved between two old servers ({before} -> {after})");
        }
    }
    let even = n / 3;
    for c in counts {
        assert!(c.abs_diff(even) <= even / 10, "counts {counts:?} not within 10% of {even}");
    }
    let share = moved as f64 / n as f64;
    assert!((0.18..=0.32).contains(&share), "{share} of the keys moved, expected about a quarter");
}

/// Keys stored through twemproxy (ketama, md5, weights 1:2:1) land exactly
/// where mwproxy's ring puts them.
#[test]
fn ketama_places_keys_exactly_like_twemproxy() {
    let servers = common::servers(3);
    let weights = [1, 2, 1];
    let entries: Vec<String> = servers.iter().zip(weights).map(|(s, w)| format!("{}:{w}", s.endpoint())).collect();
    let twem = common::twemproxy_with(&entries);
    let addr = twem.addr;
    let mut c = Client::connect(addr).unwrap();
    let keys: Vec<String> = (0..300).map(|i| format!("user:{i}:profile")).collect();
    for k in &keys {
        assert_eq!(c.call_str(&format!("set {k} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    let ring = Ring::new(HashKind::Ketama, &specs(&servers.iter().map(|s| s.port()).collect::<Vec<_>>(), &weights));
    let mut per_server = [0; 3];
    for k in &keys {
        let held = common::holders(&servers, k);
        assert_eq!(held, vec![ring.server_for(k.as_bytes())], "key {k}");
        per_server[held[0]] += 1;
    }
    assert!(per_server[1] > per_server[0] && per_server[1] > per_server[2], "weight 2 holds most: {per_server:?}");
}

#[test]
fn writes_reach_exactly_r_replicas_and_reads_survive_a_dead_replica() {
    let mut servers = common::servers(3);
    for policy in [ReadPolicy::RoundRobin, ReadPolicy::Primary] {
        let proxy = common::proxy(&servers, |c| {
            c.routing.replication = 2;
            c.routing.read_policy = policy;
        });
        let ring =
            Ring::new(HashKind::Ketama, &specs(&servers.iter().map(|s| s.port()).collect::<Vec<_>>(), &[1, 1, 1]));
        let mut c = common::client(&proxy);
        let keys: Vec<String> = (0..60).map(|i| format!("{policy:?}-{i}")).collect();
        for k in &keys {
            assert_eq!(c.call_str(&format!("set {k} 0 0 2\r\nok\r\n")).unwrap(), "STORED\r\n");
            let mut expected = ring.replicas(k.as_bytes(), 2);
            expected.sort();
            assert_eq!(common::holders(&servers, k), expected, "{k} on exactly its two replicas");
        }
        servers[1].stop();
        for k in &keys {
            let reply = c.call_str(&format!("get {k}\r\n")).unwrap();
            assert_eq!(reply, format!("VALUE {k} 0 2\r\nok\r\nEND\r\n"), "read of {k} with server 1 dead");
        }
        // A write that cannot reach every replica is not acknowledged.
        let k = keys.iter().find(|k| ring.replicas(k.as_bytes(), 2).contains(&1)).unwrap();
        let reply = c.call_str(&format!("set {k} 0 0 1\r\nz\r\n")).unwrap();
        assert!(reply.starts_with("SERVER_ERROR backend"), "{reply}");
        servers[1].restart().unwrap();
        common::stop(proxy);
    }
}

fn multiget(servers: &[mctest::Memcached], replication: usize, mode: MultigetMode) -> Vec<u64> {
    let proxy = common::proxy(servers, |c| {
        c.routing.replication = replication;
        c.routing.multiget = mode;
        c.proxy.workers = 1;
    });
    let mut c = common::client(&proxy);
    c.call_str("flush_all\r\n").unwrap();
    let keys: Vec<String> = (0..10).map(|i| format!("mg{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("value-{i}");
        assert_eq!(c.call_str(&format!("set {k} {i} 0 {}\r\n{v}\r\n", v.len())).unwrap(), "STORED\r\n");
    }
    let before = backend_requests(&mut c, servers.len());
    let order = [7, 2, 9, 0, 5, 3, 8, 1, 6, 4];
    let mut req = String::from("get");
    let mut expected = String::new();
    for &i in &order {
        req.push_str(&format!(" {}", keys[i]));
        if i == 5 {
            req.push_str(" missing");
        }
        expected.push_str(&format!("VALUE {} {i} 7\r\nvalue-{i}\r\n", keys[i]));
    }
    req.push_str("\r\n");
    expected.push_str("END\r\n");
    assert_eq!(c.call_str(&req).unwrap(), expected, "R={replication} {mode:?}");
    let after = backend_requests(&mut c, servers.len());
    common::stop(proxy);
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

fn backend_requests(c: &mut Client, n: usize) -> Vec<u64> {
    let stats = c.call_str("stats backends\r\n").unwrap();
    (0..n).map(|i| common::stat(&stats, &format!("backend:{i}:requests"))).collect()
}

#[test]
fn multigets_come_back_in_request_order() {
    let servers = common::servers(3);
    // R = 1: keys are split by owner; 10 keys over 3 servers reach several of them.
    let sent = multiget(&servers, 1, MultigetMode::Sharded);
    assert!(sent.iter().filter(|&&n| n > 0).count() >= 2, "split over servers: {sent:?}");
    assert!(sent.iter().all(|&n| n <= 1), "one request per server: {sent:?}");
    // R = N, sharded: split evenly over all servers.
    let sent = multiget(&servers, 3, MultigetMode::Sharded);
    assert_eq!(sent, vec![1, 1, 1], "sharded multi-get reaches every server once");
    // R = N, non-sharded: the whole multi-get goes to one server.
    let sent = multiget(&servers, 3, MultigetMode::NonSharded);
    assert_eq!(sent.iter().sum::<u64>(), 1, "non-sharded multi-get is one request: {sent:?}");
}

#[test]
fn multiget_returns_healthy_shards_or_fails_on_request() {
    let mut servers = common::servers(3);
    let ports: Vec<u16> = servers.iter().map(|s| s.port()).collect();
    let ring = Ring::new(HashKind::Ketama, &specs(&ports, &[1, 1, 1]));
    // Twelve keys, at least one of them on server 0 and one elsewhere (the
    // ring depends on the servers' free ports).
    let mut keys: Vec<String> = (0..12).map(|i| format!("shard{i}")).collect();
    let mut extra = 12;
    while keys.iter().all(|k| ring.server_for(k.as_bytes()) != 0)
        || keys.iter().all(|k| ring.server_for(k.as_bytes()) == 0)
    {
        keys.remove(0);
        keys.push(format!("shard{extra}"));
        extra += 1;
    }
    let req = format!("get {}\r\n", keys.join(" "));
    {
        let proxy = common::proxy(&servers, |_| {});
        let mut c = common::client(&proxy);
        for k in &keys {
            c.call_str(&format!("set {k} 0 0 1\r\nv\r\n")).unwrap();
        }
        common::stop(proxy);
    }
    servers[0].stop();
    let alive: Vec<&String> = keys.iter().filter(|k| ring.server_for(k.as_bytes()) != 0).collect();
    assert!(!alive.is_empty() && alive.len() < keys.len());
    let proxy = common::proxy(&servers, |_| {});
    let mut c = common::client(&proxy);
    let reply = c.call_str(&req).unwrap();
    let expected: String = alive.iter().map(|k| format!("VALUE {k} 0 1\r\nv\r\n")).collect::<String>() + "END\r\n";
    assert_eq!(reply, expected);
    let stats = c.call_str("stats\r\n").unwrap();
    assert!(stats.contains("STAT multiget_partial 1\r\n"), "{stats}");
    common::stop(proxy);
    let proxy = common::proxy(&servers, |c| c.routing.multiget_failure = mwproxy::config::MultigetFailure::Fail);
    let reply = common::client(&proxy).call_str(&req).unwrap();
    assert!(reply.starts_with(&format!("SERVER_ERROR backend {}", servers[0].endpoint())), "{reply}");
    common::stop(proxy);
}

#[test]
fn gat_under_replication_touches_every_replica() {
    let servers = common::servers(3);
    let proxy = common::proxy(&servers, |c| {
        c.routing.replication = 2;
        c.routing.read_policy = ReadPolicy::Primary;
    });
    let mut c = common::client(&proxy);
    let keys: Vec<String> = (0..6).map(|i| format!("ttl{i}")).collect();
    for k in &keys {
        assert_eq!(c.call_str(&format!("set {k} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    // New expiry of 1 s for all of them, through one multi-key gat.
    let reply = c.call_str(&format!("gat 1 {}\r\n", keys.join(" "))).unwrap();
    assert_eq!(reply.matches("VALUE ").count(), keys.len());
    std::thread::sleep(Duration::from_millis(2600));
    for k in &keys {
        assert_eq!(common::holders(&servers, k), Vec::<usize>::new(), "{k} expired on every replica");
    }
    common::stop(proxy);
}

#[test]
fn meta_commands_follow_their_keys_and_replicas() {
    let mut servers = common::servers(3);
    let proxy = common::proxy(&servers, |c| c.routing.replication = 2);
    let ring = Ring::new(HashKind::Ketama, &specs(&servers.iter().map(|s| s.port()).collect::<Vec<_>>(), &[1, 1, 1]));
    let mut c = common::client(&proxy);
    let keys: Vec<String> = (0..30).map(|i| format!("meta-{i}")).collect();
    for k in &keys {
        assert_eq!(c.call_str(&format!("ms {k} 2 T0\r\nok\r\n")).unwrap(), "HD\r\n");
        let mut expected = ring.replicas(k.as_bytes(), 2);
        expected.sort();
        assert_eq!(common::holders(&servers, k), expected, "{k} on exactly its two replicas");
    }
    // A base64 key is placed by what it decodes to.
    assert_eq!(c.call_str("ms Zm9v 3 b\r\nbar\r\n").unwrap(), "HD\r\n");
    assert_eq!(c.call_str("mg foo v\r\n").unwrap(), "VA 3\r\nbar\r\n");
    // Quiet mode: a success says nothing, mn closes the batch, a failure speaks.
    c.send(b"ms foo 1 q\r\nx\r\nmd nokey q\r\nmg nokey v q\r\nmn\r\n").unwrap();
    assert_eq!(c.read_replies(2).unwrap(), [b"NF\r\n".to_vec(), b"MN\r\n".to_vec()]);
    // Reads survive a dead replica; writes that cannot reach every replica are refused.
    servers[1].stop();
    for k in &keys {
        assert_eq!(c.call_str(&format!("mg {k} v\r\n")).unwrap(), "VA 2\r\nok\r\n", "read of {k} with server 1 dead");
    }
    let k = keys.iter().find(|k| ring.replicas(k.as_bytes(), 2).contains(&1)).unwrap();
    let reply = c.call_str(&format!("ms {k} 1\r\nz\r\n")).unwrap();
    assert!(reply.starts_with("SERVER_ERROR backend"), "{reply}");
    // The connection stays in step: the next command gets its own answer.
    assert_eq!(c.call_str("mn\r\n").unwrap(), "MN\r\n");
    servers[1].restart().unwrap();
    common::stop(proxy);
}

#[test]
fn meta_commands_are_counted_in_stats() {
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |_| {});
    let mut c = common::client(&proxy);
    c.send(
        b"ms a 1\r\nx\r\nms b 1 q\r\ny\r\nmg a v\r\nmg nope v\r\nmg nope v q\r\nmd a\r\nmd b q\r\nmd nope\r\nmn\r\n",
    )
    .unwrap();
    let replies = c.read_replies(6).unwrap();
    assert_eq!(replies.last().unwrap(), b"MN\r\n", "{replies:?}");
    let stats = c.call_str("stats\r\n").unwrap();
    let stat = |name: &str| common::stat(&stats, name);
    assert_eq!(stat("cmd_set"), 2);
    assert_eq!((stat("cmd_get"), stat("get_hits"), stat("get_misses")), (3, 1, 2));
    assert_eq!((stat("delete_hits"), stat("delete_misses")), (2, 1), "md b q succeeds quietly");
    common::stop(proxy);
}

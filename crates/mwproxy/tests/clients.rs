//! mwproxy as real client libraries see it: the `memcache` crate's meta
//! protocol client runs the same scenarios against memcached directly and
//! through mwproxy in front of three servers with two replicas per key, where
//! reads rotate over the replicas — so a replica that disagrees shows.
//! Also: `version` and `stats` in the form clients parse (binary-protocol
//! clients: `binproto.rs`).

mod common;

use mwproxy::Service;
use std::net::SocketAddr;

use memcache::exp::{GetStatus, Meta, MetaClient, MutationStatus, Ttl};

fn key(name: &str, round: usize) -> String {
    format!("{name}-{round}-{}", std::process::id())
}

/// The scenarios; each asserts memcached's own semantics.
fn scenarios(addr: SocketAddr, round: usize) {
    let c = MetaClient::connect(addr.to_string()).expect("connect the meta client");
    c.noop().unwrap();

    // Compare-and-swap: one server decides, every read agrees afterwards.
    let k = key("cas", round);
    let cas = c.set(&*k, "one").return_cas().send().unwrap().cas.unwrap();
    assert!(c.set(&*k, "two").compare_cas(cas).send().unwrap().applied());
    assert_eq!(c.set(&*k, "three").compare_cas(cas).send().unwrap().status, MutationStatus::CasMismatch);
    for _ in 0..6 {
        assert_eq!(c.get(&*k).send().unwrap().value.as_deref(), Some(&b"two"[..]));
    }
    let current = c.get(&*k).meta(Meta::NONE.cas()).send().unwrap().item.cas.unwrap();
    for _ in 0..4 {
        let again = c.get(&*k).meta(Meta::NONE.cas()).send().unwrap().item.cas.unwrap();
        assert_eq!(again, current, "the cas token does not depend on the replica read");
    }

    // A lease: exactly one winner, then everybody reads the fill.
    let k = key("lease", round);
    let winner = c.get(&*k).lease_ttl(30).send().unwrap();
    assert_eq!(winner.status, GetStatus::Miss);
    assert!(winner.won_lease());
    for _ in 0..4 {
        assert!(!c.get(&*k).lease_ttl(30).send().unwrap().won_lease(), "one winner only");
    }
    assert!(c.set(&*k, "fresh").compare_cas(winner.item.cas.unwrap()).send().unwrap().applied());
    for _ in 0..6 {
        assert_eq!(c.get(&*k).send().unwrap().value.as_deref(), Some(&b"fresh"[..]));
    }

    // Invalidation: the stale value is served, one reader wins the refresh.
    let k = key("stale", round);
    c.set(&*k, "old").send().unwrap();
    assert!(c.delete(&*k).invalidate().send().unwrap().applied());
    let reads: Vec<_> = (0..6).map(|_| c.get(&*k).send().unwrap()).collect();
    assert_eq!(reads.iter().filter(|r| r.won_lease()).count(), 1, "{reads:?}");

    // A touch reaches every replica.
    let k = key("touch", round);
    c.set(&*k, "t").ttl(Ttl::secs(100)).send().unwrap();
    c.get(&*k).touch(Ttl::secs(5000)).send().unwrap();
    for _ in 0..6 {
        let ttl = c.get(&*k).meta(Meta::NONE.ttl()).send().unwrap().item.ttl.unwrap();
        assert!(ttl > 4000, "every replica has the new ttl, got {ttl}");
    }

    // Store modes, arithmetic, binary keys, debug.
    let k = key("modes", round);
    assert_eq!(c.set(&*k, "x").replace().send().unwrap().status, MutationStatus::NotFound);
    assert!(c.set(&*k, "mid").add().send().unwrap().applied());
    assert_eq!(c.set(&*k, "no").add().send().unwrap().status, MutationStatus::AlreadyExists);
    assert!(c.set(&*k, "]").append().send().unwrap().applied());
    assert!(c.set(&*k, "[").prepend().send().unwrap().applied());
    for _ in 0..4 {
        assert_eq!(c.get(&*k).send().unwrap().value.as_deref(), Some(&b"[mid]"[..]));
    }
    let k = key("count", round);
    assert_eq!(c.increment(&*k).send().unwrap().status, MutationStatus::NotFound);
    assert_eq!(c.increment(&*k).initial(10, 60).send().unwrap().value, Some(10));
    assert_eq!(c.increment(&*k).delta(5).send().unwrap().value, Some(15));
    assert_eq!(c.decrement(&*k).delta(20).send().unwrap().value, Some(0));
    let k = format!("{} with spaces\x01", key("binary", round));
    assert!(c.set(&*k, "b").send().unwrap().applied());
    assert_eq!(c.get(&*k).send().unwrap().value.as_deref(), Some(&b"b"[..]));
    assert!(c.delete(&*k).send().unwrap().applied());
    assert_eq!(c.delete(&*k).send().unwrap().status, MutationStatus::NotFound);
    let k = key("debug", round);
    assert!(c.debug(&*k).unwrap().is_none());
    c.set(&*k, "d").send().unwrap();
    assert!(c.debug(&*k).unwrap().unwrap().contains_key("exp"));
}

#[test]
fn the_meta_client_sees_memcached_through_replicated_mwproxy() {
    let direct = common::servers(1);
    scenarios(direct[0].addr(), 0);
    let servers = common::servers(3);
    let proxy = common::proxy(&servers, |c| c.routing.replication = 2);
    for round in 1..4 {
        scenarios(proxy.local_addr(), round);
    }
    let stats = common::client(&proxy).call_str("stats\r\n").unwrap();
    assert_eq!(common::stat(&stats, "replica_disagreements"), 0, "{stats}");
    common::stop(proxy);
}

#[test]
fn version_is_the_servers_in_memcacheds_form_and_stats_adds_theirs_up() {
    let servers = common::servers(2);
    let direct = common::client_of(&servers[0]).call_str("version\r\n").unwrap();
    let proxy = common::proxy(&servers, |_| {});
    let mut c = common::client(&proxy);
    assert_eq!(c.call_str("version\r\n").unwrap(), direct, "the servers' version, as memcached writes it");
    for i in 0..10 {
        c.call_str(&format!("set s{i} 0 0 5\r\nhello\r\n")).unwrap();
    }
    let stats = c.call_str("stats\r\n").unwrap();
    let version = direct.trim_end().strip_prefix("VERSION ").unwrap();
    assert!(stats.contains(&format!("STAT version {version}\r\n")), "{stats}");
    assert!(stats.contains(&format!("STAT mwproxy_version {}\r\n", env!("CARGO_PKG_VERSION"))), "{stats}");
    assert_eq!(common::stat(&stats, "curr_items"), 10);
    assert_eq!(common::stat(&stats, "total_items"), 10);
    assert_eq!(common::stat(&stats, "limit_maxbytes"), 2 * 64 * 1024 * 1024);
    assert!(common::stat(&stats, "bytes") > 10 * 5);
    assert!(common::stat(&stats, "connection_structures") >= 1);
    assert_eq!(common::stat(&stats, "servers"), 2);
    assert_eq!(common::stat(&stats, "servers_answering"), 2, "each server counted once");
    for name in ["pid", "uptime", "time", "pointer_size", "curr_connections", "total_connections", "cmd_get"] {
        common::stat(&stats, name);
    }
    assert!(stats.contains("STAT rusage_user "), "{stats}");
    // With one server down, the others still answer.
    drop(servers);
    let reply = c.call_str("version\r\n").unwrap();
    assert!(reply.starts_with("SERVER_ERROR backend"), "no server, no version: {reply}");
    common::stop(proxy);
}

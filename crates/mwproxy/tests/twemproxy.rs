//! mwproxy places keys where twemproxy does. For every hash function and
//! distribution twemproxy has, with and without a hash tag, with weights and
//! with named servers, keys are stored through a real twemproxy (nutcracker)
//! and read back through mwproxy configured alike: every one is found, with
//! its value, on the server twemproxy put it on.

mod common;

use common::{client, config, servers, stop, twemproxy_pool};
use mcproto::ring::{twemproxy_order, KeyHash};
use mctest::{Client, Memcached};
use mwproxy::config::HashKind;
use mwproxy::{Proxy, Service};

/// Keys of every kind a hash meets: plain, tagged (some sharing a tag),
/// with bytes above 0x7f (which several of twemproxy's hashes read as
/// signed), of lengths 1 to 3 past a multiple of 4 and 12 (the tails).
fn keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 5 {
            0 => format!("k{i}"),
            1 => format!("user:{{{}}}:field{i}", i % 17),
            2 => format!("ключ-{i}-é"),
            3 => format!("{}{i}", "x".repeat(i % 13)),
            _ => format!("a{{b{i}"),
        })
        .collect()
}

struct Case {
    distribution: &'static str,
    hash: KeyHash,
    tag: Option<&'static str>,
    named: bool,
}

/// Stores `keys` through twemproxy, reads them through mwproxy: how many come back with their value.
fn agreeing(servers: &[Memcached], case: &Case, keys: &[String]) -> usize {
    let weights = [1, 2, 1];
    let entries: Vec<String> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let name = if case.named { format!(" cache-{i}") } else { String::new() };
            format!("{}:{}{name}", s.endpoint(), weights[i])
        })
        .collect();
    let mut options = format!("hash: {}\n  distribution: {}", case.hash.name(), case.distribution);
    if let Some(tag) = case.tag {
        options.push_str(&format!("\n  hash_tag: \"{tag}\""));
    }
    for s in servers {
        Client::connect(s.addr()).unwrap().call_str("flush_all\r\n").unwrap();
    }
    let tw = twemproxy_pool(&options, &entries);
    let mut c = Client::connect(tw.addr).unwrap();
    let mut batch = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("v{i}");
        batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    c.send(&batch).unwrap();
    for r in c.read_replies(keys.len()).unwrap() {
        assert_eq!(r, b"STORED\r\n", "twemproxy stores");
    }
    drop(tw);
    let p: Proxy = Proxy::start(config(servers, |c| {
        c.routing.hash = match case.distribution {
            "modula" => HashKind::Modula,
            _ => HashKind::Ketama,
        };
        c.routing.key_hash = case.hash;
        c.routing.hash_tag = case.tag.unwrap_or("").to_string();
        for (i, s) in c.routing.servers.iter_mut().enumerate() {
            s.weight = weights[i];
            s.name = case.named.then(|| format!("cache-{i}"));
        }
        // twemproxy keeps a pool's servers sorted by name; mwproxy's TOML
        // keeps them as written (reading a nutcracker.yml sorts them).
        twemproxy_order(&mut c.routing.servers);
    }))
    .expect("start mwproxy");
    let mut m = client(&p);
    let mut asks = Vec::new();
    for k in keys {
        asks.extend_from_slice(format!("get {k}\r\n").as_bytes());
    }
    m.send(&asks).unwrap();
    let found = m
        .read_replies(keys.len())
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(i, r)| {
            let text = String::from_utf8_lossy(r);
            text.contains(&format!("\r\nv{i}\r\nEND"))
        })
        .count();
    stop(p);
    found
}

#[test]
fn every_key_is_where_twemproxy_put_it() {
    let servers = servers(3);
    // The second engine's run (make test runs every suite with each) checks
    // a corner of the matrix: placement is the routing core's, not the engine's.
    let full = common::engine() == mwproxy::config::Engine::Pool;
    let keys = keys(if full { 250 } else { 60 });
    let mut cases = Vec::new();
    for hash in KeyHash::ALL {
        for tag in [None, Some("{}")] {
            cases.push(Case { distribution: "ketama", hash, tag, named: false });
            cases.push(Case { distribution: "modula", hash, tag, named: false });
            cases.push(Case { distribution: "ketama", hash, tag, named: true });
        }
    }
    if !full {
        cases.retain(|c| matches!(c.hash, KeyHash::Fnv1a64 | KeyHash::Murmur | KeyHash::Md5));
    }
    let mut wrong = Vec::new();
    for case in &cases {
        let found = agreeing(&servers, case, &keys);
        if found != keys.len() {
            wrong.push(format!(
                "{} {} tag={:?} named={}: {found} of {}",
                case.hash,
                case.distribution,
                case.tag,
                case.named,
                keys.len()
            ));
        }
    }
    assert!(wrong.is_empty(), "keys not where twemproxy put them:\n{}", wrong.join("\n"));
}

#[test]
fn random_distribution_uses_every_server_as_twemproxy_does() {
    let servers = servers(3);
    let items = |s: &Memcached| {
        let stats = Client::connect(s.addr()).unwrap().call_str("stats\r\n").unwrap();
        common::stat(&stats, "curr_items")
    };
    let tw = twemproxy_pool(
        "hash: fnv1a_64\n  distribution: random",
        &servers.iter().map(|s| format!("{}:1", s.endpoint())).collect::<Vec<_>>(),
    );
    let mut c = Client::connect(tw.addr).unwrap();
    for i in 0..90 {
        assert_eq!(c.call_str(&format!("set r{i} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    drop(tw);
    assert!(servers.iter().all(|s| items(s) > 5), "twemproxy spreads them");
    for s in &servers {
        Client::connect(s.addr()).unwrap().call_str("flush_all\r\n").unwrap();
    }
    let p = Proxy::start(config(&servers, |c| c.routing.hash = HashKind::Random)).unwrap();
    let mut m = client(&p);
    for i in 0..90 {
        assert_eq!(m.call_str(&format!("set r{i} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    stop(p);
    assert!(servers.iter().all(|s| items(s) > 5), "and so does mwproxy");
}

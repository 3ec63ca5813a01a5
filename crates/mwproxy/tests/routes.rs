//! Route trees against real memcached pools: each handle sends keys where
//! it says, combines replies as it says, and keeps what the client does not
//! wait for (shadows, fills) off the client's way and within its bound.
//! Every pool here is one memcached, asked directly what it holds.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{eventually, route_config as config, route_start as start, PATIENCE};
use mcproto::ring::KeyHash;
use mctest::{Client, Memcached};
use mwproxy::routes::{Clock, RouteSpec};
use mwproxy::{Proxy, Service};

fn proxy(servers: &[&Memcached], names: &[&str], route: &str) -> Proxy {
    start(config(servers, names, route, |_| {}))
}

/// What `server` holds for `key` (its `get` reply).
fn held(server: &Memcached, key: &str) -> String {
    Client::connect(server.addr()).unwrap().call_str(&format!("get {key}\r\n")).unwrap()
}

fn has(server: &Memcached, key: &str) -> bool {
    held(server, key) != "END\r\n"
}

fn put(server: &Memcached, key: &str, value: &str) {
    let set = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    assert_eq!(Client::connect(server.addr()).unwrap().call_str(&set).unwrap(), "STORED\r\n");
}

fn set(c: &mut Client, key: &str, value: &str) -> String {
    c.call_str(&format!("set {key} 0 0 {}\r\n{value}\r\n", value.len())).unwrap()
}

fn value(key: &str, v: &str) -> String {
    format!("VALUE {key} 0 {}\r\n{v}\r\nEND\r\n", v.len())
}

/// `route:<path>:<name>` of `stats routes`.
fn route_stat(p: &Proxy, name: &str) -> u64 {
    let stats = common::client(p).call_str("stats routes\r\n").unwrap();
    common::stat(&stats, &format!("route:{name}"))
}

#[test]
fn prefixes_and_operations_send_each_request_kind_where_the_route_says() {
    let s = common::servers(3);
    let route = r#"
[route]
type = "prefix"
default = { type = "operation", get = "c", set = "c", delete = "a", default = "b" }
[route.routes]
"user:" = "a"
"user:vip:" = "b"
"#;
    let p = proxy(&[&s[0], &s[1], &s[2]], &["a", "b", "c"], route);
    let mut c = common::client(&p);
    assert_eq!(set(&mut c, "user:1", "one"), "STORED\r\n");
    assert_eq!(set(&mut c, "user:vip:1", "vip"), "STORED\r\n");
    assert_eq!(set(&mut c, "other", "x"), "STORED\r\n");
    assert!(has(&s[0], "user:1") && !has(&s[1], "user:1") && !has(&s[2], "user:1"));
    assert!(has(&s[1], "user:vip:1") && !has(&s[0], "user:vip:1"), "the longest prefix wins");
    assert!(has(&s[2], "other") && !has(&s[0], "other") && !has(&s[1], "other"));
    // By operation: delete goes to a (where "other" is not), incr to b (the default).
    assert_eq!(c.call_str("delete other\r\n").unwrap(), "NOT_FOUND\r\n");
    assert!(has(&s[2], "other"));
    put(&s[1], "other", "41");
    assert_eq!(c.call_str("incr other 1\r\n").unwrap(), "42\r\n");
    // A multi-get is split by route and merged in the client's order.
    assert_eq!(
        c.call_str("get user:vip:1 other user:1 missing user:vip:1\r\n").unwrap(),
        "VALUE user:vip:1 0 3\r\nvip\r\nVALUE other 0 1\r\nx\r\nVALUE user:1 0 3\r\none\r\nVALUE user:vip:1 0 3\r\nvip\r\nEND\r\n"
    );
    // Meta commands and binary frames take the same routes.
    assert_eq!(c.call_str("ms user:vip:m 2\r\nhi\r\n").unwrap(), "HD\r\n");
    assert!(has(&s[1], "user:vip:m") && !has(&s[0], "user:vip:m"));
    assert_eq!(c.call_str("mg user:vip:m v\r\n").unwrap(), "VA 2\r\nhi\r\n");
    let mut frame = Vec::new();
    mcproto::binary::encode_request(&mut frame, mcproto::binary::op::SET, 7, 0, &[0; 8], b"user:bin", b"b");
    let mut raw = std::net::TcpStream::connect(p.local_addr()).unwrap();
    raw.write_all(&frame).unwrap();
    let mut header = [0u8; 24];
    raw.read_exact(&mut header).unwrap();
    assert_eq!(&header[6..8], &[0, 0], "binary set answered success");
    assert!(has(&s[0], "user:bin") && !has(&s[2], "user:bin"));
    assert_eq!(route_stat(&p, "route.routes.\"user:\":requests"), 3, "set, get (in the multi-get), binary set");
    common::stop(p);
    // Without a default, a key no prefix matches is an error, not a guess.
    let p = proxy(&[&s[0]], &["a"], "[route]\ntype = \"prefix\"\nroutes = { \"a:\" = \"a\" }\n");
    assert_eq!(set(&mut common::client(&p), "b:1", "x"), "SERVER_ERROR no route for this key\r\n");
    common::stop(p);
}

#[test]
fn failover_takes_the_next_child_while_a_server_is_down_and_comes_back() {
    let mut s = common::servers(2);
    let p = proxy(
        &[&s[0], &s[1]],
        &["first", "second"],
        "[route]\ntype = \"failover\"\nchildren = [\"first\", \"second\"]\n",
    );
    let mut c = common::client(&p);
    assert_eq!(set(&mut c, "k1", "a"), "STORED\r\n");
    assert!(has(&s[0], "k1") && !has(&s[1], "k1"));
    s[0].stop();
    assert_eq!(set(&mut c, "k2", "b"), "STORED\r\n", "the second pool takes it");
    assert!(has(&s[1], "k2"));
    assert_eq!(c.call_str("get k2\r\n").unwrap(), value("k2", "b"));
    assert!(route_stat(&p, "route:failovers") >= 2);
    s[0].restart().unwrap();
    assert!(
        eventually(PATIENCE, || set(&mut c, "k3", "c") == "STORED\r\n" && has(&s[0], "k3")),
        "the first pool serves again once it is back"
    );
    // A frozen first pool is given up (stalled, then timed out) and failed over too.
    s[0].pause().unwrap();
    assert_eq!(set(&mut c, "k5", "e"), "STORED\r\n");
    assert!(has(&s[1], "k5"));
    s[0].resume().unwrap();
    // failover_on without connect: a dead first pool is the client's error.
    common::stop(p);
    s[0].stop();
    let route = "[route]\ntype = \"failover\"\nfailover_on = [\"timeout\"]\nchildren = [\"first\", \"second\"]\n";
    let p = proxy(&[&s[0], &s[1]], &["first", "second"], route);
    assert!(set(&mut common::client(&p), "k4", "d").starts_with("SERVER_ERROR"));
    common::stop(p);
}

#[test]
fn all_majority_answers_what_most_pools_hold_and_all_fastest_the_first_to_answer() {
    let s = common::servers(3);
    let names = ["a", "b", "c"];
    let all = [&s[0], &s[1], &s[2]];
    let p = proxy(&all, &names, "[route]\ntype = \"all-majority\"\nchildren = [\"a\", \"b\", \"c\"]\n");
    let mut c = common::client(&p);
    put(&s[0], "k", "old");
    put(&s[1], "k", "new");
    put(&s[2], "k", "new");
    assert_eq!(c.call_str("get k\r\n").unwrap(), value("k", "new"));
    put(&s[0], "lonely", "x");
    assert_eq!(c.call_str("get lonely\r\n").unwrap(), "END\r\n", "two of three miss");
    assert_eq!(c.call_str("gets k\r\n").unwrap().lines().nth(1), Some("new"), "cas uniques do not split the vote");
    // Nor a meta reply's cas, time to live, hit and last access, nor a
    // binary reply's cas: each server says its own (b and c hold the same
    // value under other cas uniques).
    put(&s[2], "bump", "1");
    put(&s[2], "k", "new");
    let meta = c.call_str("mg k v c t h l\r\n").unwrap();
    assert_eq!(meta.lines().nth(1), Some("new"), "{meta}");
    let mut frame = Vec::new();
    mcproto::binary::encode_request(&mut frame, mcproto::binary::op::GET, 9, 0, &[], b"k", b"");
    let mut raw = std::net::TcpStream::connect(p.local_addr()).unwrap();
    raw.write_all(&frame).unwrap();
    let mut header = [0u8; 24];
    raw.read_exact(&mut header).unwrap();
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let mut rest = vec![0u8; body];
    raw.read_exact(&mut rest).unwrap();
    assert_eq!(&header[6..8], &[0, 0], "binary get found the key");
    assert_eq!(&rest[usize::from(header[4])..], b"new", "binary get answers the majority");
    assert_eq!(set(&mut c, "w", "v"), "STORED\r\n");
    assert!(all.iter().all(|m| has(m, "w")), "a write reaches every child");
    assert!(!has(&s[1], "lonely") && !has(&s[2], "lonely"), "nothing is copied to the minority");
    common::stop(p);
    // all-fastest: a frozen child does not decide the reply.
    let p =
        start(config(&all[..2], &names[..2], "[route]\ntype = \"all-fastest\"\nchildren = [\"a\", \"b\"]\n", |c| {
            c.backend.stall_ms = 20;
        }));
    let mut c = common::client(&p);
    put(&s[0], "f", "from-a");
    put(&s[1], "f", "from-b");
    s[0].pause().unwrap();
    assert_eq!(c.call_str("get f\r\n").unwrap(), value("f", "from-b"));
    s[0].resume().unwrap();
    s[1].pause().unwrap();
    // (Once a is marked up again: it was given up while frozen.)
    assert!(eventually(PATIENCE, || c.call_str("get f\r\n").unwrap() == value("f", "from-a")));
    s[1].resume().unwrap();
    common::stop(p);
    if common::engine() == mwproxy::config::Engine::Pool {
        // (A pool worker reads every reply of a round: the frozen child is
        // waited for until it is given up, as above.)
        return;
    }
    // The async engine answers with the first success and gives the other
    // calls up: with stall detection off and a minute's timeout, a frozen
    // child would hold the reply past the client's 30 s patience.
    let p =
        start(config(&all[..2], &names[..2], "[route]\ntype = \"all-fastest\"\nchildren = [\"a\", \"b\"]\n", |c| {
            (c.backend.stall_ms, c.backend.timeout_ms, c.backend.check_ms) = (0, 60_000, 0);
        }));
    let mut c = common::client(&p);
    s[0].pause().unwrap();
    for _ in 0..3 {
        assert_eq!(c.call_str("get f\r\n").unwrap(), value("f", "from-b"));
    }
    s[0].resume().unwrap();
    for _ in 0..3 {
        let got = c.call_str("get f\r\n").unwrap();
        assert!(got == value("f", "from-a") || got == value("f", "from-b"), "{got:?}: the connections stay in step");
    }
    common::stop(p);
}

#[test]
fn warm_up_fills_the_cold_pool_on_a_miss_with_its_exptime() {
    let s = common::servers(2);
    let route = "[route]\ntype = \"warm-up\"\ncold = \"cold\"\nwarm = \"warm\"\nexptime = 100\n";
    let p = proxy(&[&s[0], &s[1]], &["cold", "warm"], route);
    let mut c = common::client(&p);
    let mut w = Client::connect(s[1].addr()).unwrap();
    assert_eq!(w.call_str("set k 7 0 3\r\nabc\r\n").unwrap(), "STORED\r\n");
    assert_eq!(c.call_str("get k\r\n").unwrap(), "VALUE k 7 3\r\nabc\r\nEND\r\n", "the warm pool answers the miss");
    assert!(eventually(PATIENCE, || has(&s[0], "k")), "the cold pool is filled");
    assert_eq!(held(&s[0], "k"), "VALUE k 7 3\r\nabc\r\nEND\r\n");
    let ttl = Client::connect(s[0].addr()).unwrap().call_str("mg k t\r\n").unwrap();
    let t: i64 = ttl.trim_end().strip_prefix("HD t").unwrap().parse().unwrap();
    assert!(t > 0 && t <= 100, "filled with exptime 100: {ttl:?}");
    assert_eq!(w.call_str("delete k\r\n").unwrap(), "DELETED\r\n");
    assert_eq!(c.call_str("get k\r\n").unwrap(), "VALUE k 7 3\r\nabc\r\nEND\r\n", "now the cold pool has it");
    assert_eq!(set(&mut c, "n", "1"), "STORED\r\n");
    assert!(has(&s[0], "n") && !has(&s[1], "n"), "writes go to the cold pool");
    assert_eq!(route_stat(&p, "route:fills_sent"), 1);
    common::stop(p);
}

/// Where a shadow's key_fraction puts a key (as mwproxy computes it).
fn key_share(key: &str) -> f64 {
    f64::from(KeyHash::Crc32a.hash(key.as_bytes())) / (f64::from(u32::MAX) + 1.0)
}

/// Whether `n` draws landed within 5 standard deviations of a binomial
/// (`trials`, `p`): a bound the machine's noise cannot cross.
fn binomial_ok(n: usize, trials: usize, p: f64) -> bool {
    let mean = trials as f64 * p;
    let sd = (trials as f64 * p * (1.0 - p)).sqrt();
    (n as f64 - mean).abs() <= 5.0 * sd
}

#[test]
fn shadows_copy_their_fraction_and_a_silent_shadow_changes_no_reply() {
    let s = common::servers(3);
    let route = r#"
[route]
type = "shadow"
main = "main"
shadows = [{ route = "bykey", key_fraction = [0.0, 0.25] }, { route = "byrequest", request_fraction = 0.5 }]
"#;
    let p = proxy(&[&s[0], &s[1], &s[2]], &["main", "bykey", "byrequest"], route);
    let mut c = common::client(&p);
    let keys: Vec<String> = (0..400).map(|i| format!("shadowed:{i}")).collect();
    for k in &keys {
        assert_eq!(set(&mut c, k, "v"), "STORED\r\n");
    }
    let expected: Vec<&String> = keys.iter().filter(|k| key_share(k) < 0.25).collect();
    assert!(binomial_ok(expected.len(), 400, 0.25), "crc32 spreads keys: {}", expected.len());
    assert!(eventually(PATIENCE, || route_stat(&p, "route:shadow_queued") == 0));
    let on = |m: &Memcached| keys.iter().filter(|k| has(m, k)).count();
    assert_eq!(on(&s[1]), expected.len(), "exactly the keys in the hash range");
    assert!(expected.iter().all(|k| has(&s[1], k)));
    let drawn = on(&s[2]);
    assert!(binomial_ok(drawn, 400, 0.5), "{drawn} of 400 requests copied at 0.5");
    assert_eq!(on(&s[0]), 400);
    assert_eq!(route_stat(&p, "route:shadow_sent") as usize, expected.len() + drawn);
    common::stop(p);

    // A shadow that never answers: every reply as without it, at most
    // `queue` copies held, the rest dropped and counted. The main pool
    // shares the backend timeout: generous, so that a loaded machine's
    // slow answer is never taken for a dead server (2 s had failed once).
    let route = "[route]\ntype = \"shadow\"\nmain = \"main\"\nqueue = 8\nshadows = [{ route = \"silent\", request_fraction = 1.0 }]\n";
    let p = start(config(&[&s[0], &s[1]], &["main", "silent"], route, |c| c.backend.timeout_ms = 10_000));
    s[1].pause().unwrap();
    let mut c = common::client(&p);
    for i in 0..200 {
        let k = format!("quiet:{i}");
        assert_eq!(set(&mut c, &k, "v"), "STORED\r\n", "main {} silent {}", s[0].endpoint(), s[1].endpoint());
        assert_eq!(c.call_str(&format!("get {k}\r\n")).unwrap(), value(&k, "v"));
        assert!(route_stat(&p, "route:shadow_queued") <= 8);
    }
    assert!(route_stat(&p, "route:shadow_dropped") >= 400 - 2 * 8 - 2);
    s[1].resume().unwrap();
    common::stop(p);
}

#[test]
fn migrate_follows_its_phases_by_the_clock() {
    let s = common::servers(2);
    let now = Arc::new(AtomicU64::new(1_000));
    let route = "[route]\ntype = \"migrate\"\nfrom = \"old\"\nto = \"new\"\nstart = 2000\nwindow = 1000\n";
    let clock = now.clone();
    let p = start(config(&[&s[0], &s[1]], &["old", "new"], route, move |c| {
        let value = c.route.take().unwrap().value;
        c.route = Some(RouteSpec { value, clock: Clock::manual(clock) });
    }));
    let mut c = common::client(&p);
    assert_eq!(route_stat(&p, "route:phase"), 0);
    assert_eq!(set(&mut c, "before", "1"), "STORED\r\n");
    assert!(has(&s[0], "before") && !has(&s[1], "before"));
    now.store(2_500, Ordering::Relaxed);
    assert_eq!(route_stat(&p, "route:phase"), 1);
    assert_eq!(set(&mut c, "during", "2"), "STORED\r\n");
    assert!(has(&s[0], "during") && has(&s[1], "during"), "writes go to both");
    put(&s[1], "before", "other");
    assert_eq!(c.call_str("get before\r\n").unwrap(), value("before", "1"), "reads stay on the old pool");
    assert_eq!(c.call_str("delete during\r\n").unwrap(), "DELETED\r\n");
    assert!(!has(&s[0], "during") && !has(&s[1], "during"), "deletes go to both");
    // Writes that depend on the item: `from` decides, `to` drops its copy
    // (which a cas with `from`'s unique, or an add of a key it holds, would
    // have refused, keeping a value that would answer after the window).
    put(&s[0], "cas-me", "v1");
    put(&s[1], "cas-me", "stale");
    let gets = c.call_str("gets cas-me\r\n").unwrap();
    let unique = gets.split_whitespace().nth(4).unwrap().to_string();
    assert_eq!(c.call_str(&format!("cas cas-me 0 0 2 {unique}\r\nv2\r\n")).unwrap(), "STORED\r\n");
    assert_eq!(held(&s[0], "cas-me"), value("cas-me", "v2"));
    assert!(!has(&s[1], "cas-me"), "the new pool kept a value the old one replaced: {}", held(&s[1], "cas-me"));
    put(&s[1], "add-me", "stale");
    assert_eq!(c.call_str("add add-me 0 0 3\r\nnew\r\n").unwrap(), "STORED\r\n");
    assert!(!has(&s[1], "add-me"), "an add the old pool took left the new one's value");
    put(&s[0], "meta-cas", "v1");
    put(&s[1], "meta-cas", "stale");
    let mg = c.call_str("mg meta-cas c\r\n").unwrap();
    let unique = mg.trim_end().split(' ').find_map(|w| w.strip_prefix('c')).unwrap().to_string();
    assert_eq!(c.call_str(&format!("ms meta-cas 2 C{unique}\r\nv2\r\n")).unwrap(), "HD\r\n");
    assert!(!has(&s[1], "meta-cas"), "a meta cas left the new pool's value");
    assert_eq!(
        c.call_str("incr cas-me 1\r\n").unwrap(),
        "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
    );
    now.store(3_000, Ordering::Relaxed);
    assert_eq!(route_stat(&p, "route:phase"), 2);
    assert_eq!(c.call_str("get before\r\n").unwrap(), value("before", "other"), "the new pool answers");
    assert_eq!(set(&mut c, "after", "3"), "STORED\r\n");
    assert!(has(&s[1], "after") && !has(&s[0], "after"));
    common::stop(p);

    // mcrouter's way (both = "deletes"): only deletes go to both; the rest
    // moves from `from` to `to` halfway through the window.
    now.store(2_200, Ordering::Relaxed);
    let clock = now.clone();
    let route = format!("{route}both = \"deletes\"\n");
    let p = start(config(&[&s[0], &s[1]], &["old", "new"], &route, move |c| {
        c.route.as_mut().unwrap().clock = Clock::manual(clock);
    }));
    let mut c = common::client(&p);
    assert_eq!(set(&mut c, "first-half", "1"), "STORED\r\n");
    assert!(has(&s[0], "first-half") && !has(&s[1], "first-half"));
    put(&s[1], "first-half", "1");
    assert_eq!(c.call_str("delete first-half\r\n").unwrap(), "DELETED\r\n");
    assert!(!has(&s[0], "first-half") && !has(&s[1], "first-half"), "deletes go to both");
    now.store(2_700, Ordering::Relaxed);
    assert_eq!(set(&mut c, "second-half", "2"), "STORED\r\n");
    assert!(has(&s[1], "second-half") && !has(&s[0], "second-half"));
    common::stop(p);
}

#[test]
fn a_route_that_would_explode_is_refused_naming_where() {
    let s = common::servers(1);
    let six = ["\"a\""; 6].join(", ");
    let inner = format!("{{ type = \"all-sync\", children = [{six}] }}");
    let route = format!("[route]\ntype = \"all-sync\"\nchildren = [{}]\n", [inner.as_str(); 6].join(", "));
    let e = Proxy::start(config(&[&s[0]], &["a"], &route, |_| {})).err().expect("refused").to_string();
    assert!(e.contains("reach 36 pools"), "{e}");
    let e =
        Proxy::start(config(&[&s[0]], &["a"], "route = { type = \"failover\", children = [\"a\", \"b\"] }", |_| {}))
            .err()
            .expect("refused")
            .to_string();
    assert!(e.contains("route.children[1]: unknown pool \"b\""), "{e}");
}

#[test]
fn a_reload_swaps_the_tree_and_its_counters() {
    let s = common::servers(2);
    let p = proxy(&[&s[0], &s[1]], &["a", "b"], "route = \"a\"");
    let mut c = common::client(&p);
    assert_eq!(set(&mut c, "k1", "x"), "STORED\r\n");
    assert!(has(&s[0], "k1") && !has(&s[1], "k1"));
    assert_eq!(route_stat(&p, "route:requests"), 1);
    let next =
        config(&[&s[0], &s[1]], &["a", "b"], "route = { type = \"failover\", children = [\"b\", \"a\"] }", |_| {});
    let report = mwproxy::reload::reload(&p.shared(), Ok(next)).expect("reloaded").to_string();
    // The log line says which tree is now in use.
    assert!(report.contains("route: failover, 3 routes over pools a (1 server), b (1 server)"), "{report}");
    assert_eq!(set(&mut c, "k2", "y"), "STORED\r\n", "the same client connection, the new tree");
    assert!(has(&s[1], "k2") && !has(&s[0], "k2"));
    assert_eq!(route_stat(&p, "route:failovers"), 0);
    assert_eq!(route_stat(&p, "route.children[0]:requests"), 1);
    // A tree that does not check is refused and the running one stays.
    let bad =
        config(&[&s[0], &s[1]], &["a", "b"], "route = \"a\"", |c| c.route.as_mut().unwrap().value = "nope".into());
    assert!(mwproxy::reload::reload(&p.shared(), Ok(bad)).unwrap_err().contains("unknown pool \"nope\""));
    assert_eq!(set(&mut c, "k3", "z"), "STORED\r\n");
    assert!(has(&s[1], "k3"));
    common::stop(p);
}

#[test]
fn all_sync_all_initial_all_async_and_miss_failover_answer_as_documented() {
    let mut s = common::servers(3);
    let route = r#"
[route]
type = "prefix"
[route.routes]
"sync:" = { type = "all-sync", children = ["a", "b"] }
"initial:" = { type = "all-initial", children = ["a", "b", "c"] }
"async:" = { type = "all-async", children = ["b", "c"] }
"miss:" = { type = "miss-failover", children = ["a", "b", "c"] }
"null:" = { type = "null" }
"#;
    let p = proxy(&[&s[0], &s[1], &s[2]], &["a", "b", "c"], route);
    let mut c = common::client(&p);
    // The null route answers as memcached answers a key it does not hold:
    // a quiet get with nothing, the opaque and key echoed.
    let asked = "mg null:k v q O1 k\r\nmg null:k v O2 k\r\nms null:k 1 q O3\r\nx\r\nmd null:k q k\r\nmn\r\n";
    c.send(asked.as_bytes()).unwrap();
    let replies: Vec<String> = c.read_replies(4).unwrap().into_iter().map(|r| String::from_utf8(r).unwrap()).collect();
    assert_eq!(replies, ["EN O2 knull:k\r\n", "NS O3\r\n", "NF knull:k\r\n", "MN\r\n"]);
    assert_eq!(c.call_str("mg async:none v q\r\nmn\r\n").unwrap(), "MN\r\n", "all-async's quiet miss");
    assert_eq!(set(&mut c, "sync:1", "x"), "STORED\r\n");
    assert!(has(&s[0], "sync:1") && has(&s[1], "sync:1") && !has(&s[2], "sync:1"));
    assert_eq!(set(&mut c, "initial:1", "y"), "STORED\r\n");
    assert!(has(&s[0], "initial:1"), "the first child answered, so it has it");
    assert!(eventually(PATIENCE, || has(&s[1], "initial:1") && has(&s[2], "initial:1")), "the others get copies");
    assert_eq!(set(&mut c, "async:1", "z"), "NOT_STORED\r\n", "answered at once with the default reply");
    assert!(eventually(PATIENCE, || has(&s[1], "async:1") && has(&s[2], "async:1")));
    assert!(!has(&s[0], "async:1"));
    assert_eq!(c.call_str("get async:1\r\n").unwrap(), "END\r\n", "all-async never waits for a reply");
    put(&s[2], "miss:1", "third");
    assert_eq!(c.call_str("get miss:1\r\n").unwrap(), value("miss:1", "third"), "misses go on to the next");
    assert_eq!(route_stat(&p, "route.routes.\"miss:\":failovers"), 2);
    assert_eq!(set(&mut c, "miss:2", "w"), "STORED\r\n");
    assert!(has(&s[0], "miss:2") && !has(&s[1], "miss:2"), "writes go to the first child");
    s[1].stop();
    assert!(set(&mut c, "sync:2", "x").starts_with("SERVER_ERROR"), "all-sync answers the first error");
    assert_eq!(set(&mut c, "initial:2", "y"), "STORED\r\n", "a dead other child changes no all-initial reply");
    assert_eq!(route_stat(&p, "route.routes.\"sync:\":errors"), 1);
    // The tree and the pools in `stats settings`, each setting by its path.
    let settings = c.call_str("stats settings\r\n").unwrap();
    assert!(settings.contains("STAT route.type prefix\r\n"), "{settings}");
    assert!(settings.contains("STAT route.routes.\"initial:\".children [\"a\", \"b\", \"c\"]\r\n"), "{settings}");
    assert!(settings.lines().any(|l| l.starts_with("STAT pools.b.servers [\"127.0.0.1:")), "{settings}");
    common::stop(p);
}

/// Kills the process at the end of a test, whatever happens.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_mcrouter_file_is_served_under_mcrouters_command_line_and_reloaded_on_sighup() {
    let s = common::servers(2);
    let dir = std::env::temp_dir().join(format!("mwproxy-mcrouter-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mcrouter.json");
    let write = |wildcard: &str| {
        let json = format!(
            r#"{{
  // mcrouter's own file, comments included
  "pools": {{ "A": {{ "servers": ["{}"] }}, "B": {{ "servers": ["{}"] }} }},
  "route": {{ "type": "PrefixSelectorRoute", "policies": {{ "b:": "PoolRoute|B" }}, "wildcard": {wildcard} }}
}}"#,
            s[0].endpoint(),
            s[1].endpoint()
        );
        std::fs::write(&file, json).unwrap();
    };
    write(r#"{ "type": "FailoverRoute", "children": ["PoolRoute|A", "PoolRoute|B"] }"#);
    let port = mctest::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_mwproxy"))
        .args(["mcrouter", "-f", file.to_str().unwrap(), "-p", &port.to_string()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = Killed(child);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    mctest::wait_for_port(addr, PATIENCE).unwrap();
    let mut c = Client::connect(addr).unwrap();
    assert_eq!(set(&mut c, "b:1", "x"), "STORED\r\n");
    assert_eq!(set(&mut c, "a:1", "y"), "STORED\r\n");
    assert!(has(&s[1], "b:1") && !has(&s[0], "b:1"));
    assert!(has(&s[0], "a:1") && !has(&s[1], "a:1"));
    // The file changes; SIGHUP swaps the tree under the same connection.
    write(r#""PoolRoute|B""#);
    let pid = child.0.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    assert!(eventually(PATIENCE, || set(&mut c, "a:2", "z") == "STORED\r\n" && has(&s[1], "a:2")));
    // A file mwproxy cannot read is refused at the check.
    std::fs::write(&file, r#"{ "pools": {}, "route": { "type": "HashRoute", "children": [] } }"#).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mwproxy"))
        .args(["mcrouter", "--validate-config", "-f", file.to_str().unwrap(), "-p", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("HashRoute") && err.contains("line 1, column"), "{err}");
    drop(child);
    // mwproxy's own flag takes the same file, with either engine.
    write(r#""PoolRoute|A""#);
    let p = common::ProxyProcess::start("", &["--mcrouter-config", file.to_str().unwrap()]);
    let mut c = Client::connect(p.addr()).unwrap();
    assert_eq!(set(&mut c, "a:3", "w"), "STORED\r\n");
    assert!(has(&s[0], "a:3"));
    drop(p);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What someone who runs mcrouter has: trailing commas, pool weights,
/// several `routes` entries of which the host's routing prefix (-R)
/// chooses one, the JSON on the command line, and scripts that read
/// `__mcrouter__.` keys (answered with an error, not routed as keys).
#[test]
fn an_mcrouter_file_of_several_routes_is_served_for_the_routing_prefix_given() {
    let s = common::servers(2);
    let json = format!(
        r#"{{
  "pools": {{ "A": {{ "servers": ["{}"], "weights": [1], }}, "B": {{ "servers": ["{}"], }}, }},
  "routes": [
    {{ "aliases": ["/r/a/"], "route": "PoolRoute|A", }},
    {{ "aliases": ["/r/b/"], "route": {{ "type": "FailoverRoute", "children": ["PoolRoute|B", "PoolRoute|A",], }}, }},
  ],
}}"#,
        s[0].endpoint(),
        s[1].endpoint()
    );
    let dir = std::env::temp_dir().join(format!("mwproxy-mcrouter-prefix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mcrouter.json");
    std::fs::write(&file, &json).unwrap();
    let path = file.to_str().unwrap();
    // mwproxy's own flags, with the test's engine.
    let p = common::ProxyProcess::start("", &["--mcrouter-config", path, "--route-prefix", "/r/b/"]);
    let mut c = Client::connect(p.addr()).unwrap();
    assert_eq!(set(&mut c, "k1", "x"), "STORED\r\n");
    assert!(has(&s[1], "k1") && !has(&s[0], "k1"), "/r/b/'s route");
    let refused = "SERVER_ERROR mwproxy does not answer mcrouter's __mcrouter__ keys\r\n";
    assert_eq!(c.call_str("get __mcrouter__.route(get,k1)\r\n").unwrap(), refused);
    assert_eq!(c.call_str("mg __mcrouter__.version v\r\n").unwrap(), refused);
    assert_eq!(c.call_str("get k1 __mcrouter__.version\r\n").unwrap(), value("k1", "x"), "left out, as a failed key");
    drop(p);
    // mcrouter's command line: without -R, or with one no entry has, the check says what to give.
    let check = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mwproxy"))
            .args(["mcrouter", "--validate-config", "-p", "1"])
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = check(&["-f", path]);
    assert!(code == Some(1) && err.contains("several routing prefixes") && err.contains("-R PREFIX"), "{err}");
    let (code, err) = check(&["-f", path, "-R", "/r/c/"]);
    assert!(code == Some(1) && err.contains("aliases present: \"/r/a/\", \"/r/b/\""), "{err}");
    assert_eq!(check(&["-f", path, "-R", "/r/a/"]).0, Some(0));
    // The JSON itself on the command line (--config-str), served for /r/a/.
    let port = mctest::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_mwproxy"))
        .args(["mcrouter", "--config-str", &json, "-R", "/r/a/", "-p", &port.to_string()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = Killed(child);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    mctest::wait_for_port(addr, PATIENCE).unwrap();
    assert_eq!(set(&mut Client::connect(addr).unwrap(), "k2", "y"), "STORED\r\n");
    assert!(has(&s[0], "k2") && !has(&s[1], "k2"), "/r/a/'s route");
    drop(child);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_multiget_of_many_windows_of_keys_answers_in_the_clients_order() {
    let s = common::servers(2);
    let p = proxy(
        &[&s[0], &s[1]],
        &["a", "b"],
        "[route]\ntype = \"prefix\"\ndefault = \"a\"\nroutes = { \"b:\" = \"b\" }\n",
    );
    let mut c = common::client(&p);
    // 700 keys (more than five windows of 128), half on each pool, every
    // third one missing, some asked twice.
    let keys: Vec<String> = (0..700).map(|i| if i % 2 == 0 { format!("a:{i}") } else { format!("b:{i}") }).collect();
    let mut expected = String::new();
    for (i, k) in keys.iter().enumerate() {
        if !i.is_multiple_of(3) {
            assert_eq!(set(&mut c, k, &i.to_string()), "STORED\r\n");
        }
    }
    let asked: Vec<&String> = keys.iter().chain(keys.iter().take(50)).collect();
    for k in &asked {
        let i: usize = k[2..].parse().unwrap();
        if !i.is_multiple_of(3) {
            expected += &format!("VALUE {k} 0 {}\r\n{i}\r\n", i.to_string().len());
        }
    }
    expected += "END\r\n";
    let line = format!("get {}\r\n", asked.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(" "));
    assert_eq!(c.call_str(&line).unwrap(), expected);
    assert!(has(&s[1], "b:1") && !has(&s[0], "b:1"));
    common::stop(p);
}

#[test]
fn a_silent_shadow_holds_no_more_bytes_than_its_bound() {
    let s = common::servers(2);
    let route =
        "[route]\ntype = \"shadow\"\nmain = \"main\"\nshadows = [{ route = \"silent\", request_fraction = 1.0 }]\n";
    let p = start(config(&[&s[0], &s[1]], &["main", "silent"], route, |c| c.backend.timeout_ms = 30_000));
    s[1].pause().unwrap();
    let mut c = common::client(&p);
    // 100 values of 768 KiB: the default queue (1000 copies) would hold them
    // all; the 64 MiB a node may hold takes 85.
    let value = "v".repeat(768 << 10);
    for i in 0..100 {
        assert_eq!(set(&mut c, &format!("big:{i}"), &value), "STORED\r\n");
    }
    let queued = route_stat(&p, "route:shadow_queued");
    assert!(queued <= (64 << 20) / (768 << 10), "{queued} copies of 768 KiB held");
    assert_eq!(route_stat(&p, "route:shadow_dropped"), 100 - queued);
    s[1].resume().unwrap();
    common::stop(p);
}

#[test]
fn a_silent_shadow_pool_delays_no_copy_to_other_pools() {
    let s = common::servers(3);
    // Pools by name: a, b, silent — each on a side lane of its own.
    let route = r#"
[route]
type = "prefix"
[route.routes]
"sh:" = { type = "shadow", main = "a", shadows = [{ route = "silent", request_fraction = 1.0 }] }
"in:" = { type = "all-initial", children = ["a", "b"] }
"#;
    let p = start(config(&[&s[0], &s[1], &s[2]], &["a", "b", "silent"], route, |c| c.backend.timeout_ms = 120_000));
    s[2].pause().unwrap();
    let mut c = common::client(&p);
    for i in 0..20 {
        assert_eq!(set(&mut c, &format!("sh:{i}"), "x"), "STORED\r\n");
    }
    // With one side thread for every copy, the copies to b waited behind
    // those to the silent pool until its 120 s timeout.
    for i in 0..20 {
        let key = format!("in:{i}");
        assert_eq!(set(&mut c, &key, "y"), "STORED\r\n");
        assert!(eventually(PATIENCE, || has(&s[1], &key)), "the copy of {key} to b did not arrive");
    }
    assert_eq!(route_stat(&p, "route.routes.\"in:\":async_dropped"), 0);
    s[2].resume().unwrap();
    common::stop(p);
}

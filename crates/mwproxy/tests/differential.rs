//! Differential tests: the same bytes sent to a memcached directly and to
//! mwproxy (in front of one server, three servers, and three servers with
//! replication) must get the same replies, byte for byte. Only cas uniques
//! (which differ between servers) are normalised, and `version`, whose answer
//! is the proxy's own by design, is used as the end-of-case marker.

mod common;

use mwproxy::Service;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mctest::{Client, Memcached};

/// One case: bytes to send on a connection that persists across cases.
enum Step {
    Send(Vec<u8>),
    /// `gets key`, then `cas` with the unique it returned (and `offset` added).
    CasWithFresh {
        key: &'static str,
        offset: u64,
        value: &'static str,
    },
}

fn s(bytes: &str) -> Step {
    Step::Send(bytes.as_bytes().to_vec())
}

fn steps() -> Vec<Step> {
    let long_key = "k".repeat(251);
    let key250 = "k".repeat(250);
    let big = "x".repeat(2 << 20);
    let mid = "v".repeat(500_000);
    vec![
        // storage and retrieval
        s("set a 0 0 3\r\nabc\r\n"),
        s("get a\r\n"),
        s("set b 42 0 4\r\nb\r\nc\r\n"),
        s("get a b missing\r\n"),
        s("get b b a\r\n"),
        s("gets a\r\n"),
        s("gat 100 a b missing\r\n"),
        s("gats 100 a\r\n"),
        s("gat 10\r\n"),
        s("add a 0 0 1\r\nz\r\n"),
        s("add c 0 0 1\r\nz\r\n"),
        s("replace missing 0 0 1\r\nz\r\n"),
        s("replace c 7 0 2\r\nzz\r\n"),
        s("append c 0 0 3\r\n+++\r\n"),
        s("prepend c 0 0 3\r\n---\r\n"),
        s("append missing 0 0 1\r\nx\r\n"),
        s("get c\r\n"),
        Step::CasWithFresh { key: "c", offset: 0, value: "cas!" },
        Step::CasWithFresh { key: "c", offset: 1000, value: "late" },
        s("cas missing 0 0 1 5\r\nx\r\n"),
        s("get c\r\n"),
        s(&format!("set {key250} 1 0 2\r\nok\r\nget {key250}\r\n")),
        s(&format!("set mid 0 0 {}\r\n{mid}\r\nget mid\r\n", mid.len())),
        s("set e 0 0 0\r\n\r\nget e\r\n"),
        // arithmetic, touch, delete
        s("set n 0 0 2\r\n10\r\n"),
        s("incr n 5\r\n"),
        s("decr n 100\r\n"),
        s("incr n 18446744073709551615\r\n"),
        s("incr missing 1\r\n"),
        s("incr a 1\r\n"),
        s("incr n -1\r\n"),
        s("incr n abc\r\n"),
        s("decr n\r\n"),
        s("touch a 100\r\n"),
        s("touch missing 100\r\n"),
        s("touch a soon\r\n"),
        s("delete a\r\n"),
        s("delete a\r\n"),
        s("delete b 0\r\n"),
        s("delete c 5\r\n"),
        s("delete c 0 noreply\r\nget c\r\n"),
        // noreply
        s("set q 0 0 1 noreply\r\nq\r\nget q\r\n"),
        s("add q 0 0 1 noreply\r\nz\r\nget q\r\n"),
        s("incr q 1 noreply\r\ntouch q 5 noreply\r\ndelete q noreply\r\nget q\r\n"),
        s("set q x 0 1 noreply\r\n"),
        // errors, byte for byte
        s("bogus\r\n"),
        s("\r\n"),
        s("g\r\n"),
        s("get\r\n"),
        s("GET a\r\n"),
        s(&format!("get {long_key}\r\n")),
        s(&format!("get a {long_key} b\r\n")),
        s(&format!("set {long_key} 0 0 1\r\nx\r\n")),
        s("set k 0 0\r\n"),
        s("set k 0 0 1 2 3\r\nx\r\n"),
        s("set k abc 0 1\r\nx\r\n"),
        s("set k 0 0 -1\r\n"),
        s("set k 0 0 3\r\nabcd\r\n"),
        s("set k 0 0 3\r\nab\r\n\r\n"),
        s("set k 0 0 1 noreply\r\nxy\r\n"),
        s("set big 0 0 1\r\n1\r\n"),
        s(&format!("set big 0 0 {}\r\n{big}\r\nget big\r\n", big.len())),
        s("get a\0b c\r\n"),
        s("flush_all bad\r\n"),
        s("flush_all 1 2 3\r\n"),
        s("verbosity\r\n"),
        s("verbosity x\r\n"),
        s("verbosity 1\r\n"),
        s("verbosity 0 noreply\r\n"),
        s("stats nosuchgroup\r\n"),
        s("stats cachedump 62 0\r\nstats cachedump\r\nstats cachedump 1\r\nstats cachedump 300 1\r\n"),
        s("stats cachedump x 1\r\nstats cachedump 1 -1\r\nstats cachedump 63 5 extra\r\n"),
        s("cache_memlimit 64\r\ncache_memlimit 4\r\ncache_memlimit x\r\ncache_memlimit 64 noreply\r\n"),
        s("cache_memlimit\r\ncache_memlimit 2000000000\r\ncache_memlimit 1 2 3\r\ncache_memlimit x noreply\r\n"),
        // meta protocol (flags whose values differ between servers, like cas, left out)
        s("ms m1 3 T0 F5\r\nabc\r\n"),
        s("mg m1 v f t s k\r\n"),
        s("mg m1\r\nmg  m1   v\r\n"),
        s("mg nokey v\r\n"),
        s("mg nokey v q\r\nmg m1 v q k O9\r\nmn\r\n"),
        s("ms m1 2 q\r\nhi\r\nms m1 2 q ME\r\nzz\r\nmn\r\n"),
        s("ms m2 1 MA\r\nx\r\nms m1 2 MA\r\n++\r\nmg m1 v\r\n"),
        s("ms mc 2\r\n10\r\nma mc\r\nma mc v\r\nma mc MD D5 v\r\nma nokey\r\nma nokey q\r\nmn\r\n"),
        s("ma m1\r\n"),
        s("md m1 q\r\nmd m1 q\r\nmd m1\r\nmn\r\n"),
        s("mg Zm9v b v\r\nms Zm9v 3 b\r\nbar\r\nmg Zm9v b v k\r\nmg foo v\r\n"),
        s("mg !!!! b v\r\nms k 2 b\r\nhi\r\nmn\r\n"),
        s("mg m2 v zz\r\nms m3 2 MZ\r\nhi\r\nms m3 2 q noreply\r\nhi\r\nmn\r\n"),
        s(&format!("ms m4 2 {}\r\nhi\r\nmn\r\n", ["v"; 30].join(" "))),
        s("mg\r\nms\r\nmd\r\nma\r\nme\r\nmn extra\r\n"),
        s("ms k\r\nms k abc\r\nms k -1\r\n"),
        s("ms k 2\r\nabc\r\n"),
        s(&format!("mg {long_key} v\r\nms {long_key} 2\r\nhi\r\nmn\r\n")),
        s(&format!("ms m5 1\r\nx\r\nms m5 {} T0\r\n{big}\r\nmg m5 v\r\n", big.len())),
        // pipelined mix in one write
        s("set p1 0 0 1\r\n1\r\nincr p1 1\r\nget p1\r\nbogus\r\ndelete p1\r\nget p1\r\n"),
        // binary values with CR LF inside
        Step::Send(b"set bin 3 0 6\r\n\r\n\0\x01\r\n\r\nget bin\r\n".to_vec()),
        s("flush_all\r\n"),
        s("get p1 bin e\r\n"),
        s("flush_all 0\r\nflush_all noreply\r\n"),
    ]
}

/// Cas uniques differ between servers; replace them.
fn normalise(reply: &[u8]) -> String {
    let text = String::from_utf8_lossy(reply);
    text.split("\r\n")
        .map(|line| {
            let parts: Vec<&str> = line.split(' ').collect();
            if parts.len() == 5 && parts[0] == "VALUE" {
                format!("VALUE {} {} {} <cas>", parts[1], parts[2], parts[3])
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// Reads until the `version` marker's reply (dropped) or until the peer closes.
fn read_to_marker(c: &mut Client) -> Vec<u8> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pos) = find_marker(&got) {
            got.truncate(pos);
            return got;
        }
        assert!(Instant::now() < deadline, "no marker after {:?}", String::from_utf8_lossy(&got));
        let (chunk, closed) = c.read_until_quiet(Duration::from_millis(20)).unwrap();
        got.extend_from_slice(&chunk);
        if closed {
            got.extend_from_slice(b"<closed>");
            return got;
        }
    }
}

fn find_marker(buf: &[u8]) -> Option<usize> {
    let text = buf;
    let mut start = 0;
    while let Some(i) = text[start..].windows(8).position(|w| w == b"VERSION ") {
        let at = start + i;
        if (at == 0 || text[at - 1] == b'\n') && text[at..].windows(2).any(|w| w == b"\r\n") {
            return Some(at);
        }
        start = at + 1;
    }
    None
}

fn run(addr: SocketAddr) -> Vec<String> {
    let mut c = Client::connect(addr).unwrap();
    let mut out = Vec::new();
    for step in steps() {
        let reply = match step {
            Step::Send(bytes) => {
                let mut b = bytes.clone();
                b.extend_from_slice(b"version\r\n");
                c.send(&b).unwrap();
                read_to_marker(&mut c)
            }
            Step::CasWithFresh { key, offset, value } => {
                let gets = c.call_str(&format!("gets {key}\r\n")).unwrap();
                let unique: u64 = gets.lines().next().unwrap().split(' ').nth(4).unwrap().parse().unwrap();
                let cmd = format!("cas {key} 0 0 {} {}\r\n{value}\r\nversion\r\n", value.len(), unique + offset);
                c.send(cmd.as_bytes()).unwrap();
                read_to_marker(&mut c)
            }
        };
        out.push(normalise(&reply));
    }
    out
}

fn compare(n_servers: usize, replication: usize) {
    compare_with(n_servers, replication, |_| {});
}

fn compare_with(n_servers: usize, replication: usize, tweak: impl FnOnce(&mut mwproxy::Config)) {
    let direct = Memcached::start().unwrap();
    let servers = common::servers(n_servers);
    let proxy = common::proxy(&servers, |c| {
        c.routing.replication = replication;
        tweak(c);
    });
    let expected = run(direct.addr());
    let got = run(proxy.local_addr());
    let inputs = steps();
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        let shown = match &inputs[i] {
            Step::Send(b) => String::from_utf8_lossy(&b[..b.len().min(80)]).into_owned(),
            Step::CasWithFresh { key, .. } => format!("cas on {key}"),
        };
        assert_eq!(g, e, "case {i} ({shown:?}) with {n_servers} servers, R={replication}");
    }
    assert_eq!(expected.len(), got.len());
    // The cases really exercise replies and errors (guards against both sides going quiet).
    let all = expected.concat();
    for needle in [
        "VALUE b 42 4",
        "CLIENT_ERROR bad data chunk",
        "SERVER_ERROR object too large for cache",
        "CLIENT_ERROR invalid numeric delta argument",
        "CLIENT_ERROR bad command line format",
        "EXISTS",
        "NOT_STORED",
        "TOUCHED",
        "DELETED",
    ] {
        assert!(all.contains(needle), "memcached's replies contain {needle:?}");
    }
    common::stop(proxy);
}

#[test]
fn same_replies_as_memcached_with_one_server() {
    compare(1, 1);
}

#[test]
fn same_replies_as_memcached_with_three_servers() {
    compare(3, 1);
}

#[test]
fn same_replies_as_memcached_with_three_replicas() {
    compare(3, 3);
}

/// Inputs after which memcached closes the connection: mwproxy closes too.
/// The same pool behind a route tree (a prefix selector whose routes all
/// lead to it): every request through the tree's machinery, multi-gets
/// split per key and merged.
#[test]
fn same_replies_as_memcached_through_a_route_tree_of_one_pool() {
    compare_with(3, 1, |c| {
        let pool = std::mem::take(&mut c.routing);
        c.routing.servers.clear();
        c.pools.insert("main".into(), pool);
        let route =
            r#"{ type = "prefix", default = "main", routes = { "k" = { type = "failover", children = ["main"] } } }"#;
        let doc: toml::Table = format!("route = {route}").parse().unwrap();
        c.route = Some(mwproxy::routes::RouteSpec::new(doc["route"].clone()));
    });
}

#[test]
fn closes_where_memcached_closes() {
    let direct = Memcached::start().unwrap();
    let servers = common::servers(1);
    let proxy = common::proxy(&servers, |_| {});
    let cases: Vec<Vec<u8>> =
        vec![b"get a\r\nquit\r\nget a\r\n".to_vec(), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), vec![b'x'; 5000]];
    common::closes_alike(direct.addr(), proxy.local_addr(), &cases);
    common::stop(proxy);
}

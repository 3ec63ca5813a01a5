//! Shared helpers of the integration tests: real memcached servers on free
//! ports and an in-process mwproxy in front of them.

#![allow(dead_code)]

use std::time::Duration;

use mctest::{Client, Memcached};
use mwproxy::{Config, Proxy};

/// Starts `n` memcached servers.
pub fn servers(n: usize) -> Vec<Memcached> {
    (0..n).map(|_| Memcached::start().expect("start memcached")).collect()
}

/// A proxy on a free port in front of `servers`, after `tweak` adjusts the defaults.
pub fn proxy(servers: &[Memcached], tweak: impl FnOnce(&mut Config)) -> Proxy {
    let mut c = Config::default();
    c.proxy.listen = "127.0.0.1:0".into();
    c.proxy.workers = 4;
    c.routing.servers = servers.iter().map(|s| s.endpoint().parse().unwrap()).collect();
    c.backend.timeout_ms = 500;
    c.backend.retry_min_ms = 20;
    c.backend.retry_max_ms = 200;
    tweak(&mut c);
    Proxy::start(c).expect("start mwproxy")
}

/// A client connected to the proxy.
pub fn client(p: &Proxy) -> Client {
    Client::connect(p.local_addr()).expect("connect to mwproxy")
}

/// Stops a proxy and waits for its threads.
pub fn stop(p: Proxy) {
    p.shutdown();
    p.join();
}

/// Which of `servers` hold `key` (asked directly).
pub fn holders(servers: &[Memcached], key: &str) -> Vec<usize> {
    servers
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            let mut c = Client::connect(s.addr()).unwrap();
            c.call_str(&format!("get {key}\r\n")).unwrap() != "END\r\n"
        })
        .map(|(i, _)| i)
        .collect()
}

/// Waits up to `within` for `cond`.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// The value of `STAT <name>` in a `stats` reply.
pub fn stat(stats: &str, name: &str) -> u64 {
    let prefix = format!("STAT {name} ");
    stats.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {name}")).parse().unwrap()
}

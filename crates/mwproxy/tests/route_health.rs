//! A route tree on the admin endpoint: `/metrics`, `/stats` and `stats
//! routes` count each route and each pool as traffic passes (and keep
//! counting over a reload that keeps the route); `/readyz` follows the tree
//! — a dead failover child or shadow pool leaves it 200 and named, a route
//! none of whose children answers makes it 503 naming the route. Every pool
//! is one memcached; every verdict is a condition polled with a generous
//! deadline, or a count.

mod common;

use std::net::SocketAddr;

use common::{eventually, PATIENCE};
use mctest::{http_get, Client, Memcached};
use mwproxy::{Config, Proxy, Service};

/// A proxy with its admin endpoint, whose pools are one server each
/// (`names[i]` is `servers[i]`), routed by `route` (the `[route]` table's TOML).
fn config(servers: &[&Memcached], names: &[&str], route: &str) -> Config {
    let mut c = common::config_for(&[], |c| {
        c.stats.admin = Some("127.0.0.1:0".into());
        c.backend.check_ms = 100;
    });
    let mut text = format!("{route}\n");
    for (s, n) in servers.iter().zip(names) {
        text += &format!("[pools.{n}]\nservers = [\"{}\"]\n", s.endpoint());
    }
    let t: Config = mwserve::config::ServiceConfig::from_toml(&text).unwrap();
    (c.pools, c.route) = (t.pools, t.route);
    c
}

fn start(c: Config) -> (Proxy, SocketAddr) {
    mctest::capture_logs();
    let p = Proxy::start(c).expect("start mwproxy");
    let admin = p.admin_addr().expect("an admin endpoint");
    (p, admin)
}

/// The value of the `/metrics` series `name{label="value"}` (0 when absent).
fn series(admin: SocketAddr, name: &str, label: &str, value: &str) -> f64 {
    let (_, page) = http_get(admin, "/metrics");
    let head = format!("{name}{{{label}=\"{}\"}} ", value.replace('"', "\\\""));
    page.lines().find_map(|l| l.strip_prefix(&head)).map_or(0.0, |v| v.parse().unwrap())
}

/// `/readyz`: whether it answered 200, and its body (a new look: an answer
/// is served again for `READY_FOR`, which is waited out first).
fn ready(admin: SocketAddr) -> (bool, serde_json::Value) {
    std::thread::sleep(mwserve::http::READY_FOR);
    let (status, body) = http_get(admin, "/readyz");
    let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (status.contains(" 200 "), v)
}

/// The first `/readyz` answer (200 or not, body) for which `until` holds.
fn ready_when(admin: SocketAddr, until: impl Fn(bool, &serde_json::Value) -> bool) -> (bool, serde_json::Value) {
    let mut last = (false, serde_json::Value::Null);
    let reached = eventually(PATIENCE, || {
        last = ready(admin);
        until(last.0, &last.1)
    });
    assert!(reached, "no such /readyz answer; the last: {} {}", last.0, last.1);
    last
}

fn set(c: &mut Client, key: &str) -> String {
    c.call_str(&format!("set {key} 0 0 1\r\nv\r\n")).unwrap()
}

const PREFIX_A: &str = "route.routes.\"a:\"";

#[test]
fn metrics_count_each_route_and_pool_and_keep_counting_over_a_reload() {
    let s = common::servers(2);
    let route = r#"
[route]
type = "prefix"
default = { type = "shadow", main = "b", shadows = [{ route = "a", key_fraction = [0.0, 1.0] }] }
[route.routes]
"a:" = "a"
"#;
    let (p, admin) = start(config(&[&s[0], &s[1]], &["a", "b"], route));
    let mut c = common::client(&p);
    for i in 0..5 {
        assert_eq!(set(&mut c, &format!("a:{i}")), "STORED\r\n");
    }
    for i in 0..3 {
        assert_eq!(c.call_str(&format!("get other{i}\r\n")).unwrap(), "END\r\n");
    }
    let route_requests = |path: &str| series(admin, "mwproxy_route_requests_total", "route", path);
    assert_eq!(route_requests(PREFIX_A), 5.0);
    assert_eq!(route_requests("route.default"), 3.0);
    assert_eq!(route_requests("route"), 8.0);
    assert_eq!(series(admin, "mwproxy_route_shadow_sent_total", "route", "route.default"), 3.0);
    // The shadow's copies reach pool a on the side thread, a moment later.
    assert!(
        eventually(PATIENCE, || series(admin, "mwproxy_pool_requests_total", "pool", "a") == 8.0),
        "pool a: 5 sets and 3 copies"
    );
    assert_eq!(series(admin, "mwproxy_pool_requests_total", "pool", "b"), 3.0);
    assert_eq!(series(admin, "mwproxy_pool_errors_total", "pool", "b"), 0.0);
    assert_eq!(series(admin, "mwproxy_pool_servers", "pool", "a"), 1.0);
    assert!(eventually(PATIENCE, || series(admin, "mwproxy_pool_ready", "pool", "b") == 1.0));
    assert_eq!(series(admin, "mwproxy_pool_servers_up", "pool", "b"), 1.0);
    let (_, page) = http_get(admin, "/metrics");
    for family in
        ["mwproxy_route_requests_total counter", "mwproxy_route_shadow_queued gauge", "mwproxy_pool_ready gauge"]
    {
        assert_eq!(page.matches(&format!("# TYPE {family}\n")).count(), 1, "{family}");
    }
    assert!(page.contains("# HELP mwproxy_route_errors_total "));
    // The same figures on /stats and `stats routes`.
    let (_, stats) = http_get(admin, "/stats");
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["routes"][PREFIX_A]["requests"], 5);
    assert_eq!(stats["routes"]["route.default"]["shadow_sent"], 3);
    assert_eq!(stats["pools"]["a"]["requests"], 8);
    let text = c.call_str("stats routes\r\n").unwrap();
    assert_eq!(common::stat(&text, "pool:a:requests"), 8);
    assert_eq!(common::stat(&text, "pool:b:servers_up"), 1);

    // A reload that keeps the routes keeps their counts; a new one counts from 0.
    let more = route.replace(
        "\"a:\" = \"a\"",
        "\"a:\" = \"a\"\n\"m:\" = { type = \"migrate\", from = \"a\", to = \"b\", start = 0, window = 1 }",
    );
    mwproxy::reload::reload(&p.shared(), Ok(config(&[&s[0], &s[1]], &["a", "b"], &more))).expect("reloaded");
    assert_eq!(set(&mut c, "a:5"), "STORED\r\n");
    assert_eq!(set(&mut c, "m:1"), "STORED\r\n");
    assert_eq!(route_requests(PREFIX_A), 6.0, "counted on over the reload");
    assert_eq!(route_requests("route"), 10.0);
    assert_eq!(route_requests("route.routes.\"m:\""), 1.0);
    assert_eq!(series(admin, "mwproxy_route_migrate_phase", "route", "route.routes.\"m:\""), 2.0, "after its window");
    assert!(eventually(PATIENCE, || series(admin, "mwproxy_pool_requests_total", "pool", "a") == 9.0));
    common::stop(p);
}

#[test]
fn readyz_follows_the_route_tree_and_names_pools_and_routes() {
    let mut s = common::servers(4);
    let route = r#"
[route]
type = "prefix"
default = { type = "shadow", main = "main", shadows = [{ route = "shadow", request_fraction = 0.5 }] }
[route.routes]
"f:" = { type = "failover", children = ["first", "second"] }
"#;
    let names = ["first", "second", "main", "shadow"];
    let (p, admin) = start(config(&[&s[0], &s[1], &s[2], &s[3]], &names, route));
    let checked = |v: &serde_json::Value| v["unchecked"].as_array().is_some_and(Vec::is_empty);
    let (_, v) = ready_when(admin, |ok, v| ok && checked(v));
    assert_eq!(v["pools"]["first"]["ready"], true, "{v}");
    assert_eq!(v["not_servable"], serde_json::json!([]));

    // A dead shadow pool: every request is still answered.
    s[3].stop();
    let (ok, v) = ready_when(admin, |_, v| v["pools"]["shadow"]["ready"] == false);
    assert!(ok, "a dead shadow pool leaves the proxy ready: {v}");
    assert_eq!(v["pools"]["shadow"]["down"], serde_json::json!([s[3].endpoint()]));

    // A dead failover primary: the second child answers.
    s[0].stop();
    let (ok, v) = ready_when(admin, |_, v| v["pools"]["first"]["ready"] == false);
    assert!(ok, "a failover with a child that answers leaves the proxy ready: {v}");
    assert_eq!(v["pools"]["first"]["down"], serde_json::json!([s[0].endpoint()]));
    assert_eq!(set(&mut common::client(&p), "f:1"), "STORED\r\n");

    // Every child of the failover dead: the route is named.
    s[1].stop();
    let (_, v) = ready_when(admin, |ok, _| !ok);
    assert_eq!(v["not_servable"], serde_json::json!(["route.routes.\"f:\""]), "{v}");
    assert_eq!(v["pools"]["second"]["ready"], false);
    assert_eq!(v["pools"]["main"]["ready"], true);
    assert_eq!(series(admin, "mwproxy_pool_ready", "pool", "second"), 0.0);

    // One child back: ready again, the shadow still down.
    s[0].restart().unwrap();
    let (_, v) = ready_when(admin, |ok, _| ok);
    assert_eq!(v["pools"]["shadow"]["ready"], false, "{v}");
    common::stop(p);
}

//! Route trees as a hostile client and a careless operator meet them: what
//! one request may make the proxy hold, a server that an all-fastest gave
//! up on while it was the one probing it, settings that would apply to no
//! pool. Every pool here is one memcached, asked directly what it holds.

mod common;

use common::{eventually, route_config as config, route_start as start, PATIENCE};
use mctest::{Client, Memcached};

fn put(server: &Memcached, key: &str, value: &str) {
    let set = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    assert_eq!(Client::connect(server.addr()).unwrap().call_str(&set).unwrap(), "STORED\r\n");
}

/// `STAT backend:<n>:<name>` of `stats backends`.
fn backend_stat(c: &mut Client, n: usize, name: &str) -> String {
    let stats = c.call_str("stats backends\r\n").unwrap();
    let prefix = format!("STAT backend:{n}:{name} ");
    stats.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {name} in {stats}")).to_string()
}

#[test]
fn a_server_an_all_fastest_gave_up_on_while_probing_it_comes_back() {
    let s = common::servers(2);
    let route = "route = { type = \"all-fastest\", children = [\"a\", \"b\"] }";
    // No health checks: only requests probe a down server, as under load;
    // no stall detection: a frozen server is down once its calls time out.
    let p = start(config(&[&s[0], &s[1]], &["a", "b"], route, |c| (c.backend.check_ms, c.backend.stall_ms) = (0, 0)));
    // b's reply to `get f` is long, a's short: a answers first, and the call
    // to b — the probe, once b is down — is given up by the async engine.
    put(&s[0], "f", "a");
    put(&s[1], "f", &"b".repeat(512 << 10));
    let mut c = common::client(&p);
    s[1].pause().unwrap();
    assert!(
        eventually(PATIENCE, || {
            c.call_str("get f\r\n").unwrap();
            backend_stat(&mut c, 1, "status") == "down"
        }),
        "b is marked down once its calls time out"
    );
    s[1].resume().unwrap();
    // Its probe's reply, dropped with the call, ended no probe: b stayed down for good.
    assert!(
        eventually(PATIENCE, || {
            c.call_str("get f\r\n").unwrap();
            backend_stat(&mut c, 1, "status") == "up"
        }),
        "b answers again, but the proxy still has it down"
    );
    common::stop(p);
}

#[test]
fn a_multiget_naming_a_large_value_many_times_is_refused_as_a_pool_refuses_it() {
    let s = common::servers(2);
    let route = "route = { type = \"prefix\", default = \"a\", routes = { \"both:\" = { type = \"all-sync\", children = [\"a\", \"b\"] } } }";
    let p = start(config(&[&s[0], &s[1]], &["a", "b"], route, |c| c.limits.max_reply_size = 2 << 20));
    let big = "v".repeat(512 << 10);
    for key in ["big", "both:big"] {
        put(&s[0], key, &big);
    }
    put(&s[1], "both:big", &big);
    let mut c = common::client(&p);
    // Each key's reply is within every bound; eight of them are 4 MiB, twice
    // the largest reply (a hundred thousand of them held 50 GB).
    for key in ["big", "both:big"] {
        let line = format!("get {}\r\n", [key; 8].join(" "));
        assert_eq!(c.call_str(&line).unwrap(), "SERVER_ERROR out of memory writing get response\r\n", "{key}");
        let three = format!("get {key} {key} {key}\r\n");
        assert_eq!(c.call_str(&three).unwrap().matches("VALUE").count(), 3, "within the bound, every hit");
    }
    common::stop(p);
}

/// `route:<path>:<name>` summed over every node of `stats routes`.
fn route_sum(c: &mut Client, name: &str) -> u64 {
    let stats = c.call_str("stats routes\r\n").unwrap();
    let suffix = format!(":{name}");
    stats
        .lines()
        .filter_map(|l| l.strip_prefix("STAT route:")?.rsplit_once(' '))
        .filter(|(n, _)| n.ends_with(&suffix))
        .map(|(_, v)| v.parse::<u64>().unwrap())
        .sum()
}

#[test]
fn many_shadow_nodes_hold_no_more_than_the_memory_budget_together() {
    let s = common::servers(2);
    // Four prefixes, each a shadow node copying every request to a silent
    // pool: each node holds at most its own bound (64 MiB), and they all
    // together at most the memory budget, here 8 MiB.
    let shadow = "{ type = \"shadow\", main = \"main\", shadows = [{ route = \"silent\", request_fraction = 1.0 }] }";
    let routes: Vec<String> = (0..4).map(|i| format!("\"p{i}:\" = {shadow}")).collect();
    let route = format!("[route]\ntype = \"prefix\"\nroutes = {{ {} }}", routes.join(", "));
    let p = start(config(&[&s[0], &s[1]], &["main", "silent"], &route, |c| {
        c.backend.timeout_ms = 30_000;
        c.proxy.memory_budget = 8 << 20;
    }));
    s[1].pause().unwrap();
    let mut c = common::client(&p);
    let value = "v".repeat(256 << 10);
    for i in 0..4 {
        for j in 0..20 {
            let set = format!("set p{i}:{j} 0 0 {}\r\n{value}\r\n", value.len());
            assert_eq!(c.call_str(&set).unwrap(), "STORED\r\n");
        }
    }
    // 80 copies of 256 KiB (20 MiB) were asked for.
    let queued = route_sum(&mut c, "shadow_queued");
    assert!(queued * (256 << 10) <= 8 << 20, "{queued} copies of 256 KiB held");
    assert_eq!(route_sum(&mut c, "shadow_dropped"), 80 - queued);
    s[1].resume().unwrap();
    assert!(eventually(PATIENCE, || route_sum(&mut c, "shadow_queued") == 0), "the copies drain once it answers");
    common::stop(p);
}

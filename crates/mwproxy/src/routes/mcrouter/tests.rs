use super::*;
use crate::config::Config;
use crate::routes::spec::{All, Both, FailOn, Kind};
use crate::routes::RouteSpec;

/// The checked tree of an mcrouter file.
fn tree(json: &str) -> crate::routes::spec::Tree {
    let (pools, route) = read(json).unwrap();
    let c = Config { pools, route: Some(RouteSpec::new(route)), ..Config::default() };
    c.route_tree().unwrap().unwrap()
}

fn refused(json: &str) -> String {
    read(json).unwrap_err().0
}

const POOLS: &str = r#""pools": { "A": { "servers": ["127.0.0.1:5001", "127.0.0.1:5002:ascii"] },
                                 "B": { "servers": ["127.0.0.1:5003"] } }"#;

#[test]
fn the_wiki_examples_read_as_route_trees() {
    // The simplest: one pool (with mcrouter's comments).
    let t = tree(&format!("{{ {POOLS}, // two pools\n /* the route */ \"route\": \"PoolRoute|A\" }}"));
    assert_eq!(t.nodes[0].kind, Kind::Pool(0));
    let (pools, _) = read(&format!("{{ {POOLS}, \"route\": \"Pool|B\" }}")).unwrap();
    assert_eq!(pools["A"].servers.len(), 2, "host:port:ascii is host:port");
    // Failover, prefixes, operations, warm-up, migration, shadows, all-*.
    let t = tree(&format!(
        r#"{{ {POOLS}, "route": {{
            "type": "PrefixSelectorRoute",
            "policies": {{
                "f:": {{ "type": "FailoverRoute", "children": ["PoolRoute|A", "PoolRoute|B"], "failover_errors": ["tko", "timeout"] }},
                "o:": {{ "type": "OperationSelectorRoute", "default_policy": "PoolRoute|A",
                         "operation_policies": {{ "delete": {{ "type": "AllSyncRoute", "children": ["Pool|A", "Pool|B"] }},
                                                  "incr": "PoolRoute|B", "decr": "PoolRoute|B" }} }},
                "w:": {{ "type": "WarmUpRoute", "cold": "PoolRoute|B", "warm": "PoolRoute|A", "exptime": 60 }},
                "m:": {{ "type": "MigrateRoute", "from": "PoolRoute|A", "to": "PoolRoute|B", "start_time": 1000, "interval": 50 }},
                "s:": {{ "type": "PoolRoute", "pool": "A", "shadows": [{{ "target": "PoolRoute|B", "key_fraction_range": [0, 0.1] }}] }},
                "x:": {{ "type": "AllMajorityRoute", "children": ["Pool|A", "Pool|B", "NullRoute"] }}
            }},
            "wildcard": {{ "type": "MissFailoverRoute", "children": ["PoolRoute|A", "ErrorRoute|gone"] }}
        }} }}"#
    ));
    let kind = |path: &str| &t.nodes.iter().find(|n| n.path == path).unwrap_or_else(|| panic!("{path}")).kind;
    assert!(matches!(
        kind("route.routes.\"f:\""),
        Kind::Failover { on: FailOn { connect: true, timeout: true, error: false }, .. }
    ));
    assert!(matches!(kind("route.routes.\"o:\".delete"), Kind::All { mode: All::Sync, .. }));
    assert_eq!(*kind("route.routes.\"o:\".arith"), Kind::Pool(1));
    assert!(matches!(kind("route.routes.\"w:\""), Kind::WarmUp { exptime: 60, .. }));
    assert!(matches!(kind("route.routes.\"m:\""), Kind::Migrate { start: 1000, window: 100, both: Both::Deletes, .. }));
    assert!(matches!(kind("route.routes.\"s:\""), Kind::Shadow { .. }));
    assert_eq!(*kind("route.routes.\"x:\".children[2]"), Kind::Answer { error: None });
    assert_eq!(*kind("route.default.children[1]"), Kind::Answer { error: Some("gone".into()) });
}

#[test]
fn named_handles_are_read_and_a_loop_among_them_is_refused() {
    let t = tree(&format!(
        r#"{{ {POOLS}, "named_handles": [{{ "type": "FailoverRoute", "name": "safe", "children": ["PoolRoute|A", "PoolRoute|B"] }}],
           "routes": [{{ "aliases": ["/a/b/"], "route": {{ "type": "AllInitialRoute", "children": ["safe", "PoolRoute|B"] }} }}] }}"#
    ));
    assert!(matches!(t.nodes[1].kind, Kind::Failover { .. }));
    let e = refused(&format!(
        r#"{{ {POOLS}, "named_handles": [
              {{ "type": "FailoverRoute", "name": "one", "children": ["two"] }},
              {{ "type": "AllSyncRoute", "name": "two", "children": ["PoolRoute|A", "one"] }}],
           "route": "one" }}"#
    ));
    assert!(e.contains("named handles loop: one -> two -> one"), "{e}");
    // A name given to two different routes is refused; the same route twice is that route.
    let safe = r#"{ "type": "FailoverRoute", "name": "safe", "children": ["PoolRoute|A", "PoolRoute|B"] }"#;
    let other = r#"{ "type": "FailoverRoute", "name": "safe", "children": ["PoolRoute|B", "PoolRoute|A"] }"#;
    let e = refused(&format!(
        r#"{{ {POOLS}, "named_handles": [{safe}], "route": {{ "type": "AllSyncRoute", "children": ["safe", {other}] }} }}"#
    ));
    assert!(e.contains("named handle \"safe\"") && e.contains("two different routes") && e.contains("(line "), "{e}");
    let t = tree(&format!(
        r#"{{ {POOLS}, "named_handles": [{safe}], "route": {{ "type": "AllSyncRoute", "children": ["safe", {safe}] }} }}"#
    ));
    assert!(matches!(t.nodes[0].kind, Kind::All { .. }));
}

#[test]
fn what_is_not_read_is_refused_with_the_handle_and_its_place() {
    let text = format!("{{ {POOLS},\n  \"route\": {{\n    \"type\": \"HashRoute\", \"children\": [] }} }}");
    let e = refused(&text);
    assert!(e.contains("HashRoute is not a handle mwproxy reads") && e.contains("line 4, column 13"), "{e}");
    let e = refused(&format!("{{ {POOLS}, \"route\": \"AllFastestRoute|Pool|A\" }}"));
    assert!(e.contains("over each server of a pool"), "{e}");
    let e = refused(&format!("{{ {POOLS}, \"route\": \"@int(3)\" }}"));
    assert!(e.contains("@ functions"), "{e}");
    let e = refused(&format!("{{ {POOLS}, \"macros\": {{}}, \"route\": \"Pool|A\" }}"));
    assert!(e.contains("macros"), "{e}");
    let e = refused(&format!("{{ {POOLS}, \"route\": \"PoolRoute|C\" }}"));
    assert!(e.contains("unknown pool \"C\""), "{e}");
    let e =
        refused(&format!("{{ {POOLS}, \"route\": {{ \"type\": \"PoolRoute\", \"pool\": \"A\", \"rates\": {{}} }} }}"));
    assert!(e.contains("\"rates\" is not read"), "{e}");
    let e = refused(&format!(
        "{{ {POOLS}, \"route\": {{ \"type\": \"OperationSelectorRoute\", \"operation_policies\": {{ \"add\": \"Pool|A\" }} }} }}"
    ));
    assert!(e.contains("operation \"add\" alone"), "{e}");
    let e = refused(
        "{ \"pools\": { \"A\": { \"servers\": [\"h:1\"], \"protocol\": \"umbrella\" } }, \"route\": \"Pool|A\" }",
    );
    assert!(e.contains("ascii"), "{e}");
    let e = refused(&format!("{{ {POOLS}, \"routes\": [{{ \"aliases\": [\"/a/\"], \"route\": \"Pool|A\" }}, {{ \"aliases\": [\"/b/\"], \"route\": \"Pool|B\" }}] }}"));
    assert!(e.contains("several routing prefixes"), "{e}");
    let e = refused("{ \"route\": ");
    assert!(e.contains("mcrouter config"), "{e}");
}

/// Named handles are expanded where they are used: twelve levels of
/// sixteen children naming the next level (16^12 routes from a 2 KB file)
/// and a chain of a thousand names (a stack overflow, on a SIGHUP too) are
/// refused while expanding, naming the handle, before anything grows.
#[test]
fn named_handles_cannot_expand_without_bound() {
    let mut named: Vec<String> = (0..12)
        .map(|i| {
            let kids = vec![format!("\"n{}\"", i + 1); 16].join(", ");
            format!(r#"{{ "type": "AllSyncRoute", "name": "n{i}", "children": [{kids}] }}"#)
        })
        .collect();
    named.push(r#"{ "type": "FailoverRoute", "name": "n12", "children": ["PoolRoute|A"] }"#.into());
    let e = refused(&format!(r#"{{ {POOLS}, "named_handles": [{}], "route": "n0" }}"#, named.join(", ")));
    assert!(e.contains("expands to more than 4096 routes") || e.contains("nests deeper"), "{e}");
    let chain: Vec<String> = (0..1000)
        .map(|i| format!(r#"{{ "type": "FailoverRoute", "name": "c{i}", "children": ["c{}"] }}"#, i + 1))
        .chain([r#"{ "type": "FailoverRoute", "name": "c1000", "children": ["PoolRoute|A"] }"#.to_string()])
        .collect();
    let e = refused(&format!(r#"{{ {POOLS}, "named_handles": [{}], "route": "c0" }}"#, chain.join(", ")));
    assert!(e.contains("nests deeper than 8 levels") && e.contains("at named handle c"), "{e}");
}

/// folly's relaxed JSON, as mcrouter reads it: trailing commas in objects
/// and arrays (outside strings), with comments; positions stay true.
#[test]
fn trailing_commas_are_read_as_mcrouter_reads_them() {
    let text = "{\n  \"pools\": { \"A\": { \"servers\": [\"127.0.0.1:5001\", \"127.0.0.1:5002\",], }, }, // A,\n  \"route\": { \"type\": \"AllSyncRoute\", \"children\": [\"Pool|A\", \"ErrorRoute|x, ]\",], },\n}\n";
    let (pools, route) = read(text).unwrap();
    assert_eq!(pools["A"].servers.len(), 2);
    assert_eq!(route["children"][1]["message"].as_str(), Some("x, ]"), "a comma in a string stays");
    let e = refused("{ \"pools\": {},\n  \"route\": \"PoolRoute|C\", }");
    assert!(e.contains("unknown pool \"C\"") && e.contains("line 2, column 12"), "{e}");
    assert!(refused("{ \"route\": [,] }").contains("mcrouter config"), "a lone comma is no trailing one");
}

/// A pool's `weights` (mcrouter's WeightedCh3 shares) become its servers'
/// ketama weights in the same proportion: a server of 0.5 next to one of
/// 1.0 holds about a third of the keys, one of 0.0 none.
#[test]
fn pool_weights_become_ketama_weights_in_the_same_proportion() {
    let share = |weights: &str| {
        let json = format!(
            r#"{{ "pools": {{ "A": {{ "servers": ["10.0.0.1:11211", "10.0.0.2:11211"], "weights": {weights} }} }}, "route": "Pool|A" }}"#
        );
        let (pools, _) = read(&json).unwrap();
        let servers = &pools["A"].servers;
        let ring = mcproto::ring::Ring::new(mcproto::ring::HashKind::Ketama, servers);
        let second = (0..3000).filter(|i| ring.server_for(format!("key:{i}").as_bytes()) == 1).count();
        (servers.iter().map(|s| s.weight).collect::<Vec<_>>(), second as f64 / 3000.0)
    };
    let (w, s) = share("[1.0, 0.5]");
    assert_eq!(w, [1000, 500]);
    assert!((0.28..0.39).contains(&s), "{s}");
    let (w, s) = share("[1, 0]");
    assert_eq!((w, s), (vec![1000, 1], 0.0));
    let e =
        refused(&format!("{{ {POOLS}, \"route\": \"Pool|A\" }}").replace("5002:ascii\"]", "5002\"], \"weights\": [1]"));
    assert!(e.contains("1 weights for 2 servers"), "{e}");
    let e = refused(
        &format!("{{ {POOLS}, \"route\": \"Pool|A\" }}").replace("5002:ascii\"]", "5002\"], \"weights\": [1, 2]"),
    );
    assert!(e.contains("weight 2: a number from 0.0 to 1.0") && e.contains("pool A (line"), "{e}");
}

/// Several `routes` entries: the one whose aliases hold the routing prefix
/// (mcrouter's -R) is served; without one, or with one no entry has, the
/// refusal says what to give.
#[test]
fn the_routing_prefix_chooses_among_several_routes() {
    let json = format!(
        r#"{{ {POOLS}, "routes": [{{ "aliases": ["/r/a/", "/r/aa/"], "route": "Pool|A" }}, {{ "aliases": ["/r/b/"], "route": "Pool|B" }}] }}"#
    );
    assert_eq!(read_for(&json, Some("/r/b/")).unwrap().1.as_str(), Some("B"));
    assert_eq!(read_for(&json, Some("/r/aa")).unwrap().1.as_str(), Some("A"), "the last slash is optional");
    let e = read(&json).unwrap_err().0;
    assert!(e.contains("several routing prefixes") && e.contains("-R PREFIX") && e.contains("--route-prefix"), "{e}");
    let e = read_for(&json, Some("/r/c/")).unwrap_err().0;
    assert!(
        e.contains("no entry has the routing prefix \"/r/c/\"") && e.contains("\"/r/a/\", \"/r/aa/\", \"/r/b/\""),
        "{e}"
    );
    let e = read_for(&json, Some("r/c")).unwrap_err().0;
    assert!(e.contains("/region/cluster/"), "{e}");
    // One `route` serves every prefix; one entry, a prefix it has or none.
    assert!(read_for(&format!("{{ {POOLS}, \"route\": \"Pool|A\" }}"), Some("/x/y/")).is_ok());
    let one = format!(r#"{{ {POOLS}, "routes": [{{ "aliases": ["/r/a/"], "route": "Pool|A" }}] }}"#);
    assert!(read(&one).is_ok() && read_for(&one, Some("/r/a/")).is_ok());
    assert!(read_for(&one, Some("/r/b/")).unwrap_err().0.contains("aliases present: \"/r/a/\""));
}

/// HashRoute over a pool, and a handle whose children are a pool's
/// servers, are refused with what to write instead.
#[test]
fn hash_routes_and_per_server_children_say_what_to_write_instead() {
    let e = refused(&format!("{{ {POOLS}, \"route\": \"HashRoute|Pool|A\" }}"));
    assert!(e.contains("write \"PoolRoute|A\" instead") && e.contains("hashes each key to one server"), "{e}");
    let e = refused(&format!("{{ {POOLS}, \"route\": {{ \"type\": \"HashRoute\", \"children\": \"Pool|B\" }} }}"));
    assert!(e.contains("write \"PoolRoute|B\" instead"), "{e}");
    let e = refused(&format!("{{ {POOLS}, \"route\": {{ \"type\": \"HashRoute\", \"children\": [\"Pool|A\"] }} }}"));
    assert!(e.contains("write \"PoolRoute|A\", which hashes"), "{e}");
    let text = format!("{{ {POOLS},\n \"route\": {{ \"type\": \"AllSyncRoute\", \"children\": \"Pool|A\" }} }}");
    let e = refused(&text);
    assert!(e.contains("does not expand a pool into one child per server") && e.contains("line 3, column 37"), "{e}");
    assert!(e.contains("\"PoolRoute|A1\"") && e.contains("replication"), "{e}");
}

#[test]
fn trailing_commas_are_read_and_a_key_given_twice_is_refused() {
    // mcrouter's wiki: "Trailing commas in lists or objects are allowed".
    let t = tree(&format!(
        "{{ {POOLS},\n  \"route\": {{ \"type\": \"FailoverRoute\", \"children\": [\"Pool|A\", \"Pool|B\",], }},\n}}"
    ));
    assert!(matches!(t.nodes[0].kind, Kind::Failover { .. }));
    // Two "route"s: serde_json (and folly) would keep the second, silently.
    // (POOLS takes two lines.)
    let e = refused(&format!("{{ {POOLS},\n  \"route\": \"Pool|A\",\n  \"route\": \"Pool|B\" }}"));
    assert!(e.contains("key \"route\" given twice") && e.contains("line 4"), "{e}");
    let e = refused(&format!(
        "{{ {POOLS}, \"route\": {{ \"type\": \"PrefixSelectorRoute\",\n  \"policies\": {{ \"a:\": \"Pool|A\",\n  \"a:\": \"Pool|B\" }} }} }}"
    ));
    assert!(e.contains("key \"a:\" given twice") && e.contains("line 4"), "{e}");
}

#[test]
fn refusals_of_the_tree_check_name_the_route_in_the_file() {
    // A comment naming a handle is not its place.
    let text = format!(
        "{{ {POOLS},\n  // \"FailoverRoute\" with many children\n  \"route\": {{ \"type\": \"PrefixSelectorRoute\", \"policies\": {{\n    \"a:\": \"Pool|A\",\n    \"b:\": {{ \"type\": \"FailoverRoute\", \"children\": [{}] }} }} }} }}",
        vec!["\"Pool|A\""; 17].join(", ")
    );
    let e = refused(&text);
    assert!(e.contains("route.policies.\"b:\" (line 6, column 21): children lists 1..=16 routes, not 17"), "{e}");
    let e = refused(&format!(
        "{{ {POOLS}, \"route\": {{ \"type\": \"OperationSelectorRoute\", \"operation_policies\": {{\n  \"get\": {{ \"type\": \"WarmUpRoute\", \"cold\": \"Pool|A\", \"warm\": \"Pool|B\", \"exptime\": 99999999 }} }} }} }}"
    ));
    assert!(e.contains("route.operation_policies.get.exptime (line 3, column 20)") && e.contains("30 days"), "{e}");
    let e = refused(&format!(
        "{{ {POOLS}, \"route\": {{ \"type\": \"PoolRoute\", \"pool\": \"A\", \"shadows\": [{{ \"target\": \"Pool|B\", \"key_fraction_range\": [0.5, 0.1] }}] }} }}"
    ));
    assert!(e.contains("route.shadows[0] (line 2, column") && e.contains("key_fraction"), "{e}");
    // Too many routes without a named handle: nothing said of named handles.
    let policies: Vec<String> = (0..1024)
        .map(|i| {
            format!("\"p{i}:\": {{ \"type\": \"FailoverRoute\", \"children\": [\"Pool|A\", \"Pool|A\", \"Pool|A\"] }}")
        })
        .collect();
    let e = refused(&format!(
        "{{ {POOLS}, \"route\": {{ \"type\": \"PrefixSelectorRoute\", \"policies\": {{ {} }} }} }}",
        policies.join(", ")
    ));
    assert!(e.contains("more than 4096 routes") && !e.contains("named handle"), "{e}");
}

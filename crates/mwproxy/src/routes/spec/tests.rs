use super::*;
use crate::config::Config;
use mwserve::config::ServiceConfig;

const POOLS: &str = "[pools.a]\nservers = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n[pools.b]\nservers = [\"127.0.0.1:2\", \"127.0.0.1:3\"]\n";

fn config(route: &str) -> Result<Config, ConfigError> {
    let c = Config::from_toml(&format!("{route}\n{POOLS}"))?;
    c.validate()?;
    Ok(c)
}

fn refused(route: &str) -> String {
    config(route).unwrap_err().0
}

#[test]
fn every_handle_reads_and_the_tree_names_its_paths() {
    let c = config(
        r#"
[route]
type = "prefix"
default = "a"
[route.routes."user:"]
type = "failover"
failover_on = ["connect", "timeout"]
children = ["a", { type = "all-majority", children = ["a", "b", "a"] }]
[route.routes."u"]
type = "operation"
get = { type = "warm-up", cold = "b", warm = "a", exptime = 60 }
set = { type = "shadow", main = "a", shadows = [{ route = "b", key_fraction = [0.0, 0.1] }, { route = "b", request_fraction = 0.5 }], queue = 10 }
delete = { type = "migrate", from = "a", to = "b", start = 100, window = 50 }
default = { type = "miss-failover", children = ["a", "b"] }
"#,
    )
    .unwrap();
    let tree = c.route_tree().unwrap().unwrap();
    assert_eq!(tree.pools, ["a", "b"]);
    let Kind::Prefix { routes, default } = &tree.nodes[0].kind else { panic!() };
    assert_eq!(routes[0].0, b"user:", "longest prefix first");
    assert!(default.is_some());
    let paths: Vec<&str> = tree.nodes.iter().map(|n| n.path.as_str()).collect();
    assert!(paths.contains(&"route.routes.\"user:\".children[1].children[2]"), "{paths:?}");
    let failover = tree.nodes.iter().find(|n| matches!(n.kind, Kind::Failover { .. })).unwrap();
    assert_eq!(
        failover.kind,
        Kind::Failover {
            children: vec![routes[0].1 + 1, routes[0].1 + 2],
            on: FailOn { error: false, timeout: true, connect: true }
        }
    );
    let m = tree.nodes.iter().find(|n| matches!(n.kind, Kind::Migrate { .. })).unwrap();
    assert_eq!(m.path, "route.routes.\"u\".delete");
    let (from, to) = (n_of(&tree, &m.path, "from"), n_of(&tree, &m.path, "to"));
    assert_eq!(m.kind, Kind::Migrate { from, to, start: 100, window: 50, both: Both::Writes });
    // The servers of both pools, once each, route keyless requests.
    let union: Vec<String> = c.effective_routing().servers.iter().map(|s| s.endpoint()).collect();
    assert_eq!(union, ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
    // What is printed reads back the same.
    assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
}

fn n_of(tree: &Tree, parent: &str, child: &str) -> NodeId {
    tree.nodes.iter().position(|n| n.path == format!("{parent}.{child}")).unwrap()
}

#[test]
fn refusals_name_the_route_path() {
    let e = refused("[route]\ntype = \"failover\"\nchildren = [\"a\", \"nope\"]\n");
    assert!(e.contains("route.children[1]") && e.contains("unknown pool \"nope\""), "{e}");
    let e = refused("[route]\ntype = \"prefix\"\n[route.routes.\"x:\"]\ntype = \"teleport\"\n");
    assert!(e.contains("route.routes.\"x:\"") && e.contains("unknown route type"), "{e}");
    let e =
        refused("[route]\ntype = \"shadow\"\nmain = \"a\"\nshadows = [{ route = \"b\", key_fraction = [0.5, 0.2] }]\n");
    assert!(e.contains("route.shadows[0]") && e.contains("key_fraction"), "{e}");
    let e = refused("[route]\ntype = \"failover\"\nchildren = [\"a\"]\nfailover_on = [\"rain\"]\n");
    assert!(e.contains("failover_on"), "{e}");
    let e = refused("[route]\ntype = \"migrate\"\nfrom = \"a\"\nto = \"b\"\nstart = 1\n");
    assert!(e.contains("route: window is missing"), "{e}");
    let e = refused("[route]\ntype = \"pool\"\npool = \"a\"\nchildren = [\"b\"]\n");
    assert!(e.contains("unknown key \"children\""), "{e}");
    let e = refused("[route]\ntype = \"warm-up\"\ncold = \"a\"\nwarm = \"b\"\nexptime = 2592001\n");
    assert!(e.contains("route.exptime") && e.contains("Unix time"), "{e}");
    let e = refused("[route]\ntype = \"all-initial\"\nchildren = [\"a\", \"b\"]\nqueue = 0\n");
    assert!(e.contains("route.queue: 0 copies waiting would drop every copy"), "{e}");
    let e = refused("route = 7\n");
    assert!(e.contains("route: a route is a pool's name"), "{e}");
    // Pools and [routing] servers do not mix; pools need a route.
    let e = Config::from_toml(&format!("route = \"a\"\n{POOLS}[routing]\nservers = [\"127.0.0.1:9\"]\n"))
        .unwrap()
        .validate();
    assert!(e.unwrap_err().0.contains("leave [routing] servers"));
    let e = Config::from_toml(POOLS).unwrap().validate().unwrap_err().0;
    assert!(e.contains("[pools] are used by a [route]"), "{e}");
    let e = refused("route = \"a\"\n[pools.c]\nservers = []");
    assert!(e.contains("pool c: no servers"), "{e}");
}

#[test]
fn a_tree_cannot_nest_fan_out_or_reach_beyond_its_limits() {
    let mut deep = "\"a\"".to_string();
    for _ in 0..MAX_DEPTH {
        deep = format!("{{ type = \"failover\", children = [{deep}] }}");
    }
    let e = refused(&format!("route = {deep}\n"));
    assert!(e.contains(&format!("deeper than {MAX_DEPTH}")), "{e}");
    let wide = ["\"a\""; MAX_CHILDREN + 1].join(", ");
    let e = refused(&format!("[route]\ntype = \"failover\"\nchildren = [{wide}]\n"));
    assert!(e.contains("children lists"), "{e}");
    // 6 x 6 pools at once: each level is within the limits, the product is not.
    let six = ["\"a\""; 6].join(", ");
    let inner = format!("{{ type = \"all-sync\", children = [{six}] }}");
    let outer = [inner.as_str(); 6].join(", ");
    let e = refused(&format!("[route]\ntype = \"all-sync\"\nchildren = [{outer}]\n"));
    assert!(e.contains("reach 36 pools"), "{e}");
    // A failover of them takes one child at a time: within the limit.
    config(&format!("[route]\ntype = \"failover\"\nchildren = [{outer}]\n")).unwrap();
}

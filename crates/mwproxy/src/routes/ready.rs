//! Readiness of a route tree (`/readyz`): given which pools can answer
//! every key of theirs, whether every request the tree can route still
//! reaches a pool that answers it — and, when not, which routes cannot.
//!
//! What a node needs follows what it does with a request (`run.rs`):
//!
//! - a selector (prefix, operation) needs every route it can choose;
//! - a failover needs one child that answers, when a dead server makes it
//!   take the next one (`failover_on` has `connect`, the default); else its
//!   first child;
//! - all-sync needs every child (it answers the first error), all-majority
//!   more than half of them, all-fastest one;
//! - all-initial, warm-up, miss-failover and shadow need the child that
//!   answers the client (the first, `cold`, the first, `main`): the copies
//!   they send elsewhere never reach a client, so their pools never make the
//!   tree unready, and all-async needs nothing;
//! - a migration needs `from` before its window, `to` after it, both in it;
//! - a `null` or `error` route answers by itself.
//!
//! A pool can answer ([`PoolHealth`]) as the one-pool proxy's `/readyz`
//! has always judged its one pool: unless some key's replicas are all down,
//! stalled or not checked yet.

use crate::exchange::Servers;
use crate::route::Router;

use super::spec::{All, Kind, NodeId, Tree};

/// What `/readyz` finds of one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolHealth {
    /// Positions (in the pool) of its servers that are down or stalled.
    pub down: Vec<usize>,
    /// Positions of its servers the health checker has not checked yet.
    pub unchecked: Vec<usize>,
    /// Whether some key has no replica left that is known to answer.
    pub lost: bool,
}

impl PoolHealth {
    /// The health of the pool `router` routes over, whose servers are
    /// numbered `ids`. With ejection on, an ejected server's keys are on the
    /// others' ring: only that ring can lose keys.
    pub fn of(router: &Router, ids: &[usize], servers: &Servers) -> PoolHealth {
        let down: Vec<usize> = (0..ids.len()).filter(|&p| servers.is_down(ids[p])).collect();
        let unchecked: Vec<usize> = (0..ids.len()).filter(|&p| servers.health.unchecked(ids[p])).collect();
        let unsure = |s: &usize| down.contains(s) || unchecked.contains(s);
        let lost = !(down.is_empty() && unchecked.is_empty())
            && router.placing().replica_sets(router.replication).iter().any(|set| set.iter().all(unsure));
        PoolHealth { down, unchecked, lost }
    }
}

/// The routes of `tree` that cannot answer, given `ready[p]` for each pool
/// and `phase(start, window)` for migrations (0 before, 1 in, 2 after):
/// empty when the tree is ready. A route is named where it fails as a whole
/// (a pool, a failover, an all-*), below the selectors and the nodes that
/// pass requests on to one child.
pub fn not_servable(tree: &Tree, ready: &[bool], phase: &dyn Fn(u64, u64) -> u8) -> Vec<NodeId> {
    let judge = Judge { tree, ready, phase };
    let mut out = Vec::new();
    if !judge.servable(0) {
        judge.blame(0, &mut out);
    }
    out
}

struct Judge<'a> {
    tree: &'a Tree,
    ready: &'a [bool],
    phase: &'a dyn Fn(u64, u64) -> u8,
}

impl Judge<'_> {
    /// The children every request through `n` may need, when `n` only
    /// passes requests on (selectors, shadows, migrations, ...); `None` when
    /// `n` combines its children's answers itself.
    fn passes_to(&self, n: NodeId) -> Option<Vec<NodeId>> {
        Some(match &self.tree.nodes[n].kind {
            Kind::Prefix { routes, default } => routes.iter().map(|r| r.1).chain(*default).collect(),
            Kind::Operation { by_op, default } => by_op.iter().chain([default]).flatten().copied().collect(),
            Kind::All { mode: All::Initial, children, .. } | Kind::MissFailover { children } => vec![children[0]],
            Kind::All { mode: All::Async, .. } | Kind::Answer { .. } => Vec::new(),
            Kind::WarmUp { cold, .. } => vec![*cold],
            Kind::Shadow { main, .. } => vec![*main],
            Kind::Migrate { from, to, start, window, .. } => match (self.phase)(*start, *window) {
                0 => vec![*from],
                2 => vec![*to],
                _ => vec![*from, *to],
            },
            Kind::Pool(_) | Kind::Failover { .. } | Kind::All { .. } => return None,
        })
    }

    fn servable(&self, n: NodeId) -> bool {
        if let Some(needed) = self.passes_to(n) {
            return needed.into_iter().all(|c| self.servable(c));
        }
        let count = |children: &[NodeId]| children.iter().filter(|&&c| self.servable(c)).count();
        match &self.tree.nodes[n].kind {
            Kind::Pool(p) => self.ready[*p],
            Kind::Failover { children, on } if on.connect => count(children) > 0,
            Kind::Failover { children, .. } => self.servable(children[0]),
            Kind::All { mode: All::Sync, children, .. } => count(children) == children.len(),
            Kind::All { mode: All::Majority, children, .. } => count(children) * 2 > children.len(),
            Kind::All { children, .. } => count(children) > 0,
            _ => unreachable!("every other node passes requests on"),
        }
    }

    /// Names the routes that make `n` (not servable) so.
    fn blame(&self, n: NodeId, out: &mut Vec<NodeId>) {
        match self.passes_to(n) {
            Some(needed) => needed.into_iter().filter(|&c| !self.servable(c)).for_each(|c| self.blame(c, out)),
            None => out.push(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routes `route` (TOML, over pools a, b, c) cannot serve when the
    /// pools in `down` cannot, by path.
    fn blamed(route: &str, down: &str, phase: u8) -> Vec<String> {
        let value: toml::Table = toml::from_str(route).unwrap();
        let pools = ["a", "b", "c"].map(String::from);
        let tree = super::super::spec::read(&value["route"], &pools).unwrap();
        let ready: Vec<bool> = pools.iter().map(|p| !down.contains(p.as_str())).collect();
        not_servable(&tree, &ready, &|_, _| phase).into_iter().map(|n| tree.nodes[n].path.clone()).collect()
    }

    #[test]
    fn a_failover_needs_one_child_and_copies_need_nothing() {
        let failover = "route = { type = \"failover\", children = [\"a\", \"b\"] }";
        assert!(blamed(failover, "a", 0).is_empty());
        assert_eq!(blamed(failover, "ab", 0), ["route"]);
        let only_errors = "route = { type = \"failover\", children = [\"a\", \"b\"], failover_on = [\"error\"] }";
        assert_eq!(blamed(only_errors, "a", 0), ["route"], "a dead server does not make it fail over");
        let shadow =
            "route = { type = \"shadow\", main = \"a\", shadows = [{ route = \"b\", request_fraction = 1.0 }] }";
        assert!(blamed(shadow, "b", 0).is_empty());
        assert_eq!(blamed(shadow, "a", 0), ["route.main"]);
        assert!(blamed("route = { type = \"all-async\", children = [\"a\", \"b\"] }", "ab", 0).is_empty());
        assert!(blamed("route = { type = \"all-initial\", children = [\"a\", \"b\"] }", "b", 0).is_empty());
        assert!(blamed("route = { type = \"warm-up\", cold = \"a\", warm = \"b\" }", "b", 0).is_empty());
        assert_eq!(blamed("route = { type = \"warm-up\", cold = \"a\", warm = \"b\" }", "a", 0), ["route.cold"]);
        assert!(blamed("route = { type = \"miss-failover\", children = [\"a\", \"b\"] }", "b", 0).is_empty());
        assert!(blamed("route = { type = \"null\" }", "abc", 0).is_empty());
    }

    #[test]
    fn all_star_nodes_need_what_they_answer_with() {
        let all = |mode: &str| format!("route = {{ type = \"all-{mode}\", children = [\"a\", \"b\", \"c\"] }}");
        assert_eq!(blamed(&all("sync"), "c", 0), ["route"]);
        assert!(blamed(&all("majority"), "c", 0).is_empty());
        assert_eq!(blamed(&all("majority"), "bc", 0), ["route"]);
        assert!(blamed(&all("fastest"), "bc", 0).is_empty());
        assert_eq!(blamed(&all("fastest"), "abc", 0), ["route"]);
    }

    #[test]
    fn selectors_name_each_route_that_cannot_answer() {
        let route = r#"
[route]
type = "prefix"
default = "c"
[route.routes]
"x:" = { type = "failover", children = ["a", "b"] }
"y:" = { type = "operation", get = "a", default = "b" }
"#;
        assert!(blamed(route, "", 0).is_empty());
        assert_eq!(blamed(route, "a", 0), ["route.routes.\"y:\".get"]);
        assert_eq!(
            blamed(route, "ab", 0),
            ["route.routes.\"x:\"", "route.routes.\"y:\".get", "route.routes.\"y:\".default"]
        );
        assert_eq!(blamed(route, "c", 0), ["route.default"]);
    }

    #[test]
    fn a_migration_needs_the_pools_its_phase_uses() {
        let route = "route = { type = \"migrate\", from = \"a\", to = \"b\", start = 100, window = 10 }";
        assert!(blamed(route, "b", 0).is_empty());
        assert_eq!(blamed(route, "b", 1), ["route.to"]);
        assert!(blamed(route, "a", 2).is_empty());
        assert_eq!(blamed(route, "a", 0), ["route.from"]);
    }
}

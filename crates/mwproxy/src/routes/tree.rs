//! The route tree as a running configuration uses it: each pool's own
//! routing core ([`Router`]: ring, replication, failover between replicas),
//! the nodes of the checked [`spec::Tree`], their counters, the clock and
//! the queue that carries the copies nobody waits for.
//!
//! Pools name their servers by their own positions; a generation numbers
//! the servers of every pool once ([`Config::effective_routing`], the
//! "union"), and each pool keeps the union position and the server number of
//! each of its servers, so that its calls land on the right connections and
//! its repairs on the right servers.
//!
//! A node's counters are shared, not copied, with the tree a reload builds
//! next when that tree has the same route at the same path ([`Tree::carry`]):
//! counts go on across a reload, and requests still on their way on the old
//! tree count where the new one reads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::Config;
use crate::health::Ejection;
use crate::route::{Router, Work};

use super::queue::Lanes;
use super::spec::{self, Clock, Kind, NodeId};

/// Keys of a split multi-get routed at once: a larger multi-get goes in
/// windows of this many keys, one after the other, so that a request of a
/// million one-byte keys holds the state of this many (about 1 KiB each),
/// not of all of them. A route whose keys reach several pools each (all-*,
/// shadows) takes this many pool requests at once: its window has fewer keys
/// ([`Tree::window`]; `flow.rs` routes by it).
pub const WINDOW: usize = 128;

/// A copy of a request for `node` of `tree`, made by `owner`, on its way
/// to the side thread.
#[derive(Debug)]
pub struct Detached {
    /// The tree it was routed with.
    pub tree: Arc<Tree>,
    /// The node whose bound it counts against.
    pub owner: NodeId,
    /// Where it goes.
    pub node: NodeId,
    /// The request.
    pub work: Work,
    /// What it holds (counted against `owner`'s bound until it is carried).
    pub bytes: u64,
}

/// One pool of the tree.
#[derive(Debug)]
pub struct Pool {
    /// Its name in `[pools.<name>]`.
    pub name: String,
    /// Its routing core.
    pub router: Router,
    /// The server number (`Servers`) of each of its servers.
    pub ids: Vec<usize>,
    /// The union position of each of its servers.
    pub pos: Vec<usize>,
}

/// What one node did since the tree was loaded.
#[derive(Debug, Default)]
pub struct NodeStats {
    /// Requests that reached it.
    pub requests: AtomicU64,
    /// Requests it answered with an error.
    pub errors: AtomicU64,
    /// Failovers taken (a failover's next child, a miss-failover's next child).
    pub failovers: AtomicU64,
    /// Copies handed to the queue (shadow copies, all-async and all-initial
    /// children, warm-up fills).
    pub sent: AtomicU64,
    /// Copies dropped because the node's queue was full.
    pub dropped: AtomicU64,
    /// Copies of this node waiting or on their way now.
    pub queued: AtomicU64,
    /// Their bytes, roughly (keys and values).
    pub queued_bytes: AtomicU64,
}

/// A route tree ready to carry requests.
#[derive(Debug)]
pub struct Tree {
    /// Its nodes, as configured.
    pub spec: spec::Tree,
    /// Its pools, in the order of `spec.pools`.
    pub pools: Vec<Pool>,
    /// One per node (shared with the trees before and after it that keep
    /// the node, [`Tree::carry`]).
    pub stats: Vec<Arc<NodeStats>>,
    /// What migrations take for now.
    pub clock: Clock,
    /// Where copies nobody waits for go.
    pub side: Arc<Lanes<Detached>>,
    /// The side lane of each node's copies: that of the first pool it reaches.
    pub lane: Vec<usize>,
    /// The server number of each union position (for repairs of copies).
    pub ids: Vec<usize>,
    /// Whether a request may take more than one round (a failover, a
    /// warm-up, a miss-failover, a replicated pool): batches are then cut
    /// so that no request overtakes another of the same key.
    pub rounds: bool,
    /// Keys of a split multi-get routed at once from each node: its
    /// [`WINDOW`] shared out among the pools one
    /// key reaches from there, so that an all-sync over many pools does not
    /// hold that many times the replies.
    pub window: Vec<usize>,
    /// The largest reply to one retrieval (`max_reply_size`): a split
    /// multi-get whose hits add up to more is answered as a pool answers it.
    pub max_reply: usize,
}

impl Tree {
    /// The tree of `config` (`None` without a `[route]`), over the union
    /// servers at `addrs` numbered `ids`.
    pub fn build(
        config: &Config,
        addrs: &[String],
        ids: &[usize],
        side: Arc<Lanes<Detached>>,
        ejection: Arc<Ejection>,
    ) -> Option<Tree> {
        let spec = config.route_tree().ok().flatten()?;
        let union = config.effective_routing();
        let pools =
            config
                .pools
                .iter()
                .map(|(name, r)| {
                    let pos: Vec<usize> = r
                        .servers
                        .iter()
                        .map(|s| {
                            union.servers.iter().position(|u| u.endpoint() == s.endpoint()).expect("a union server")
                        })
                        .collect();
                    let pool_ids: Vec<usize> = pos.iter().map(|&p| ids[p]).collect();
                    let router = Router::of(r, &config.limits, pos.iter().map(|&p| addrs[p].clone()).collect())
                        .ejecting(config.backend.eject, r, ejection.clone(), &pool_ids);
                    Pool { name: name.clone(), router, ids: pool_ids, pos }
                })
                .collect();
        let stats = spec.nodes.iter().map(|_| Arc::default()).collect();
        let clock = config.route.as_ref().map(|r| r.clock.clone()).unwrap_or_default();
        let rounds = config.pools.values().any(|p| p.replication > 1)
            || spec
                .nodes
                .iter()
                .any(|n| matches!(n.kind, Kind::Failover { .. } | Kind::WarmUp { .. } | Kind::MissFailover { .. }));
        // Nodes are in depth-first order, so a node's first pool is the first one from it on.
        let lane = (0..spec.nodes.len())
            .map(|n| spec.nodes[n..].iter().find_map(|x| if let Kind::Pool(p) = x.kind { Some(p) } else { None }))
            .map(|p| p.unwrap_or(0))
            .collect();
        let window = (0..spec.nodes.len()).map(|n| (WINDOW / spec.reach(n).max(1)).max(1)).collect();
        let max_reply = config.limits.max_reply_size;
        Some(Tree { spec, pools, stats, clock, side, lane, ids: ids.to_vec(), rounds, window, max_reply })
    }

    /// The tree in a few words, for the log: its root's type, how many
    /// routes, and the pools with their servers.
    pub fn summary(&self) -> String {
        let root = match &self.spec.nodes[Tree::ROOT].kind {
            Kind::Pool(p) => format!("pool {}", self.pools[*p].name),
            kind => type_name(kind).to_string(),
        };
        let pools: Vec<String> = self
            .pools
            .iter()
            .map(|p| format!("{} ({} server{})", p.name, p.ids.len(), if p.ids.len() == 1 { "" } else { "s" }))
            .collect();
        format!("route: {root}, {} routes over pools {}", self.spec.nodes.len(), pools.join(", "))
    }

    /// Where a migration stands now: 0 before its start, 1 in its window, 2 after.
    pub fn phase(&self, start: u64, window: u64) -> u8 {
        let now = self.clock.now();
        if now < start {
            0
        } else if now < start.saturating_add(window) {
            1
        } else {
            2
        }
    }

    /// Takes over the counters of `previous`'s nodes that this tree keeps:
    /// a node at the same path, of the same type (a pool node: of the same
    /// pool). A node that is new, or changed, counts from 0.
    pub fn carry(&mut self, previous: &Tree) {
        let old: std::collections::HashMap<&str, NodeId> =
            previous.spec.nodes.iter().enumerate().map(|(m, node)| (node.path.as_str(), m)).collect();
        for (n, node) in self.spec.nodes.iter().enumerate() {
            let Some(&m) = old.get(node.path.as_str()) else { continue };
            if previous.identity(&previous.spec.nodes[m].kind) == self.identity(&node.kind) {
                self.stats[n] = previous.stats[m].clone();
            }
        }
    }

    /// A node's type, and for a pool its name: what must stay for its
    /// counters to carry over a reload.
    fn identity<'a>(&'a self, kind: &Kind) -> (&'static str, Option<&'a str>) {
        match kind {
            Kind::Pool(p) => ("pool", Some(self.spec.pools[*p].as_str())),
            other => (type_name(other), None),
        }
    }

    /// Node `n`'s counters by name (`requests`, `errors`, `failovers`,
    /// `<copies>_sent`, `_dropped`, `_queued`, `phase`), as `stats routes`
    /// and `/metrics` name them.
    pub fn node_figures(&self, n: NodeId) -> Vec<(String, u64)> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (node, s) = (&self.spec.nodes[n], &self.stats[n]);
        let mut out = vec![("requests".to_string(), get(&s.requests)), ("errors".to_string(), get(&s.errors))];
        if matches!(node.kind, Kind::Failover { .. } | Kind::MissFailover { .. }) {
            out.push(("failovers".into(), get(&s.failovers)));
        }
        if let Some(c) = copies(&node.kind) {
            out.push((format!("{c}_sent"), get(&s.sent)));
            out.push((format!("{c}_dropped"), get(&s.dropped)));
            out.push((format!("{c}_queued"), get(&s.queued)));
        }
        if let Kind::Migrate { start, window, .. } = node.kind {
            out.push(("phase".into(), u64::from(self.phase(start, window))));
        }
        out
    }

    /// Every node's counters as `route:<path>:<name>`, value (`stats routes`).
    pub fn figures(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (n, node) in self.spec.nodes.iter().enumerate() {
            for (name, v) in self.node_figures(n) {
                out.push((format!("route:{}:{name}", node.path), v));
            }
        }
        out
    }

    /// Each pool's figures by name: `requests` and `errors` (those of the
    /// tree's nodes that are the pool: a multi-get counts once per key,
    /// copies count too), `servers` and `servers_up` (those `down` does not
    /// say are down, by server number).
    pub fn pool_figures(&self, down: &dyn Fn(usize) -> bool) -> Vec<(&str, [(&'static str, u64); 4])> {
        let mut counts = vec![(0, 0); self.pools.len()];
        for (n, node) in self.spec.nodes.iter().enumerate() {
            if let Kind::Pool(p) = node.kind {
                counts[p].0 += self.stats[n].requests.load(Ordering::Relaxed);
                counts[p].1 += self.stats[n].errors.load(Ordering::Relaxed);
            }
        }
        let pools = self.pools.iter().zip(counts);
        pools
            .map(|(pool, (requests, errors))| {
                let up = pool.ids.iter().filter(|&&s| !down(s)).count() as u64;
                let servers = pool.ids.len() as u64;
                (
                    pool.name.as_str(),
                    [("requests", requests), ("errors", errors), ("servers", servers), ("servers_up", up)],
                )
            })
            .collect()
    }

    /// The routes that cannot answer when `ready[p]` says whether pool `p`
    /// can (`ready.rs`); empty when every request reaches a pool that can.
    pub fn not_servable(&self, ready: &[bool]) -> Vec<NodeId> {
        super::ready::not_servable(&self.spec, ready, &|start, window| self.phase(start, window))
    }

    /// The id of the root node.
    pub const ROOT: NodeId = 0;
}

/// A node's type as the configuration names it.
fn type_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Pool(_) => "pool",
        Kind::Prefix { .. } => "prefix",
        Kind::Operation { .. } => "operation",
        Kind::Failover { .. } => "failover",
        Kind::MissFailover { .. } => "miss-failover",
        Kind::All { mode: spec::All::Sync, .. } => "all-sync",
        Kind::All { mode: spec::All::Async, .. } => "all-async",
        Kind::All { mode: spec::All::Initial, .. } => "all-initial",
        Kind::All { mode: spec::All::Majority, .. } => "all-majority",
        Kind::All { mode: spec::All::Fastest, .. } => "all-fastest",
        Kind::WarmUp { .. } => "warm-up",
        Kind::Shadow { .. } => "shadow",
        Kind::Migrate { .. } => "migrate",
        Kind::Answer { error: None } => "null",
        Kind::Answer { error: Some(_) } => "error",
    }
}

/// What a node's copies are called in its counters, when it makes copies.
fn copies(kind: &Kind) -> Option<&'static str> {
    match kind {
        Kind::All { mode: spec::All::Async | spec::All::Initial, .. } => Some("async"),
        Kind::WarmUp { .. } => Some("fills"),
        Kind::Shadow { .. } => Some("shadow"),
        _ => None,
    }
}

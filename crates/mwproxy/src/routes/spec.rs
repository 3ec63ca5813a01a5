//! The route tree as the configuration file writes it: the `[route]` table,
//! read into an arena of [`NodeSpec`]s, each named by its path in the file
//! (`route.children[1]`), with every refusal naming that path.
//!
//! A child is either a pool's name (`"main"`) or a table with a `type`. The
//! tree is nested TOML, so it cannot refer back to itself: a route cannot
//! loop. What keeps it from exploding is checked here: its depth, the
//! children of one node, the nodes of the whole tree, and the most pools one
//! request can reach at once ([`MAX_REACH`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use toml::Value;

use mwserve::config::ConfigError;

/// Deepest a route tree may nest (the root is depth 1).
pub const MAX_DEPTH: usize = 8;
/// Most children of one node (prefixes of a prefix selector excepted).
pub const MAX_CHILDREN: usize = 16;
/// Most prefixes of one prefix selector.
pub const MAX_PREFIXES: usize = 1024;
/// Most nodes of a whole tree.
pub const MAX_NODES: usize = 4096;
/// Most pool requests one client request may set off at once (all-* and
/// shadows add up, selectors and failovers take one child at a time).
pub const MAX_REACH: usize = 32;
/// Copies a detaching node (shadow, all-async, all-initial, warm-up) keeps
/// waiting unless its `queue` says otherwise.
pub const DEFAULT_QUEUE: usize = 1000;

/// Where the route's clock stands: seconds since the Unix epoch. Migrations
/// read it; tests set it (`Clock::manual`).
#[derive(Clone, Default)]
pub struct Clock(Option<Arc<AtomicU64>>);

impl Clock {
    /// A clock that says what `at` holds (a test's clock).
    pub fn manual(at: Arc<AtomicU64>) -> Clock {
        Clock(Some(at))
    }

    /// Seconds since the epoch, now.
    pub fn now(&self) -> u64 {
        match &self.0 {
            Some(at) => at.load(Ordering::Relaxed),
            None => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Clock(manual)" } else { "Clock(system)" })
    }
}

/// The `[route]` table as written, and the clock it runs by (not written:
/// the system's, unless a test sets another).
#[derive(Clone, Debug)]
pub struct RouteSpec {
    /// The table (or a pool's name).
    pub value: Value,
    /// What migrations take for now.
    pub clock: Clock,
}

impl RouteSpec {
    /// A route written as `value`, on the system's clock.
    pub fn new(value: Value) -> RouteSpec {
        RouteSpec { value, clock: Clock::default() }
    }
}

impl PartialEq for RouteSpec {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl Serialize for RouteSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl<'de> Deserialize<'de> for RouteSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RouteSpec, D::Error> {
        Ok(RouteSpec { value: Value::deserialize(d)?, clock: Clock::default() })
    }
}

/// An operation class, as the operation selector and migrations tell requests apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// get, gets, gat, gats, mg, me.
    Get,
    /// set, add, replace, append, prepend, cas, ms.
    Set,
    /// delete, md.
    Delete,
    /// incr, decr, ma.
    Arith,
    /// touch.
    Touch,
}

impl Op {
    /// Every class, by its name in the file.
    pub const ALL: [(&'static str, Op); 5] =
        [("get", Op::Get), ("set", Op::Set), ("delete", Op::Delete), ("arith", Op::Arith), ("touch", Op::Touch)];
}

/// What makes a failover take the next child.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FailOn {
    /// An error reply (`SERVER_ERROR` from the server, a lost connection, a
    /// reply that is not memcached's).
    pub error: bool,
    /// No reply in time (the backend timeout, or a stalled server given up).
    pub timeout: bool,
    /// No connection (refused, down, ejected).
    pub connect: bool,
}

/// How an all-* node combines its children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum All {
    /// Waits for every child; answers the first error, else the first child's reply.
    Sync,
    /// Sends to every child without waiting; answers a miss/not-stored reply at once.
    Async,
    /// Waits for the first child only; the others are sent without waiting.
    Initial,
    /// Waits for every child; answers the reply a majority gave.
    Majority,
    /// Waits for every child's round; answers the first success to arrive.
    Fastest,
}

/// Which copies a shadow takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fraction {
    /// Keys whose hash, as a fraction of the hash space, lies in `[from, to)`.
    Keys(f64, f64),
    /// This share of requests, drawn at random.
    Requests(f64),
}

/// Index of a node in the arena.
pub type NodeId = usize;

/// One node of the tree (children are arena indices).
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// A pool, by its index in the sorted pool names.
    Pool(usize),
    /// Longest matching prefix of the key wins; else `default`.
    Prefix {
        /// Prefixes and their routes, longest first.
        routes: Vec<(Vec<u8>, NodeId)>,
        /// For keys no prefix matches (without one: an error reply).
        default: Option<NodeId>,
    },
    /// By the operation's class; else `default`.
    Operation {
        /// Routes by [`Op`] (in the order of [`Op::ALL`]).
        by_op: [Option<NodeId>; 5],
        /// For classes without a route of their own.
        default: Option<NodeId>,
    },
    /// Children in order until one does not fail.
    Failover {
        /// In the order they are tried.
        children: Vec<NodeId>,
        /// What counts as failing.
        on: FailOn,
    },
    /// Every child.
    All {
        /// How the replies combine.
        mode: All,
        /// Where the request goes.
        children: Vec<NodeId>,
        /// Copies waiting at most (all-async, all-initial).
        queue: usize,
    },
    /// Gets from `cold`, then `warm` on a miss, filling `cold`; the rest to `cold`.
    WarmUp {
        /// The pool being filled.
        cold: NodeId,
        /// The pool that has the values.
        warm: NodeId,
        /// Expiry of the copies (memcached's exptime).
        exptime: u32,
        /// Fills waiting at most.
        queue: usize,
    },
    /// Gets from each child in order until a hit; other requests go to the first.
    MissFailover {
        /// In the order they are tried.
        children: Vec<NodeId>,
    },
    /// `main` answers; copies go to the shadows.
    Shadow {
        /// The route that answers.
        main: NodeId,
        /// Where copies go, and which.
        shadows: Vec<(NodeId, Fraction)>,
        /// Copies waiting at most.
        queue: usize,
    },
    /// Before `start`: `from`; in the window: gets from `from`, the rest to both; after: `to`.
    Migrate {
        /// Where the keys are.
        from: NodeId,
        /// Where they go.
        to: NodeId,
        /// When the window opens (Unix seconds).
        start: u64,
        /// How long it stays open (seconds).
        window: u64,
        /// What goes to both in the window.
        both: Both,
    },
    /// Answers at once: a miss / not stored / not found (`null`), or
    /// `SERVER_ERROR <message>` (`error`).
    Answer {
        /// The error's message, or `None` for the default reply.
        error: Option<String>,
    },
}

/// What a migration sends to both pools in its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Both {
    /// Every request but gets; gets read `from` (default).
    Writes,
    /// Deletes only (mcrouter's MigrateRoute): the rest goes to `from` in
    /// the first half of the window and to `to` in the second.
    Deletes,
}

/// A node and where it is written.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpec {
    /// Its path in the file, e.g. `route.children[1]`.
    pub path: String,
    /// What it does.
    pub kind: Kind,
}

/// A checked tree: its nodes (the root first) and the pools' names in the
/// order [`Kind::Pool`] numbers them.
#[derive(Clone, Debug, PartialEq)]
pub struct Tree {
    /// The nodes; 0 is the root.
    pub nodes: Vec<NodeSpec>,
    /// Pool names, sorted.
    pub pools: Vec<String>,
}

/// Reads the route `value` over the pools named `pools` (sorted) and
/// checks it: every refusal names the route's path.
pub fn read(value: &Value, pools: &[String]) -> Result<Tree, ConfigError> {
    let mut reader = Reader { nodes: Vec::new(), pools };
    let root = reader.node(value, "route".into(), 1)?;
    debug_assert_eq!(root, 0);
    let tree = Tree { nodes: reader.nodes, pools: pools.to_vec() };
    let reach = tree.reach(0);
    if reach > MAX_REACH {
        return Err(ConfigError(format!(
            "route: one request would reach {reach} pools at once (all-* children and shadows add up); \
             at most {MAX_REACH}"
        )));
    }
    Ok(tree)
}

impl Tree {
    /// The most pool requests one request through `n` sets off at once.
    pub fn reach(&self, n: NodeId) -> usize {
        let most = |c: &[NodeId]| c.iter().map(|&c| self.reach(c)).max().unwrap_or(0);
        let sum = |c: &[NodeId]| c.iter().map(|&c| self.reach(c)).sum::<usize>();
        match &self.nodes[n].kind {
            Kind::Pool(_) => 1,
            Kind::Prefix { routes, default } => {
                let mut c: Vec<NodeId> = routes.iter().map(|r| r.1).collect();
                c.extend(default);
                most(&c)
            }
            Kind::Operation { by_op, default } => {
                let c: Vec<NodeId> = by_op.iter().chain([default]).flatten().copied().collect();
                most(&c)
            }
            Kind::Failover { children, .. } | Kind::MissFailover { children } => most(children),
            Kind::All { children, .. } => sum(children),
            Kind::WarmUp { cold, warm, .. } => self.reach(*cold).max(self.reach(*warm)),
            Kind::Shadow { main, shadows, .. } => {
                self.reach(*main) + shadows.iter().map(|s| self.reach(s.0)).sum::<usize>()
            }
            Kind::Migrate { from, to, .. } => self.reach(*from) + self.reach(*to),
            Kind::Answer { .. } => 0,
        }
    }
}

/// Reads nodes into the arena, depth first, parents before children.
struct Reader<'a> {
    nodes: Vec<NodeSpec>,
    pools: &'a [String],
}

fn err<T>(path: &str, what: impl std::fmt::Display) -> Result<T, ConfigError> {
    Err(ConfigError(format!("{path}: {what}")))
}

impl Reader<'_> {
    fn node(&mut self, v: &Value, path: String, depth: usize) -> Result<NodeId, ConfigError> {
        if depth > MAX_DEPTH {
            return err(&path, format!("the route nests deeper than {MAX_DEPTH} levels"));
        }
        if self.nodes.len() >= MAX_NODES {
            return err(&path, format!("the route has more than {MAX_NODES} nodes"));
        }
        let id = self.nodes.len();
        self.nodes.push(NodeSpec { path: path.clone(), kind: Kind::Pool(0) });
        let kind = match v {
            Value::String(name) => Kind::Pool(self.pool(name, &path)?),
            Value::Table(t) => self.table(t, &path, depth)?,
            other => {
                return err(&path, format!("a route is a pool's name or a table with a type, not {}", other.type_str()))
            }
        };
        self.nodes[id].kind = kind;
        Ok(id)
    }

    fn pool(&self, name: &str, path: &str) -> Result<usize, ConfigError> {
        match self.pools.iter().position(|p| p == name) {
            Some(i) => Ok(i),
            None => err(path, format!("unknown pool {name:?} (the pools are {})", self.pools.join(", "))),
        }
    }

    fn table(&mut self, t: &toml::Table, path: &str, depth: usize) -> Result<Kind, ConfigError> {
        let Some(ty) = t.get("type") else {
            return err(path, "a route table needs a type (pool, prefix, operation, failover, all-sync, all-async, all-initial, all-majority, all-fastest, warm-up, miss-failover, shadow, migrate)");
        };
        let Some(ty) = ty.as_str() else { return err(path, "type is a string") };
        let allowed: &[&str] = match ty {
            "pool" => &["pool"],
            "prefix" => &["routes", "default"],
            "operation" => &["get", "set", "delete", "arith", "touch", "default"],
            "failover" => &["children", "failover_on"],
            "all-sync" | "all-majority" | "all-fastest" => &["children"],
            "all-async" | "all-initial" => &["children", "queue"],
            "warm-up" => &["cold", "warm", "exptime", "queue"],
            "miss-failover" => &["children"],
            "shadow" => &["main", "shadows", "queue"],
            "migrate" => &["from", "to", "start", "window", "both"],
            "null" => &[],
            "error" => &["message"],
            other => return err(path, format!("unknown route type {other:?} (pool, prefix, operation, failover, all-sync, all-async, all-initial, all-majority, all-fastest, warm-up, miss-failover, shadow, migrate, null, error)")),
        };
        if let Some(k) = t.keys().find(|k| *k != "type" && !allowed.contains(&k.as_str())) {
            return err(path, format!("unknown key {k:?} for a {ty} route (it takes {})", allowed.join(", ")));
        }
        let d = depth + 1;
        Ok(match ty {
            "pool" => {
                let name = need(t, "pool", path)?
                    .as_str()
                    .ok_or_else(|| ConfigError(format!("{path}.pool: a pool's name")))?;
                Kind::Pool(self.pool(name, path)?)
            }
            "prefix" => {
                let mut routes = Vec::new();
                if let Some(r) = t.get("routes") {
                    let Some(r) = r.as_table() else { return err(path, "routes is a table of prefix = route") };
                    if r.len() > MAX_PREFIXES {
                        return err(path, format!("more than {MAX_PREFIXES} prefixes"));
                    }
                    for (prefix, child) in r {
                        if prefix.bytes().any(|b| b <= b' ' || b == 0x7f) {
                            return err(
                                path,
                                format!("prefix {prefix:?} has a space or control character, which no key has"),
                            );
                        }
                        routes.push((
                            prefix.as_bytes().to_vec(),
                            self.node(child, format!("{path}.routes.{prefix:?}"), d)?,
                        ));
                    }
                }
                // Longest first: the first match is the longest.
                routes.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
                let default = self.opt(t, "default", path, d)?;
                if routes.is_empty() && default.is_none() {
                    return err(path, "a prefix route needs routes or a default");
                }
                Kind::Prefix { routes, default }
            }
            "operation" => {
                let mut by_op = [None; 5];
                for (i, (name, _)) in Op::ALL.iter().enumerate() {
                    by_op[i] = self.opt(t, name, path, d)?;
                }
                let default = self.opt(t, "default", path, d)?;
                if by_op.iter().all(Option::is_none) && default.is_none() {
                    return err(
                        path,
                        "an operation route needs at least one of get, set, delete, arith, touch, default",
                    );
                }
                Kind::Operation { by_op, default }
            }
            "failover" => {
                let on = match t.get("failover_on") {
                    None => FailOn { error: true, timeout: true, connect: true },
                    Some(v) => fail_on(v, path)?,
                };
                Kind::Failover { children: self.children(t, path, d, 1)?, on }
            }
            "all-sync" | "all-majority" | "all-fastest" | "all-async" | "all-initial" => {
                let mode = match ty {
                    "all-sync" => All::Sync,
                    "all-majority" => All::Majority,
                    "all-fastest" => All::Fastest,
                    "all-async" => All::Async,
                    _ => All::Initial,
                };
                Kind::All { mode, children: self.children(t, path, d, 1)?, queue: queue(t, path)? }
            }
            "warm-up" => {
                let cold = self.node(need(t, "cold", path)?, format!("{path}.cold"), d)?;
                let warm = self.node(need(t, "warm", path)?, format!("{path}.warm"), d)?;
                let exptime = match t.get("exptime") {
                    None => 0,
                    Some(v) => match int(v, &format!("{path}.exptime"), u32::MAX as u64)? {
                        // memcached reads a larger one as a Unix time: every fill would expire at once.
                        e if e > MAX_EXPTIME => {
                            return err(
                                &format!("{path}.exptime"),
                                format!(
                                    "{e} is more than 30 days ({MAX_EXPTIME} seconds), which memcached would \
                                     read as a Unix time long past: give the seconds, at most {MAX_EXPTIME}"
                                ),
                            )
                        }
                        e => e as u32,
                    },
                };
                Kind::WarmUp { cold, warm, exptime, queue: queue(t, path)? }
            }
            "miss-failover" => Kind::MissFailover { children: self.children(t, path, d, 1)? },
            "null" => Kind::Answer { error: None },
            "error" => {
                let message = match t.get("message") {
                    None => "error route".to_string(),
                    Some(Value::String(m)) if !m.contains(['\r', '\n']) => m.clone(),
                    Some(_) => return err(path, "message is one line of text"),
                };
                Kind::Answer { error: Some(message) }
            }
            "shadow" => {
                let main = self.node(need(t, "main", path)?, format!("{path}.main"), d)?;
                let list = need(t, "shadows", path)?.as_array().ok_or_else(|| {
                    ConfigError(format!("{path}.shadows: a list of {{ route, key_fraction | request_fraction }}"))
                })?;
                if list.is_empty() || list.len() > MAX_CHILDREN {
                    return err(path, format!("shadows lists 1..={MAX_CHILDREN} shadows"));
                }
                let mut shadows = Vec::new();
                for (i, s) in list.iter().enumerate() {
                    let p = format!("{path}.shadows[{i}]");
                    shadows.push(self.shadow(s, &p, d)?);
                }
                Kind::Shadow { main, shadows, queue: queue(t, path)? }
            }
            _ => {
                let from = self.node(need(t, "from", path)?, format!("{path}.from"), d)?;
                let to = self.node(need(t, "to", path)?, format!("{path}.to"), d)?;
                let start = int(need(t, "start", path)?, &format!("{path}.start"), i64::MAX as u64)?;
                let window = int(need(t, "window", path)?, &format!("{path}.window"), i64::MAX as u64)?;
                let both = match t.get("both").map(|v| v.as_str()) {
                    None | Some(Some("writes")) => Both::Writes,
                    Some(Some("deletes")) => Both::Deletes,
                    _ => return err(path, "both is \"writes\" (everything but gets, the default) or \"deletes\""),
                };
                Kind::Migrate { from, to, start, window, both }
            }
        })
    }

    fn shadow(&mut self, s: &Value, path: &str, d: usize) -> Result<(NodeId, Fraction), ConfigError> {
        let Some(t) = s.as_table() else {
            return err(path, "a shadow is a table { route, key_fraction | request_fraction }");
        };
        if let Some(k) = t.keys().find(|k| !["route", "key_fraction", "request_fraction"].contains(&k.as_str())) {
            return err(path, format!("unknown key {k:?} (a shadow takes route, key_fraction, request_fraction)"));
        }
        let fraction = match (t.get("key_fraction"), t.get("request_fraction")) {
            (Some(k), None) => {
                let pair = k.as_array().filter(|a| a.len() == 2);
                let nums: Option<Vec<f64>> = pair.and_then(|a| a.iter().map(num).collect::<Option<Vec<_>>>());
                match nums.as_deref() {
                    Some(&[a, b]) if (0.0..=1.0).contains(&a) && (a..=1.0).contains(&b) => Fraction::Keys(a, b),
                    _ => return err(path, "key_fraction is [from, to] with 0 <= from <= to <= 1"),
                }
            }
            (None, Some(r)) => match num(r) {
                Some(p) if (0.0..=1.0).contains(&p) => Fraction::Requests(p),
                _ => return err(path, "request_fraction is a number from 0 to 1"),
            },
            _ => return err(path, "a shadow takes key_fraction or request_fraction (one of them)"),
        };
        let route = self.node(need(t, "route", path)?, format!("{path}.route"), d)?;
        Ok((route, fraction))
    }

    fn opt(&mut self, t: &toml::Table, key: &str, path: &str, d: usize) -> Result<Option<NodeId>, ConfigError> {
        t.get(key).map(|v| self.node(v, format!("{path}.{key}"), d)).transpose()
    }

    fn children(&mut self, t: &toml::Table, path: &str, d: usize, least: usize) -> Result<Vec<NodeId>, ConfigError> {
        let Some(list) = need(t, "children", path)?.as_array() else {
            return err(path, "children is a list of routes");
        };
        if list.len() < least || list.len() > MAX_CHILDREN {
            return err(path, format!("children lists {least}..={MAX_CHILDREN} routes, not {}", list.len()));
        }
        list.iter().enumerate().map(|(i, c)| self.node(c, format!("{path}.children[{i}]"), d)).collect()
    }
}

fn need<'a>(t: &'a toml::Table, key: &str, path: &str) -> Result<&'a Value, ConfigError> {
    t.get(key).ok_or_else(|| ConfigError(format!("{path}: {key} is missing")))
}

fn num(v: &Value) -> Option<f64> {
    v.as_float().or_else(|| v.as_integer().map(|i| i as f64))
}

/// memcached's longest relative exptime: 30 days.
const MAX_EXPTIME: u64 = 2_592_000;

fn int(v: &Value, path: &str, most: u64) -> Result<u64, ConfigError> {
    match v.as_integer() {
        Some(i) if i >= 0 && i as u64 <= most => Ok(i as u64),
        _ => err(path, format!("a whole number from 0 to {most}")),
    }
}

/// A detaching node's `queue`: 1 or more. (0 would drop every copy — an
/// all-initial's other children, a warm-up's fills, every shadow copy —
/// where mwproxy's other zeros mean "off" or "all": refused, not guessed.)
fn queue(t: &toml::Table, path: &str) -> Result<usize, ConfigError> {
    let path = format!("{path}.queue");
    match t.get("queue") {
        None => Ok(DEFAULT_QUEUE),
        Some(v) => match int(v, &path, 1 << 20)? {
            0 => err(
                &path,
                "0 copies waiting would drop every copy: give 1 or more (for no shadow copies, a fraction of 0)",
            ),
            n => Ok(n as usize),
        },
    }
}

fn fail_on(v: &Value, path: &str) -> Result<FailOn, ConfigError> {
    let mut on = FailOn::default();
    let Some(list) = v.as_array() else { return err(path, "failover_on is a list of error, timeout, connect") };
    for w in list {
        match w.as_str() {
            Some("error") => on.error = true,
            Some("timeout") => on.timeout = true,
            Some("connect") => on.connect = true,
            _ => return err(path, format!("failover_on takes error, timeout, connect, not {w}")),
        }
    }
    Ok(on)
}

#[cfg(test)]
mod tests;

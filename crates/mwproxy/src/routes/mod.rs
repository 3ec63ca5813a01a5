//! Route trees, as mcrouter has them: named pools (each placed and
//! replicated by the routing core, `route/`, as the single `[routing]` pool
//! is) combined by selectors (key prefix, operation), failover, all-* fan
//! outs, warm-up, miss-failover, shadowing and migration.
//!
//! - `spec.rs`: the `[pools]` and `[route]` tables, read and checked
//!   (limits, unknown pools, errors naming the route's path);
//! - `tree.rs`: the tree a generation routes with — a routing core per
//!   pool, the counters per node;
//! - `run.rs`: one request at one node: which pools get it and how their
//!   replies combine; the leaves are the routing core's `Exec`s;
//! - `flow.rs`: a client request through the tree, driven by the engines
//!   exactly as an `Exec` is (multi-key gets split per key, merged in order);
//! - `queue.rs` and `side.rs`: the queue and the thread for copies nobody
//!   waits for;
//! - `ready.rs`: whether every request the tree routes reaches a pool
//!   that answers (`/readyz`);
//! - `mcrouter.rs`: mcrouter's JSON read into the same `[pools]` and `[route]`.
//!
//! Without a `[route]` none of this runs: the `[routing]` pool serves every
//! request as before.

pub mod flow;
pub mod mcrouter;
pub mod queue;
pub mod ready;
pub mod run;
pub mod side;
pub mod spec;
pub mod tree;

pub use flow::Flow;
pub use spec::{Clock, RouteSpec};
pub use tree::Tree;

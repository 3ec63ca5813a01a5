//! A client request through the route tree, as a carrier drives it: the
//! same rounds and outcomes as the routing core's [`Exec`](crate::route::Exec)
//! (`round` fills the outbox, `absorb` takes each call's outcome in any
//! order), so both engines and the side queue carry it unchanged.
//!
//! A multi-key get is split into one get per key, each routed on its own
//! (as mcrouter does), and the hits are put back together in the client's
//! key order: keys whose route failed are left out, as a pool leaves out
//! the keys of a failed server (`multiget_failure = partial`), unless every
//! key's route failed, which answers the first error.
//! A multi-get of many keys is routed [`WINDOW`] keys at a time (fewer when
//! a key reaches several pools), so that what one request holds stays small
//! whatever its number of keys; hits adding up to more than `max_reply_size`
//! end it with the error a pool answers then.

use std::sync::Arc;

use mcproto::{GetKind, Request};

use crate::route::{BackendError, Effects, Outbox, Work, REPLY_TOO_LARGE};

use super::run::{self, Done, Run};
use super::spec::NodeId;
use super::tree::Tree;

/// Whether a request goes through the route tree: everything that names a
/// key. Requests for every key or none (`flush_all`, `version`, `stats`,
/// `mn`) go to every server of every pool, or are answered by the proxy.
pub fn routed(work: &Work) -> bool {
    match work {
        Work::DropStale { .. } => true,
        Work::Request(r) => match r {
            Request::Get { keys, .. } => !keys.is_empty(),
            Request::Meta { kind, .. } => *kind != mcproto::MetaKind::Noop,
            Request::Store { .. } | Request::Delete { .. } | Request::Arith { .. } | Request::Touch { .. } => true,
            _ => false,
        },
    }
}

pub use super::tree::WINDOW;

/// One request on its way through the tree (of the generation it was
/// routed with: every call takes the same tree).
#[derive(Debug)]
pub struct Flow {
    /// Round-robin position for the reads it starts later (failovers).
    rr: usize,
    /// How many call outcomes it took: orders the ends for all-fastest.
    tick: u64,
    /// The outbox index of its current round's first call.
    base: usize,
    node: NodeId,
    parts: Parts,
}

/// One route, or a multi-get split per key. (The one route is kept inline:
/// it is the common case, and a box would cost an allocation per request.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Parts {
    One(Run),
    Split(Box<Split>),
}

/// A multi-get, a window of keys at a time.
#[derive(Debug)]
struct Split {
    kind: GetKind,
    exptime: i32,
    /// Keys not routed yet.
    keys: std::vec::IntoIter<Vec<u8>>,
    /// The window on its way.
    runs: Vec<Run>,
    /// The hits of the windows done, in key order (without `END`).
    reply: Vec<u8>,
    fx: Effects,
    /// Whether some key's route answered; else the first error answers.
    any_ok: bool,
    first_error: Option<Vec<u8>>,
    /// Keys routed at once.
    window: usize,
    /// The most the hits may add up to (`max_reply_size`).
    cap: usize,
    /// They added up to more: the rest of the keys are not routed, and the
    /// client gets `SERVER_ERROR out of memory writing get response`, as
    /// from a pool (each key's own reply is bounded, their sum was not: a
    /// `get` naming a 1 MiB value a hundred thousand times held 100 GB).
    too_large: bool,
}

impl Split {
    /// Starts the next window; false when no key is left.
    fn next_window(&mut self, tree: &Arc<Tree>, node: NodeId, rr: &mut usize) -> bool {
        if self.too_large {
            return false;
        }
        let (kind, exptime) = (self.kind, self.exptime);
        let one = |k| Work::Request(Request::Get { kind, exptime, keys: vec![k] });
        self.runs.extend(self.keys.by_ref().take(self.window).map(|k| run::begin(tree, node, one(k), rr)));
        !self.runs.is_empty()
    }

    /// Takes the finished window's replies.
    fn fold(&mut self) {
        for mut r in self.runs.drain(..) {
            let mut d: Done = r.take();
            self.fx.counters.add(&d.fx.counters);
            self.fx.hits += d.fx.hits;
            self.fx.repairs.append(&mut d.fx.repairs);
            if d.failure.is_some() {
                self.first_error.get_or_insert(d.reply);
            } else {
                self.any_ok = true;
                let hits = d.reply.strip_suffix(b"END\r\n").unwrap_or(&d.reply);
                if self.too_large {
                } else if self.reply.len() + hits.len() > self.cap {
                    self.too_large = true;
                    self.reply = Vec::new();
                } else {
                    self.reply.extend_from_slice(hits);
                }
            }
        }
    }
}

impl Flow {
    /// Starts `work` at `node` of `tree`.
    pub fn begin(tree: &Arc<Tree>, node: NodeId, work: Work, rr: &mut usize) -> Flow {
        let parts = match work {
            Work::Request(Request::Get { kind, exptime, keys }) if keys.len() > 1 => {
                let mut split = Split {
                    kind,
                    exptime,
                    keys: keys.into_iter(),
                    runs: Vec::new(),
                    reply: Vec::new(),
                    fx: Effects::default(),
                    any_ok: false,
                    first_error: None,
                    window: tree.window[node],
                    cap: tree.max_reply,
                    too_large: false,
                };
                split.next_window(tree, node, rr);
                Parts::Split(Box::new(split))
            }
            w => Parts::One(run::begin(tree, node, w, rr)),
        };
        *rr = rr.wrapping_add(1);
        Flow { rr: *rr, tick: 0, base: 0, node, parts }
    }

    /// Adds the next round's calls to `out` and returns how many; 0 means
    /// it is finished and [`Flow::finish`] has the reply.
    pub fn round(&mut self, tree: &Arc<Tree>, out: &mut Outbox) -> usize {
        self.base = out.calls().len();
        match &mut self.parts {
            Parts::One(r) => {
                r.round(tree, &mut self.rr, out);
            }
            Parts::Split(split) => loop {
                let mut done = true;
                for r in &mut split.runs {
                    done &= r.round(tree, &mut self.rr, out);
                }
                if !done {
                    break;
                }
                split.fold();
                if !split.next_window(tree, self.node, &mut self.rr) {
                    break;
                }
            },
        }
        out.calls().len() - self.base
    }

    /// Takes the outcome of call `j` of the current round. Calls it no
    /// longer waits for (an all-fastest answered) are added to `dropped`, by
    /// their index in the round.
    pub fn absorb(&mut self, tree: &Tree, j: usize, outcome: Result<&[u8], &BackendError>, dropped: &mut Vec<usize>) {
        self.tick += 1;
        let (at, tick, before) = (self.base + j, self.tick, dropped.len());
        let runs = match &mut self.parts {
            Parts::One(r) => std::slice::from_mut(r),
            Parts::Split(split) => &mut split.runs[..],
        };
        for r in runs {
            if r.absorb(tree, at, outcome, tick, dropped) {
                break;
            }
        }
        for d in &mut dropped[before..] {
            *d -= self.base;
        }
    }

    /// The client's reply and the request's effects, once finished: a
    /// multi-get's hits in the client's key order (keys whose route failed
    /// left out), or the first error when every key's route failed.
    pub fn finish(&mut self) -> (Vec<u8>, Effects) {
        match &mut self.parts {
            Parts::One(r) => {
                let d = r.take();
                (d.reply, d.fx)
            }
            Parts::Split(split) => {
                let fx = std::mem::take(&mut split.fx);
                if split.too_large {
                    return (REPLY_TOO_LARGE.to_vec(), fx);
                }
                match split.first_error.take() {
                    Some(e) if !split.any_ok => (e, fx),
                    _ => {
                        let mut reply = std::mem::take(&mut split.reply);
                        reply.extend_from_slice(b"END\r\n");
                        (reply, fx)
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use mwserve::config::ServiceConfig;

    /// A tree of one pool of two (unreached) servers.
    fn tree() -> Arc<Tree> {
        tree_of("route = \"p\"\n[pools.p]\nservers = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n")
    }

    /// The tree of `text`, whose pools are on the servers 127.0.0.1:1 and :2.
    fn tree_of(text: &str) -> Arc<Tree> {
        let c = Config::from_toml(text).unwrap();
        let health = crate::health::Health::new(4, &c.backend, 1, Box::new(|| false));
        let addrs = vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()];
        let side = Arc::new(super::super::queue::Lanes::default());
        Arc::new(Tree::build(&c, &addrs, &[0, 1], side, health.ejection.clone()).unwrap())
    }

    #[test]
    fn a_large_multiget_holds_one_window_of_keys_at_a_time() {
        let tree = tree();
        let keys: Vec<Vec<u8>> = (0..1000).map(|i| format!("k{i}").into_bytes()).collect();
        let work = Work::Request(Request::Get { kind: GetKind::Get, exptime: 0, keys });
        let mut flow = Flow::begin(&tree, Tree::ROOT, work, &mut 0);
        let mut out = Outbox::new(2);
        let mut rounds = 0;
        loop {
            out.clear();
            let n = flow.round(&tree, &mut out);
            if n == 0 {
                break;
            }
            assert_eq!(n, WINDOW.min(1000 - rounds * WINDOW), "one call per key of the window");
            for j in 0..n {
                flow.absorb(&tree, j, Ok(b"END\r\n"), &mut Vec::new());
            }
            rounds += 1;
        }
        assert_eq!(rounds, 1000usize.div_ceil(WINDOW));
        assert_eq!(flow.finish().0, b"END\r\n");
    }

    /// Runs `work` to its end, every call answered `reply`; the calls of
    /// each round and the client's reply.
    fn run(tree: &Arc<Tree>, work: Work, reply: &[u8]) -> (Vec<usize>, Vec<u8>) {
        let mut flow = Flow::begin(tree, Tree::ROOT, work, &mut 0);
        let (mut out, mut rounds) = (Outbox::new(2), Vec::new());
        loop {
            out.clear();
            let n = flow.round(tree, &mut out);
            if n == 0 {
                return (rounds, flow.finish().0);
            }
            rounds.push(n);
            for j in 0..n {
                flow.absorb(tree, j, Ok(reply), &mut Vec::new());
            }
        }
    }

    fn get(keys: usize) -> Work {
        Work::Request(Request::Get { kind: GetKind::Get, exptime: 0, keys: vec![b"k".to_vec(); keys] })
    }

    #[test]
    fn a_key_that_reaches_several_pools_shares_the_window_among_them() {
        let tree = tree_of(
            "route = { type = \"all-sync\", children = [\"p\", \"q\"] }\n\
             [pools.p]\nservers = [\"127.0.0.1:1\"]\n[pools.q]\nservers = [\"127.0.0.1:2\"]\n",
        );
        let (rounds, reply) = run(&tree, get(1000), b"END\r\n");
        assert_eq!(rounds[0], WINDOW, "half as many keys, each to two pools");
        assert_eq!(rounds.len(), 1000usize.div_ceil(WINDOW / 2));
        assert_eq!(reply, b"END\r\n");
    }

    #[test]
    fn hits_past_the_largest_reply_end_a_multiget_with_a_pools_error() {
        // The same 100-byte value named 1000 times: its hits would add up to
        // 120 kB, ten times the largest reply.
        let limits = "[limits]\nmax_value_size = 100\nmax_reply_size = 12000\n";
        let tree = tree_of(&format!("route = \"p\"\n{limits}[pools.p]\nservers = [\"127.0.0.1:1\"]\n"));
        let value = format!("VALUE k 0 100\r\n{}\r\nEND\r\n", "v".repeat(100));
        let (rounds, reply) = run(&tree, get(1000), value.as_bytes());
        assert_eq!(reply, REPLY_TOO_LARGE);
        assert_eq!(rounds, [WINDOW], "the keys after the window that went past it are not asked for");
        let (_, reply) = run(&tree, get(90), value.as_bytes());
        assert_eq!(reply.len(), 90 * (value.len() - 5) + 5, "within it, every hit");
    }
}

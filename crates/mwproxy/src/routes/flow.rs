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

use std::sync::Arc;

use mcproto::Request;

use crate::route::{BackendError, Effects, Outbox, Work};

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
    parts: Parts,
}

/// One route, or one per key of a split multi-get. (The one route is
/// kept inline: it is the common case, and a box would cost an allocation
/// per request.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Parts {
    One(Run),
    Split(Vec<Run>),
}

impl Parts {
    fn runs(&mut self) -> &mut [Run] {
        match self {
            Parts::One(r) => std::slice::from_mut(r),
            Parts::Split(v) => v,
        }
    }
}

impl Flow {
    /// Starts `work` at `node` of `tree`.
    pub fn begin(tree: &Arc<Tree>, node: NodeId, work: Work, rr: &mut usize) -> Flow {
        let parts = match work {
            Work::Request(Request::Get { kind, exptime, keys }) if keys.len() > 1 => {
                let one = |k| Work::Request(Request::Get { kind, exptime, keys: vec![k] });
                Parts::Split(keys.into_iter().map(|k| run::begin(tree, node, one(k), rr)).collect())
            }
            w => Parts::One(run::begin(tree, node, w, rr)),
        };
        *rr = rr.wrapping_add(1);
        Flow { rr: *rr, tick: 0, base: 0, parts }
    }

    /// Adds the next round's calls to `out` and returns how many; 0 means
    /// it is finished and [`Flow::finish`] has the reply.
    pub fn round(&mut self, tree: &Arc<Tree>, out: &mut Outbox) -> usize {
        self.base = out.calls().len();
        for p in self.parts.runs() {
            p.round(tree, &mut self.rr, out);
        }
        out.calls().len() - self.base
    }

    /// Takes the outcome of call `j` of the current round. Calls it no
    /// longer waits for (an all-fastest answered) are added to `dropped`, by
    /// their index in the round.
    pub fn absorb(&mut self, tree: &Tree, j: usize, outcome: Result<&[u8], &BackendError>, dropped: &mut Vec<usize>) {
        self.tick += 1;
        let (at, tick, before) = (self.base + j, self.tick, dropped.len());
        for p in self.parts.runs() {
            if p.absorb(tree, at, outcome, tick, dropped) {
                break;
            }
        }
        for d in &mut dropped[before..] {
            *d -= self.base;
        }
    }

    /// The client's reply and the request's effects, once finished.
    pub fn finish(&mut self) -> (Vec<u8>, Effects) {
        let runs = match &mut self.parts {
            Parts::One(r) => {
                let d = r.take();
                return (d.reply, d.fx);
            }
            Parts::Split(v) => v,
        };
        let mut dones: Vec<Done> = runs.iter_mut().map(Run::take).collect();
        let mut fx = Effects::default();
        for d in &mut dones {
            fx.counters.add(&d.fx.counters);
            fx.hits += d.fx.hits;
            fx.repairs.append(&mut d.fx.repairs);
        }
        if dones.iter().all(|d| d.failure.is_some()) {
            return (std::mem::take(&mut dones[0].reply), fx);
        }
        let mut reply = Vec::new();
        for d in dones.iter().filter(|d| d.failure.is_none()) {
            reply.extend_from_slice(d.reply.strip_suffix(b"END\r\n").unwrap_or(&d.reply));
        }
        reply.extend_from_slice(b"END\r\n");
        (reply, fx)
    }
}

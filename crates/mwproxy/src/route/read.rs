//! Retrievals (`get gets gat gats`, one key or many).
//!
//! Each key has a list of candidate servers: its replicas, starting at the
//! one the read policy picks (plain `get`) or at the primary (`gets`, `gat`,
//! `gats`, so that cas uniques come from the replica that decides a later
//! `cas`). When every server holds every key, a multi-get is instead split
//! evenly over all servers (`sharded`) or sent whole to one (`non-sharded`).
//! Round `i` asks each key's `i`-th candidate, one request per server; keys
//! whose server failed (and, with `miss_failover`, keys it did not have) go to
//! the next round. The values are merged in the client's key order. Keys no
//! replica could answer are reported missing (`partial`) or fail the request
//! (`fail`); a single key always fails. `gat`/`gats` under replication end
//! with a round of `touch ... noreply` to the other replicas of the keys found.

use std::ops::Range;

use mcproto::request::encode_get;
use mcproto::response::encode_value;
use mcproto::{GetKind, Response};

use super::{uses_read_policy, BackendError, Effects, Outbox, Router, REPLY_TOO_LARGE};
use crate::config::{MultigetFailure, MultigetMode};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    /// No server has answered for it yet.
    Open,
    /// A server said it does not have it.
    Missing,
    /// Found (its encoded value is in the arena, unless one server's
    /// reply was taken whole).
    Found,
}

#[derive(Debug, PartialEq, Eq)]
enum Stage {
    Reading,
    Touching,
    Done,
}

/// A retrieval in progress.
#[derive(Debug)]
pub struct ReadPlan {
    kind: GetKind,
    exptime: i32,
    keys: Vec<Vec<u8>>,
    /// Candidate servers, `r` per key.
    cands: Vec<usize>,
    r: usize,
    /// Rounds sent so far.
    round: usize,
    /// Keys asked in the current round, grouped by server (one call each).
    groups: Vec<(usize, Vec<usize>)>,
    /// Keys to ask in the next round.
    next: Vec<usize>,
    state: Vec<Key>,
    spans: Vec<Range<usize>>,
    arena: Vec<u8>,
    /// The error line of the earliest call (by round, then call index) that
    /// failed or was refused: replies come in any order, the reply does not
    /// depend on it.
    first_error: Option<((usize, usize), Vec<u8>)>,
    /// Keys whose server answered with an error line (not retried).
    refused: usize,
    answered: bool,
    failovers: u64,
    /// The reply is one server's, taken whole.
    whole: Option<u64>,
    too_large: bool,
    stage: Stage,
}

impl ReadPlan {
    /// Plans a retrieval of `keys` (in the client's order, repeats allowed).
    pub fn new(kind: GetKind, exptime: i32, keys: Vec<Vec<u8>>, router: &Router, rr: &mut usize) -> ReadPlan {
        let cands = candidates(kind, &keys, router, rr);
        let k = keys.len();
        ReadPlan {
            kind,
            exptime,
            cands,
            r: router.replication,
            round: 0,
            groups: Vec::new(),
            next: (0..k).collect(),
            state: vec![Key::Open; k],
            spans: vec![0..0; k],
            arena: Vec::new(),
            first_error: None,
            refused: 0,
            answered: false,
            failovers: 0,
            whole: None,
            too_large: false,
            stage: Stage::Reading,
            keys,
        }
    }

    pub(super) fn round(&mut self, router: &Router, out: &mut Outbox, reply: &mut Vec<u8>, fx: &mut Effects) {
        if self.stage == Stage::Reading {
            if !self.next.is_empty() && self.round < self.r && self.whole.is_none() {
                let mut todo = std::mem::take(&mut self.next);
                // Keys come back for the next round in the order their
                // calls ended: put them in the client's order again.
                todo.sort_unstable();
                let r = self.r;
                let round = self.round;
                self.groups = group_by_server(&todo, |i| self.cands[i * r + round]);
                for (server, idx) in &self.groups {
                    let cap = router.retrieval_cap(idx.len());
                    let buf = out.call(*server, mcproto::retrieval_reply_len, cap);
                    encode_get(buf, self.kind, self.exptime, idx.iter().map(|&i| self.keys[i].as_slice()));
                }
                self.round += 1;
                return;
            }
            self.finish(router, reply, fx);
            self.stage = Stage::Touching;
        }
        if self.stage == Stage::Touching {
            self.stage = Stage::Done;
            if self.kind.touches() && self.r > 1 {
                self.touch_other_replicas(router, out);
            }
        }
    }

    pub(super) fn absorb(
        &mut self,
        router: &Router,
        i: usize,
        outcome: Result<&[u8], &BackendError>,
        reply: &mut Vec<u8>,
    ) {
        let idx = std::mem::take(&mut self.groups[i].1);
        let server = self.groups[i].0;
        let raw = match outcome {
            Err(e) => {
                self.note_error(i, || {
                    let mut line = Vec::new();
                    router.error_line(server, e, &mut line);
                    line
                });
                self.next.extend(idx.iter().filter(|&&k| self.state[k] == Key::Open));
                return;
            }
            Ok(raw) => raw,
        };
        let Ok(Some((Response::Values(vals), _))) = mcproto::parse_response(raw) else {
            // An error line (the server refused the request): not retried elsewhere.
            self.note_error(i, || raw.to_vec());
            self.refused += idx.len();
            for &k in &idx {
                self.state[k] = Key::Missing;
            }
            return;
        };
        self.answered = true;
        if self.round > 1 {
            self.failovers += 1;
        }
        let all_found = vals.len() == idx.len();
        let whole = self.round == 1 && self.groups.len() == 1 && (all_found || !router.miss_failover || self.r == 1);
        if whole {
            // One server answered for every key: its reply is the client's reply.
            reply.extend_from_slice(raw);
            self.whole = Some(vals.len() as u64);
        }
        let retry_misses = router.miss_failover && self.round < self.r;
        let mut cursor = 0;
        for &k in &idx {
            if cursor < vals.len() && vals[cursor].key == self.keys[k].as_slice() {
                let v = &vals[cursor];
                cursor += 1;
                if whole {
                    self.state[k] = Key::Found;
                    continue;
                }
                let need = v.data.len() + v.key.len() + 64;
                if self.arena.len() + need > router.max_reply || self.arena.try_reserve(need).is_err() {
                    self.too_large = true;
                    continue;
                }
                let start = self.arena.len();
                encode_value(&mut self.arena, v);
                self.spans[k] = start..self.arena.len();
                self.state[k] = Key::Found;
            } else {
                self.state[k] = Key::Missing;
                if retry_misses {
                    self.next.push(k);
                }
            }
        }
    }

    /// Keeps `line` as the error to answer if call `i` of this round is the
    /// earliest one that failed.
    fn note_error(&mut self, i: usize, line: impl FnOnce() -> Vec<u8>) {
        let at = (self.round, i);
        if self.first_error.as_ref().is_none_or(|(first, _)| at < *first) {
            self.first_error = Some((at, line()));
        }
    }

    /// Builds the client's reply once no more rounds are needed.
    fn finish(&mut self, router: &Router, reply: &mut Vec<u8>, fx: &mut Effects) {
        fx.counters.read_failovers += self.failovers;
        let k = self.keys.len() as u64;
        if let Some(hits) = self.whole {
            self.count(k, hits, fx);
            return;
        }
        if self.keys.is_empty() {
            reply.extend_from_slice(b"END\r\n");
            return;
        }
        let unanswered = self.refused + self.state.iter().filter(|s| **s == Key::Open).count();
        if unanswered > 0 {
            let fail_all = router.multiget_failure == MultigetFailure::Fail;
            if !self.answered || self.keys.len() == 1 || fail_all {
                fx.counters.backend_failures += 1;
                reply.extend_from_slice(&self.first_error.take().map(|(_, line)| line).unwrap_or_default());
                return;
            }
            fx.counters.multiget_partial += 1;
        }
        if self.too_large {
            reply.extend_from_slice(REPLY_TOO_LARGE);
            return;
        }
        let mut hits = 0;
        for (k, state) in self.state.iter().enumerate() {
            if *state == Key::Found {
                reply.extend_from_slice(&self.arena[self.spans[k].clone()]);
                hits += 1;
            }
        }
        reply.extend_from_slice(b"END\r\n");
        self.count(k, hits, fx);
        self.arena = Vec::new();
    }

    fn count(&self, keys: u64, hits: u64, fx: &mut Effects) {
        fx.hits = hits;
        let c = &mut fx.counters;
        if self.kind.touches() {
            c.cmd_touch += keys;
            c.touch_hits += hits;
            c.touch_misses += keys.saturating_sub(hits);
        } else {
            c.cmd_get += keys;
            c.get_hits += hits;
            c.get_misses += keys.saturating_sub(hits);
        }
    }

    /// gat/gats read one replica; the keys they found get the new expiry time
    /// on the other replicas too, with `touch ... noreply` (no answer, errors
    /// included, so the connection stays in step), so replicas keep the same lifetime.
    fn touch_other_replicas(&self, router: &Router, out: &mut Outbox) {
        let mut batches: Vec<Vec<u8>> = vec![Vec::new(); router.servers()];
        let mut replicas = Vec::with_capacity(self.r);
        let ring = router.placing();
        for (k, key) in self.keys.iter().enumerate() {
            if self.state[k] != Key::Found {
                continue;
            }
            ring.replicas_into(key, self.r, &mut replicas);
            for &s in &replicas[1..] {
                let b = &mut batches[s];
                b.extend_from_slice(b"touch ");
                b.extend_from_slice(key);
                b.extend_from_slice(format!(" {} noreply\r\n", self.exptime).as_bytes());
            }
        }
        for (s, batch) in batches.iter().enumerate() {
            if !batch.is_empty() {
                out.call_noreply(s).extend_from_slice(batch);
            }
        }
    }
}

/// For each key, the servers to try in order (`r` per key, flattened).
fn candidates(kind: GetKind, keys: &[Vec<u8>], router: &Router, rr: &mut usize) -> Vec<usize> {
    let (n, r, k) = (router.servers(), router.replication, keys.len());
    let turn = *rr;
    *rr = rr.wrapping_add(1);
    let mut cands = Vec::with_capacity(k * r);
    if r == n && kind == GetKind::Get && k > 1 {
        for i in 0..k {
            let first = match router.multiget {
                MultigetMode::Sharded => (turn + i * n / k) % n,
                MultigetMode::NonSharded => turn % n,
            };
            cands.extend((0..r).map(|j| (first + j) % n));
        }
    } else {
        let start = if uses_read_policy(kind, router) { turn % r } else { 0 };
        let mut reps = Vec::with_capacity(r);
        let ring = router.placing();
        for key in keys {
            ring.replicas_into(key, r, &mut reps);
            cands.extend((0..r).map(|j| reps[(start + j) % r]));
        }
    }
    cands
}

/// Groups key positions by the server `pick` assigns, keeping each group in
/// the client's order and the groups in order of first appearance.
pub(crate) fn group_by_server(todo: &[usize], pick: impl Fn(usize) -> usize) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for &i in todo {
        let s = pick(i);
        match groups.iter_mut().find(|(server, _)| *server == s) {
            Some((_, g)) => g.push(i),
            None => groups.push((s, vec![i])),
        }
    }
    groups
}

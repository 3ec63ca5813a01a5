//! One request on its way through the route tree: a small state machine per
//! node, whose leaves are the routing core's own [`Exec`]s, one per pool
//! reached. A round asks every active leaf for its calls (each in its own
//! pool's numbering); a call's outcome goes to the leaf that made it; when a
//! node's children are done, the node decides what comes next (a failover's
//! next child, a warm-up's warm pool) or how their replies combine.
//!
//! Nothing here waits for what the client does not need: copies (shadows,
//! all-async and all-initial children, warm-up fills) go to the side queue
//! (`side.rs`) at once, bounded per node, and a full queue drops the copy
//! and counts it; an all-fastest keeps the first child that answered with a
//! success and names the calls of the others, which an engine that can
//! gives up (`Exchange::give_up`) instead of waiting for them.
//!
//! A node that hands a request to one child (a selector, a shadow,
//! all-initial, a migration outside its window) is that child's run: it
//! counts the request and adds no state.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mcproto::ring::KeyHash;
use mcproto::{MetaKind, Request, Response, StoreKind};

use crate::route::{BackendError, Begin, Effects, Exec, Outbox, Work};

use super::spec::{All, Both, FailOn, Fraction, Kind, NodeId, Op};
use super::tree::{Detached, Pool, Tree};

/// Why a route's reply is a failure, as a failover tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// An error reply or a broken connection.
    Error,
    /// No reply in time.
    Timeout,
    /// No connection.
    Connect,
}

impl Failure {
    fn of(e: &BackendError) -> Failure {
        match e {
            BackendError::Down | BackendError::Connect(_) => Failure::Connect,
            BackendError::Timeout | BackendError::Stalled => Failure::Timeout,
            BackendError::Io(_) | BackendError::Protocol(_) | BackendError::TooLarge => Failure::Error,
        }
    }

    fn counts(self, on: FailOn) -> bool {
        match self {
            Failure::Error => on.error,
            Failure::Timeout => on.timeout,
            Failure::Connect => on.connect,
        }
    }
}

/// What a finished route left: the reply, its effects, whether it failed,
/// and when its last call ended (for all-fastest).
#[derive(Debug, Default)]
pub struct Done {
    /// The reply, in text or meta form.
    pub reply: Vec<u8>,
    /// Counters, hits and repairs (at union positions).
    pub fx: Effects,
    /// Why the reply is a failure, if it is.
    pub failure: Option<Failure>,
    /// The order in which its last call ended.
    pub tick: u64,
}

/// A request at one node.
#[derive(Debug)]
pub struct Run {
    node: NodeId,
    state: State,
}

#[derive(Debug)]
enum State {
    Leaf(Box<Leaf>),
    Failover { at: usize, child: Box<Run>, work: Work },
    Fan { mode: All, children: Vec<Run> },
    WarmUp { warm: bool, child: Box<Run>, work: Work },
    MissFailover { at: usize, child: Box<Run>, work: Work },
    Done(Done),
}

#[derive(Debug)]
struct Leaf {
    pool: usize,
    exec: Exec,
    /// The calls of its current round: the outbox index of the first, how many.
    first: usize,
    calls: usize,
    /// Calls of the round still owed a reply, and whether every reply so
    /// far was a success (all-fastest takes such a leaf's answer at once).
    left: usize,
    round_ok: bool,
    /// The last failure a call of it met.
    failure: Option<Failure>,
    tick: u64,
}

impl Leaf {
    fn finish(&mut self, pool: &Pool) -> Done {
        let reply = std::mem::take(&mut self.exec.reply);
        let mut fx = std::mem::take(&mut self.exec.effects);
        for r in &mut fx.repairs {
            r.0 = pool.pos[r.0];
        }
        let failure = reply.starts_with(b"SERVER_ERROR").then(|| self.failure.unwrap_or(Failure::Error));
        Done { reply, fx, failure, tick: self.tick }
    }
}

/// Starts `work` at `node`; `rr` is the carrier's round-robin position.
pub fn begin(tree: &Arc<Tree>, node: NodeId, work: Work, rr: &mut usize) -> Run {
    tree.stats[node].requests.fetch_add(1, Ordering::Relaxed);
    if node == Tree::ROOT && op_of(&work) == Op::Get && key_of(&work).starts_with(MCROUTER_KEYS) {
        // mcrouter answers these itself; routed as keys they would miss, and
        // a miss reads as "no such thing" to a script that asks.
        tree.stats[node].errors.fetch_add(1, Ordering::Relaxed);
        let reply = b"SERVER_ERROR mwproxy does not answer mcrouter's __mcrouter__ keys\r\n".to_vec();
        return Run { node, state: State::Done(Done { reply, failure: Some(Failure::Error), ..Done::default() }) };
    }
    // (A node that passes the request to one child — a selector, a shadow,
    // all-initial, a migration outside its window — is that child's run.)
    let state = match &tree.spec.nodes[node].kind {
        Kind::Pool(p) => {
            let exec = match Exec::begin(work, &tree.pools[*p].router, rr) {
                Begin::Exec(e) => e,
                Begin::Local(_) => Exec::answered(b"ERROR\r\n".to_vec()),
            };
            State::Leaf(Box::new(Leaf {
                pool: *p,
                exec,
                first: 0,
                calls: 0,
                left: 0,
                round_ok: true,
                failure: None,
                tick: 0,
            }))
        }
        Kind::Prefix { routes, default } => {
            let key = key_of(&work);
            let child = routes.iter().find(|(p, _)| key.starts_with(p)).map(|r| r.1).or(*default);
            return choose(tree, node, child, work, rr);
        }
        Kind::Operation { by_op, default } => {
            let child = by_op[op_of(&work) as usize].or(*default);
            return choose(tree, node, child, work, rr);
        }
        Kind::Failover { children, .. } => {
            State::Failover { at: 0, child: Box::new(begin(tree, children[0], work.clone(), rr)), work }
        }
        Kind::All { mode: All::Async, children, queue } => {
            for &c in children {
                detach(tree, node, *queue, c, work.clone());
            }
            State::Done(Done { reply: default_reply(&work), ..Done::default() })
        }
        Kind::All { mode: All::Initial, children, queue } => {
            for &c in &children[1..] {
                detach(tree, node, *queue, c, work.clone());
            }
            return begin(tree, children[0], work, rr);
        }
        Kind::All { mode, children, .. } => {
            State::Fan { mode: *mode, children: children.iter().map(|&c| begin(tree, c, work.clone(), rr)).collect() }
        }
        Kind::WarmUp { cold, .. } if op_of(&work) == Op::Get => {
            State::WarmUp { warm: false, child: Box::new(begin(tree, *cold, work.clone(), rr)), work }
        }
        Kind::WarmUp { cold, .. } => return begin(tree, *cold, work, rr),
        Kind::MissFailover { children } if op_of(&work) == Op::Get => {
            State::MissFailover { at: 0, child: Box::new(begin(tree, children[0], work.clone(), rr)), work }
        }
        Kind::MissFailover { children } => return begin(tree, children[0], work, rr),
        Kind::Shadow { main, shadows, queue } => {
            for (s, fraction) in shadows {
                if takes(*fraction, key_of(&work)) {
                    detach(tree, node, *queue, *s, work.clone());
                }
            }
            return begin(tree, *main, work, rr);
        }
        Kind::Migrate { from, to, start, window, both } => {
            let op = op_of(&work);
            let phase = tree.phase(*start, *window);
            // mcrouter's way: the rest moves to `to` halfway through the window.
            let half = phase == 1 && *both == Both::Deletes && tree.clock.now() >= start + window / 2;
            match phase {
                0 => return begin(tree, *from, work, rr),
                2 => return begin(tree, *to, work, rr),
                _ if op == Op::Get || (*both == Both::Deletes && op != Op::Delete) => {
                    return begin(tree, if half { *to } else { *from }, work, rr)
                }
                // A write whose outcome depends on the item (cas, add,
                // append, incr, a meta condition): `from`, whose item the
                // client saw, decides; `to` drops its copy, which such a
                // write could have refused to change and kept after the window.
                _ if conditional(&work) => {
                    let drop = invalidation(&work);
                    State::Fan {
                        mode: All::Sync,
                        children: vec![begin(tree, *from, work, rr), begin(tree, *to, drop, rr)],
                    }
                }
                _ => State::Fan {
                    mode: All::Sync,
                    children: vec![begin(tree, *from, work.clone(), rr), begin(tree, *to, work, rr)],
                },
            }
        }
        Kind::Answer { error: None } => State::Done(Done { reply: default_reply(&work), ..Done::default() }),
        Kind::Answer { error: Some(m) } => State::Done(Done {
            reply: format!("SERVER_ERROR {m}\r\n").into_bytes(),
            failure: Some(Failure::Error),
            ..Done::default()
        }),
    };
    if matches!(&state, State::Done(d) if d.failure.is_some()) {
        tree.stats[node].errors.fetch_add(1, Ordering::Relaxed);
    }
    Run { node, state }
}

/// The keys mcrouter answers itself when read (`get __mcrouter__.version`,
/// `__mcrouter__.route(get,key)`, ...): a route tree answers their reads
/// with an error instead of routing them.
pub const MCROUTER_KEYS: &[u8] = b"__mcrouter__.";

/// A selector's choice, or the error a key without a route gets.
fn choose(tree: &Arc<Tree>, node: NodeId, child: Option<NodeId>, work: Work, rr: &mut usize) -> Run {
    match child {
        Some(c) => begin(tree, c, work, rr),
        None => {
            tree.stats[node].errors.fetch_add(1, Ordering::Relaxed);
            let reply = b"SERVER_ERROR no route for this key\r\n".to_vec();
            Run { node, state: State::Done(Done { reply, failure: Some(Failure::Error), ..Done::default() }) }
        }
    }
}

impl Run {
    /// Adds the next round's calls to `out`; true when the route is done
    /// (and made no calls).
    pub fn round(&mut self, tree: &Arc<Tree>, rr: &mut usize, out: &mut Outbox) -> bool {
        loop {
            let done = match &mut self.state {
                State::Done(_) => return true,
                State::Leaf(l) => {
                    let pool = &tree.pools[l.pool];
                    out.numbering(&pool.ids);
                    let first = out.calls().len();
                    let n = l.exec.round(&pool.router, out);
                    if n > 0 {
                        (l.first, l.calls) = (first, n);
                        l.left = out.calls()[first..].iter().filter(|c| c.reply).count();
                        l.round_ok = true;
                        return false;
                    }
                    l.finish(pool)
                }
                State::Failover { at, child, work } => {
                    if !child.round(tree, rr, out) {
                        return false;
                    }
                    let Kind::Failover { children, on } = &tree.spec.nodes[self.node].kind else { unreachable!() };
                    if child.done().failure.is_some_and(|f| f.counts(*on)) && *at + 1 < children.len() {
                        tree.stats[self.node].failovers.fetch_add(1, Ordering::Relaxed);
                        *at += 1;
                        **child = begin(tree, children[*at], work.clone(), rr);
                        continue;
                    }
                    child.take()
                }
                State::Fan { mode, children } => {
                    let mut all = true;
                    for c in children.iter_mut() {
                        all &= c.round(tree, rr, out);
                    }
                    if !all {
                        return false;
                    }
                    combine(*mode, children)
                }
                State::WarmUp { warm, child, work } => {
                    if !child.round(tree, rr, out) {
                        return false;
                    }
                    let Kind::WarmUp { cold, warm: warm_node, exptime, queue } = tree.spec.nodes[self.node].kind else {
                        unreachable!()
                    };
                    if !*warm && is_miss(&child.done().reply, work) {
                        *warm = true;
                        **child = begin(tree, warm_node, work.clone(), rr);
                        continue;
                    }
                    if *warm && child.done().failure.is_none() {
                        fill(tree, self.node, queue, cold, exptime, &child.done().reply, work);
                    }
                    child.take()
                }
                State::MissFailover { at, child, work } => {
                    if !child.round(tree, rr, out) {
                        return false;
                    }
                    let Kind::MissFailover { children } = &tree.spec.nodes[self.node].kind else { unreachable!() };
                    let d = child.done();
                    if (d.failure.is_some() || is_miss(&d.reply, work)) && *at + 1 < children.len() {
                        tree.stats[self.node].failovers.fetch_add(1, Ordering::Relaxed);
                        *at += 1;
                        **child = begin(tree, children[*at], work.clone(), rr);
                        continue;
                    }
                    child.take()
                }
            };
            self.finish(tree, done);
            return true;
        }
    }

    /// Takes the outcome of the call at outbox index `at` (of this round);
    /// false when none of this route's leaves made it. An all-fastest whose
    /// child has just answered with a success keeps that child alone: the
    /// outbox indices of the others' calls go to `dropped`, for the engine
    /// to stop waiting for them.
    pub fn absorb(
        &mut self,
        tree: &Tree,
        at: usize,
        outcome: Result<&[u8], &BackendError>,
        tick: u64,
        dropped: &mut Vec<usize>,
    ) -> bool {
        match &mut self.state {
            State::Leaf(l) => {
                if at < l.first || at >= l.first + l.calls {
                    return false;
                }
                match outcome {
                    Err(e) => {
                        l.failure = Some(Failure::of(e));
                        l.round_ok = false;
                    }
                    Ok(reply) if reply.starts_with(b"SERVER_ERROR") => l.round_ok = false,
                    Ok(_) => {}
                }
                l.left = l.left.saturating_sub(1);
                l.exec.absorb(&tree.pools[l.pool].router, at - l.first, outcome);
                l.tick = tick;
                true
            }
            State::Failover { child: c, .. }
            | State::WarmUp { child: c, .. }
            | State::MissFailover { child: c, .. } => c.absorb(tree, at, outcome, tick, dropped),
            State::Fan { mode, children } => {
                let Some(k) = children.iter_mut().position(|c| c.absorb(tree, at, outcome, tick, dropped)) else {
                    return false;
                };
                if *mode == All::Fastest && children.len() > 1 && children[k].answered() {
                    let winner = children.swap_remove(k);
                    for c in children.iter() {
                        c.calls(dropped);
                    }
                    children.clear();
                    children.push(winner);
                }
                true
            }
            State::Done(_) => false,
        }
    }

    /// Whether it is a pool whose round's replies have all come, every one
    /// a success.
    fn answered(&self) -> bool {
        matches!(&self.state, State::Leaf(l) if l.left == 0 && l.round_ok)
    }

    /// The outbox indices of the calls of its current round.
    fn calls(&self, out: &mut Vec<usize>) {
        match &self.state {
            State::Leaf(l) => out.extend(l.first..l.first + l.calls),
            State::Failover { child: c, .. }
            | State::WarmUp { child: c, .. }
            | State::MissFailover { child: c, .. } => c.calls(out),
            State::Fan { children, .. } => children.iter().for_each(|c| c.calls(out)),
            State::Done(_) => {}
        }
    }

    /// The finished route's result (only after [`Run::round`] said done).
    pub fn done(&self) -> &Done {
        match &self.state {
            State::Done(d) => d,
            _ => unreachable!("a route's result before it is done"),
        }
    }

    /// Takes the finished route's result.
    pub fn take(&mut self) -> Done {
        match std::mem::replace(&mut self.state, State::Done(Done::default())) {
            State::Done(d) => d,
            _ => unreachable!("a route's result before it is done"),
        }
    }

    fn finish(&mut self, tree: &Tree, done: Done) {
        if done.failure.is_some() {
            tree.stats[self.node].errors.fetch_add(1, Ordering::Relaxed);
        }
        self.state = State::Done(done);
    }
}

/// The reply of an all-sync, all-majority or all-fastest node; the repairs
/// of every child are kept.
fn combine(mode: All, children: &mut [Run]) -> Done {
    let mut dones: Vec<Done> = children.iter_mut().map(Run::take).collect();
    let first_failure = dones.iter().position(|d| d.failure.is_some());
    let pick = match mode {
        All::Majority => {
            let keys: Vec<Vec<u8>> = dones.iter().map(|d| agreement(&d.reply)).collect();
            let n = keys.len();
            (0..n).find(|&i| keys.iter().filter(|k| **k == keys[i]).count() * 2 > n).or(first_failure).unwrap_or(0)
        }
        // The first success to arrive; when every child failed, the last failure.
        All::Fastest => {
            let by_tick = |ok: bool| {
                let i = dones.iter().enumerate().filter(|(_, d)| d.failure.is_none() == ok);
                if ok {
                    i.min_by_key(|(_, d)| d.tick).map(|(i, _)| i)
                } else {
                    i.max_by_key(|(_, d)| d.tick).map(|(i, _)| i)
                }
            };
            by_tick(true).or(by_tick(false)).unwrap_or(0)
        }
        _ => first_failure.unwrap_or(0),
    };
    let tick = dones.iter().map(|d| d.tick).max().unwrap_or(0);
    let mut done = std::mem::take(&mut dones[pick]);
    for other in &mut dones {
        done.fx.repairs.append(&mut other.fx.repairs);
    }
    done.tick = tick;
    done
}

/// What two replies must share to agree: the reply, without what each
/// server says of its own copy — the cas uniques of `VALUE` lines, a meta
/// reply's `c` (cas), `t` (time to live), `h` (hit before) and `l` (last
/// access) flags. Replies here are in text or meta form (servers are spoken
/// to in text; a binary get is carried as a meta get with `c`): without
/// that, binary and meta gets never agreed and the first child answered, a
/// minority of one.
fn agreement(reply: &[u8]) -> Vec<u8> {
    if reply.starts_with(b"VA ") || reply.starts_with(b"HD") {
        let end = reply.windows(2).position(|w| w == b"\r\n").unwrap_or(reply.len());
        let mut out: Vec<u8> = Vec::with_capacity(reply.len());
        for (i, token) in reply[..end].split(|&b| b == b' ').enumerate() {
            if i > 0 && matches!(token.first(), Some(b'c' | b't' | b'h' | b'l')) {
                continue;
            }
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(token);
        }
        out.extend_from_slice(&reply[end..]);
        return out;
    }
    match mcproto::parse_response(reply) {
        Ok(Some((Response::Values(values), _))) => {
            let mut out = Vec::new();
            for mut v in values {
                v.cas = None;
                mcproto::response::encode_value(&mut out, &v);
            }
            out
        }
        _ => reply.to_vec(),
    }
}

/// Hands a copy of `work` for `node` to the side queue on behalf of
/// `owner`, unless `owner` already has `limit` copies waiting or on their
/// way, or [`QUEUE_BYTES`] of them, or the copies of every node together
/// hold their budget ([`Lanes::reserve`](super::queue::Lanes::reserve)).
fn detach(tree: &Arc<Tree>, owner: NodeId, limit: usize, node: NodeId, work: Work) {
    let stats = &tree.stats[owner];
    let bytes = work_bytes(&work) as u64;
    let held = stats.queued.fetch_add(1, Ordering::Relaxed);
    let held_bytes = stats.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
    let over = held >= limit as u64 || held_bytes + bytes > QUEUE_BYTES;
    let reserved = !over && tree.side.reserve(bytes);
    if !reserved || !tree.side.lane(tree.lane[node]).push(Detached { tree: tree.clone(), owner, node, work, bytes }) {
        if reserved {
            tree.side.release(bytes);
        }
        stats.queued.fetch_sub(1, Ordering::Relaxed);
        stats.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        stats.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    stats.sent.fetch_add(1, Ordering::Relaxed);
}

/// The bytes of requests one node may hold waiting or on their way, beside
/// its `queue` of copies: with values up to 1 MiB, a thousand copies could
/// otherwise hold a gigabyte.
pub const QUEUE_BYTES: u64 = 64 << 20;

/// What a copy of `work` holds, roughly: its key and value.
fn work_bytes(work: &Work) -> usize {
    let body = match work {
        Work::Request(Request::Store { data, .. }) => data.len(),
        Work::Request(Request::Meta { raw, .. }) => raw.len(),
        _ => 0,
    };
    key_of(work).len() + body + 64
}

/// Fills the cold route with what the warm one answered: an `add` (a value
/// the cold pool got meanwhile wins) with the warm-up's exptime.
fn fill(tree: &Arc<Tree>, owner: NodeId, limit: usize, cold: NodeId, exptime: u32, reply: &[u8], work: &Work) {
    let add = |key: &[u8], flags: u32, data: &[u8]| {
        (!key.iter().any(|&b| b <= b' ')).then(|| {
            Work::Request(Request::Store {
                kind: StoreKind::Add,
                key: key.to_vec(),
                flags,
                exptime: exptime as i32,
                cas: 0,
                data: data.to_vec(),
                noreply: true,
            })
        })
    };
    let mut fills = Vec::new();
    match (work, mcproto::parse_response(reply)) {
        (Work::Request(Request::Get { .. }), Ok(Some((Response::Values(values), _)))) => {
            fills.extend(values.iter().filter_map(|v| add(v.key, v.flags, v.data)));
        }
        (
            Work::Request(Request::Meta { kind: MetaKind::Get, key, .. }),
            Ok(Some((Response::MetaValue { line, data }, _))),
        ) => {
            // The client flags come back only when the client asked for them (`f`).
            let flags = line.split(|&b| b == b' ').find_map(|t| t.strip_prefix(b"f"));
            if let Some(flags) = flags.and_then(|f| std::str::from_utf8(f).ok()?.parse().ok()) {
                fills.extend(add(key, flags, data));
            }
        }
        _ => {}
    }
    for f in fills {
        detach(tree, owner, limit, cold, f);
    }
}

/// Whether a single-key retrieval's reply is a miss.
fn is_miss(reply: &[u8], work: &Work) -> bool {
    match work {
        Work::Request(Request::Get { .. }) => reply == b"END\r\n",
        Work::Request(Request::Meta { .. }) => reply.is_empty() || reply.starts_with(b"EN"),
        _ => false,
    }
}

/// What all-async answers at once (mcrouter's default reply): a miss, or
/// nothing stored, found or changed.
fn default_reply(work: &Work) -> Vec<u8> {
    let r: &[u8] = match work {
        Work::DropStale { reply, .. } => return reply.map(|r| r.as_bytes().to_vec()).unwrap_or_default(),
        Work::Request(Request::Get { .. }) => b"END\r\n",
        Work::Request(Request::Store { .. }) => b"NOT_STORED\r\n",
        Work::Request(Request::Meta { kind, raw, .. }) => return crate::route::meta_miss_reply(*kind, raw),
        Work::Request(_) => b"NOT_FOUND\r\n",
    };
    r.to_vec()
}

/// The key a request is routed by.
pub fn key_of(work: &Work) -> &[u8] {
    match work {
        Work::DropStale { key, .. } => key,
        Work::Request(r) => match r {
            Request::Get { keys, .. } => keys.first().map_or(&[], Vec::as_slice),
            Request::Store { key, .. }
            | Request::Delete { key, .. }
            | Request::Arith { key, .. }
            | Request::Touch { key, .. }
            | Request::Meta { key, .. } => key,
            _ => &[],
        },
    }
}

/// Whether a write's outcome depends on the item it finds (see
/// [`crate::route::meta_conditional`] for the meta forms).
fn conditional(work: &Work) -> bool {
    match work {
        Work::DropStale { .. } => false,
        Work::Request(r) => match r {
            Request::Store { kind, .. } => *kind != StoreKind::Set,
            Request::Arith { .. } => true,
            Request::Meta { kind, raw, .. } => crate::route::meta_conditional(*kind, raw),
            _ => false,
        },
    }
}

/// A delete of the key `work` names, in its protocol's form (a text
/// request's key is a text token; a meta one keeps its `b`).
fn invalidation(work: &Work) -> Work {
    match work {
        Work::Request(Request::Meta { key, raw, .. }) => Work::Request(Request::Meta {
            kind: MetaKind::Delete,
            key: key.clone(),
            raw: crate::route::meta_delete_of(raw),
        }),
        _ => Work::Request(Request::Delete { key: key_of(work).to_vec(), noreply: false }),
    }
}

/// The class of a request, as the operation selector sees it.
pub fn op_of(work: &Work) -> Op {
    match work {
        Work::DropStale { .. } => Op::Set,
        Work::Request(r) => match r {
            Request::Store { .. } => Op::Set,
            Request::Delete { .. } => Op::Delete,
            Request::Arith { .. } => Op::Arith,
            Request::Touch { .. } => Op::Touch,
            Request::Meta { kind: MetaKind::Set, .. } => Op::Set,
            Request::Meta { kind: MetaKind::Delete, .. } => Op::Delete,
            Request::Meta { kind: MetaKind::Arith, .. } => Op::Arith,
            _ => Op::Get,
        },
    }
}

/// Whether a shadow takes a copy of a request for `key`: by where the key's
/// hash falls (CRC-32, independent of the pools' own placement), or by a draw.
fn takes(f: Fraction, key: &[u8]) -> bool {
    match f {
        Fraction::Keys(from, to) => {
            let at = f64::from(KeyHash::Crc32a.hash(key)) / (f64::from(u32::MAX) + 1.0);
            at >= from && (at < to || to >= 1.0)
        }
        Fraction::Requests(p) => draw() < p,
    }
}

/// A number in [0, 1), from a shared splitmix64 sequence.
fn draw() -> f64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x2545_F491_4F6C_DD1D);
    let mut z = NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

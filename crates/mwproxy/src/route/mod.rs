//! The routing core, without sockets or threads.
//!
//! A client request becomes an [`Exec`]: a small state machine that says, one
//! round at a time, which servers get which bytes ([`Exec::round`] fills an
//! [`Outbox`]), takes each server's reply or failure as it comes
//! ([`Exec::absorb`]), and ends with the client's reply, the counters the
//! request moved and the repairs it leaves behind. Most requests need one
//! round; a read whose server failed takes a second one on the next replica,
//! a replicated `cas` copies the value in a second one, a `gat` under
//! replication touches the other replicas in a last round that waits for no
//! answer.
//!
//! The engines drive it: a pool worker sends a round and blocks on the
//! replies, an async loop hands each reply over as it arrives; either way
//! the calls of a round may end in any order, and the reply does not depend
//! on it. Nothing here knows about timeouts or connections, and of health
//! only which servers are ejected (`health::Ejection`, when ejection is on:
//! requests are placed on the ring without them); a server that could not
//! be used is simply a [`BackendError`] outcome.

mod gather;
mod meta;
mod read;
mod write;

use mwserve::stream::Addr;
use std::sync::Arc;

use arc_swap::ArcSwap;

use mcproto::ring::Ring;
use mcproto::{GetKind, MalformedResponse, MetaKind, Request};
use mwstats::OpKind;

pub use crate::backend_error::BackendError;
use crate::config::{Config, LimitsConfig, MultigetFailure, MultigetMode, ReadPolicy, RoutingConfig};
use crate::health::Ejection;
use crate::stats::WorkerCounters;
pub use meta::{conditional as meta_conditional, delete_of as meta_delete_of, miss_reply as meta_miss_reply};

/// How a reply is delimited and checked: [`mcproto::retrieval_reply_len`] and
/// [`mcproto::status_reply_len`] for the text commands (a reply of another
/// kind is a protocol error), [`mcproto::meta_reply_len`] for a meta command
/// sent with an `mn` after it.
pub type Framing = fn(&[u8]) -> Result<Option<usize>, MalformedResponse>;

/// memcached's answer when a retrieval reply would not fit in memory.
pub const REPLY_TOO_LARGE: &[u8] = b"SERVER_ERROR out of memory writing get response\r\n";

/// One request to one server in the current round.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// The server's number (`Servers`): the routing core names servers by
    /// their position in its configuration, the outbox by their number.
    pub server: usize,
    /// How its reply is delimited.
    pub framing: Framing,
    /// Largest reply it may legitimately get, in bytes.
    pub cap: usize,
    /// Whether a reply comes at all (`noreply` commands get none).
    pub reply: bool,
}

/// What a round sends: the bytes for each server, and the calls in the order
/// they were made. A server's replies come back in the order of its calls.
///
/// The routing core names a server by its position in the configuration it
/// routes with; the outbox files the bytes under the server's number, which
/// outlives configurations (a reload may add and remove servers while
/// requests routed with the old configuration are still on their way): the
/// position-to-number map of the request's configuration is set with
/// [`Outbox::numbering`] before its round.
#[derive(Debug)]
pub struct Outbox {
    bufs: Vec<Vec<u8>>,
    calls: Vec<Call>,
    /// Position -> number, for the request being planned.
    ids: Vec<usize>,
}

impl Outbox {
    /// An empty outbox for `servers` servers, numbered as their positions.
    pub fn new(servers: usize) -> Outbox {
        Outbox { bufs: vec![Vec::new(); servers], calls: Vec::new(), ids: (0..servers).collect() }
    }

    /// The next calls name servers by position in a configuration whose
    /// servers have the numbers `ids`.
    pub fn numbering(&mut self, ids: &[usize]) {
        if self.ids != ids {
            self.ids.clear();
            self.ids.extend_from_slice(ids);
            let most = ids.iter().max().map_or(0, |m| m + 1);
            if self.bufs.len() < most {
                self.bufs.resize_with(most, Vec::new);
            }
        }
    }

    /// Forgets the previous round, keeping allocations (shrinking huge ones).
    pub fn clear(&mut self) {
        for b in &mut self.bufs {
            b.clear();
            if b.capacity() > 1 << 20 {
                b.shrink_to(64 * 1024);
            }
        }
        self.calls.clear();
    }

    /// Adds a call expecting a reply; the request's bytes go into the returned buffer.
    pub fn call(&mut self, server: usize, framing: Framing, cap: usize) -> &mut Vec<u8> {
        let server = self.ids[server];
        self.calls.push(Call { server, framing, cap, reply: true });
        &mut self.bufs[server]
    }

    /// Adds a call that gets no reply (a `noreply` command).
    pub fn call_noreply(&mut self, server: usize) -> &mut Vec<u8> {
        let server = self.ids[server];
        self.calls.push(Call { server, framing: mcproto::response_len, cap: 0, reply: false });
        &mut self.bufs[server]
    }

    /// The calls of this round, in order.
    pub fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// The bytes for server number `server`.
    pub fn bytes(&self, server: usize) -> &[u8] {
        self.bufs.get(server).map_or(&[], Vec::as_slice)
    }

    /// One more than the highest server number it has bytes for.
    pub fn servers(&self) -> usize {
        self.bufs.len()
    }
}

/// The routing rules, as configured.
#[derive(Clone, Debug)]
pub struct Router {
    /// Key placement.
    pub ring: Ring,
    /// Server addresses, for `SERVER_ERROR backend <addr> ...` lines.
    pub addrs: Vec<String>,
    /// Copies of each key.
    pub replication: usize,
    /// Replicas that must confirm a write before it is acknowledged.
    pub write_quorum: usize,
    /// Which replica serves a read.
    pub read_policy: ReadPolicy,
    /// Multi-gets when every server holds every key.
    pub multiget: MultigetMode,
    /// Multi-get answer when some servers fail.
    pub multiget_failure: MultigetFailure,
    /// A key missing on one replica is looked up on the next.
    pub miss_failover: bool,
    /// Largest value a server may hold.
    pub max_value: usize,
    /// Largest retrieval reply the proxy builds.
    pub max_reply: usize,
    /// With ejection on: the servers' state and the ring without the ejected ones.
    live: Option<Arc<Live>>,
}

/// What the ring is built from when servers can be ejected, and the last
/// ring built (for the servers off the ring then).
#[derive(Debug)]
struct Live {
    ejection: Arc<Ejection>,
    /// The number (`Servers`) of the server at each position.
    ids: Vec<usize>,
    servers: Vec<mcproto::ring::ServerSpec>,
    placement: mcproto::ring::Placement,
    last: ArcSwap<(Vec<bool>, Ring)>,
}

/// The ring a request is placed with: the configured one, or the ring
/// without the servers ejected now.
pub enum Placing<'a> {
    /// Every server on the ring.
    Full(&'a Ring),
    /// Some servers ejected.
    Without(arc_swap::Guard<Arc<(Vec<bool>, Ring)>>),
}

impl std::ops::Deref for Placing<'_> {
    type Target = Ring;
    fn deref(&self) -> &Ring {
        match self {
            Placing::Full(r) => r,
            Placing::Without(g) => &g.1,
        }
    }
}

impl Router {
    /// Ejects servers as `ejection` says (when it is on in `config`); `ids`
    /// are the numbers of the servers at each position.
    pub fn with_ejection(self, config: &Config, ejection: Arc<Ejection>, ids: &[usize]) -> Router {
        self.ejecting(config.backend.eject, &config.effective_routing(), ejection, ids)
    }

    /// With `eject` on, places keys without the servers `ejection` takes
    /// off the ring; `r` is the pool this router places keys on, `ids` the
    /// numbers of its servers.
    pub fn ejecting(mut self, eject: bool, r: &RoutingConfig, ejection: Arc<Ejection>, ids: &[usize]) -> Router {
        if eject {
            let ring = Ring::with(r.placement(), &r.servers);
            self.live = Some(Arc::new(Live {
                ejection,
                ids: ids.to_vec(),
                servers: r.servers.clone(),
                placement: r.placement(),
                last: ArcSwap::from_pointee((vec![true; ids.len()], ring)),
            }));
        }
        self
    }

    /// The ring to place a request with now: without the servers ejected.
    pub fn placing(&self) -> Placing<'_> {
        let Some(live) = &self.live else { return Placing::Full(&self.ring) };
        let now = live.ejection.now_ms();
        let last = live.last.load();
        let on = |p: usize| !live.ejection.off_ring(live.ids[p], now);
        if (0..live.ids.len()).all(|p| on(p) == last.0[p]) {
            return Placing::Without(last);
        }
        let mask: Vec<bool> = (0..live.ids.len()).map(on).collect();
        let ring = Ring::with_live(live.placement, &live.servers, &mask);
        live.last.store(Arc::new((mask, ring)));
        Placing::Without(live.last.load())
    }

    /// The rules of `config`, for servers at `addrs`.
    pub fn new(config: &Config, addrs: &[Addr]) -> Router {
        let addrs = addrs.iter().map(|a| a.to_string()).collect();
        Router::of(&config.effective_routing(), &config.limits, addrs)
    }

    /// The rules of one pool `r`, whose servers are at `addrs`.
    pub fn of(r: &RoutingConfig, limits: &LimitsConfig, addrs: Vec<String>) -> Router {
        Router {
            ring: Ring::with(r.placement(), &r.servers),
            addrs,
            replication: r.replication,
            write_quorum: r.quorum(),
            read_policy: r.read_policy,
            multiget: r.multiget,
            multiget_failure: r.multiget_failure,
            miss_failover: r.miss_failover,
            max_value: limits.max_value_size,
            max_reply: limits.max_reply_size,
            live: None,
        }
    }

    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.addrs.len()
    }

    /// The key's replicas, primary first.
    pub fn replicas(&self, key: &[u8]) -> Vec<usize> {
        self.placing().replicas(key, self.replication)
    }

    /// Appends `SERVER_ERROR backend <addr> <why>`.
    pub fn error_line(&self, server: usize, e: &BackendError, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("SERVER_ERROR backend {} {}\r\n", self.addrs[server], e).as_bytes());
    }

    /// The largest reply a retrieval of `keys` keys may get from one server.
    fn retrieval_cap(&self, keys: usize) -> usize {
        keys.saturating_mul(self.max_value.saturating_add(512)).saturating_add(16).min(self.max_reply)
    }

    /// The largest reply a command that returns at most one value may get.
    fn single_cap(&self) -> usize {
        self.max_value.saturating_add(4096).min(self.max_reply.max(4096))
    }
}

/// What a request does besides its reply: counters, hits, and the keys whose
/// replicas must be repaired.
#[derive(Debug, Default)]
pub struct Effects {
    /// memcached-style counters.
    pub counters: WorkerCounters,
    /// Keys found (retrievals).
    pub hits: u64,
    /// `(server, key)`: the key must be deleted on that server before it
    /// serves again, because a write left it different from the other replicas.
    pub repairs: Vec<(usize, Vec<u8>)>,
}

/// What the proxy has to do for one parsed input.
#[derive(Clone, Debug)]
pub enum Work {
    /// A client request.
    Request(Request),
    /// A `set` whose value was too large: drop the key's old value on its
    /// replicas (as memcached does) and answer `reply`.
    DropStale {
        /// The key to delete.
        key: Vec<u8>,
        /// memcached's error line, or `None` under noreply.
        reply: Option<&'static str>,
    },
}

impl Work {
    /// The results-format class of the work and the number of keys it names.
    pub fn class(&self) -> (OpKind, u64) {
        match self {
            Work::Request(r) => classify(r),
            Work::DropStale { .. } => (OpKind::Set, 1),
        }
    }

    /// Whether the client wants no reply.
    pub fn noreply(&self) -> bool {
        match self {
            Work::Request(r) => r.noreply(),
            Work::DropStale { reply, .. } => reply.is_none(),
        }
    }

    /// Whether it changes items (and so must not overtake or be overtaken by
    /// requests for the same keys under replication).
    pub fn writes(&self) -> bool {
        match self {
            Work::Request(Request::Get { kind, .. }) => kind.touches(),
            Work::Request(Request::Meta { kind, .. }) => *kind != MetaKind::Debug && *kind != MetaKind::Noop,
            Work::Request(Request::Version | Request::Stats { .. } | Request::Quit) => false,
            _ => true,
        }
    }

    /// The keys it names; `None` when it concerns every key (flush_all).
    pub fn keys(&self) -> Option<Vec<&[u8]>> {
        match self {
            Work::DropStale { key, .. } => Some(vec![key]),
            Work::Request(r) => match r {
                Request::Get { keys, .. } => Some(keys.iter().map(Vec::as_slice).collect()),
                Request::Store { key, .. }
                | Request::Delete { key, .. }
                | Request::Arith { key, .. }
                | Request::Touch { key, .. }
                | Request::Meta { key, .. } => Some(vec![key]),
                Request::FlushAll { .. } | Request::Verbosity { .. } | Request::CacheMemlimit { .. } => None,
                Request::Version | Request::Stats { .. } | Request::Quit => Some(Vec::new()),
            },
        }
    }
}

/// The results-format class of a request and the keys it names.
pub fn classify(req: &Request) -> (OpKind, u64) {
    match req {
        Request::Get { keys, .. } if keys.len() == 1 => (OpKind::Get, 1),
        Request::Get { keys, .. } if keys.len() > 1 => (OpKind::Multiget, keys.len() as u64),
        Request::Store { .. } => (OpKind::Set, 1),
        Request::Delete { .. } => (OpKind::Delete, 1),
        Request::Arith { .. } | Request::Touch { .. } => (OpKind::Other, 1),
        Request::Meta { kind, .. } => match kind {
            MetaKind::Get => (OpKind::Get, 1),
            MetaKind::Set => (OpKind::Set, 1),
            MetaKind::Delete => (OpKind::Delete, 1),
            MetaKind::Arith | MetaKind::Debug => (OpKind::Other, 1),
            MetaKind::Noop => (OpKind::Other, 0),
        },
        _ => (OpKind::Other, 0),
    }
}

/// How a request starts (short-lived: moved once, so its size does not matter).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Begin {
    /// It goes to servers.
    Exec(Exec),
    /// The proxy answers it from its own state (`stats settings`, `stats backends`, ...).
    Local(Request),
}

#[derive(Debug)]
enum Plan {
    Read(read::ReadPlan),
    Write(write::WritePlan),
    Cas(write::CasPlan),
    Meta(meta::MetaPlan),
    Gather(gather::GatherPlan),
    Answered,
}

/// One request on its way through the servers.
#[derive(Debug)]
pub struct Exec {
    plan: Plan,
    /// The client's reply, complete once [`Exec::round`] returns 0.
    pub reply: Vec<u8>,
    /// What the request did besides replying.
    pub effects: Effects,
}

impl Exec {
    /// Starts `work`; `rr` is the caller's round-robin position (reads and
    /// multi-get placement), advanced as used.
    pub fn begin(work: Work, router: &Router, rr: &mut usize) -> Begin {
        let plan = match work {
            Work::DropStale { key, reply } => Plan::Write(write::WritePlan::drop_stale(key, reply, router)),
            Work::Request(req) => match req {
                Request::Get { kind, exptime, keys } => {
                    Plan::Read(read::ReadPlan::new(kind, exptime, keys, router, rr))
                }
                Request::Store { kind: mcproto::StoreKind::Cas, .. } => Plan::Cas(write::CasPlan::new(req, router)),
                Request::Store { .. }
                | Request::Delete { .. }
                | Request::Arith { .. }
                | Request::Touch { .. }
                | Request::FlushAll { .. }
                | Request::Verbosity { .. }
                | Request::CacheMemlimit { .. } => Plan::Write(write::WritePlan::new(req, router)),
                Request::Meta { kind: MetaKind::Noop, .. } => {
                    return Begin::Exec(Exec::answered(b"MN\r\n".to_vec()));
                }
                Request::Meta { kind, key, raw } => Plan::Meta(meta::MetaPlan::new(kind, key, raw, router, rr)),
                Request::Quit => return Begin::Exec(Exec::answered(Vec::new())),
                Request::Version => Plan::Gather(gather::GatherPlan::new(req, router)),
                Request::Stats { ref args } if args.is_empty() => Plan::Gather(gather::GatherPlan::new(req, router)),
                Request::Stats { .. } => return Begin::Local(req),
            },
        };
        Begin::Exec(Exec { plan, reply: Vec::new(), effects: Effects::default() })
    }

    /// A finished request that the proxy answers from its own state and what
    /// every server said to it (`version`, `stats`); taken once.
    pub fn take_gathered(&mut self) -> Option<(Request, Vec<Answer>)> {
        match &mut self.plan {
            Plan::Gather(p) => p.take(),
            _ => None,
        }
    }

    /// A request already answered.
    pub fn answered(reply: Vec<u8>) -> Exec {
        Exec { plan: Plan::Answered, reply, effects: Effects::default() }
    }

    /// Adds the next round's calls to `out` and returns how many; 0 means the
    /// request is finished and [`Exec::reply`] holds the client's reply.
    /// Every call of a round that gets a reply must be absorbed before the
    /// next round.
    pub fn round(&mut self, router: &Router, out: &mut Outbox) -> usize {
        let before = out.calls().len();
        let (reply, fx) = (&mut self.reply, &mut self.effects);
        match &mut self.plan {
            Plan::Read(p) => p.round(router, out, reply, fx),
            Plan::Write(p) => p.round(router, out, reply, fx),
            Plan::Cas(p) => p.round(router, out, reply, fx),
            Plan::Meta(p) => p.round(router, out, reply, fx),
            Plan::Gather(p) => p.round(out),
            Plan::Answered => {}
        }
        out.calls().len() - before
    }

    /// Takes the outcome of call `i` of the current round (counted from 0 in
    /// the order [`Exec::round`] made them), in any order of `i`. Calls
    /// without a reply are not absorbed.
    pub fn absorb(&mut self, router: &Router, i: usize, outcome: Result<&[u8], &BackendError>) {
        match &mut self.plan {
            Plan::Read(p) => p.absorb(router, i, outcome, &mut self.reply),
            Plan::Write(p) => p.absorb(i, outcome),
            Plan::Cas(p) => p.absorb(i, outcome),
            Plan::Meta(p) => p.absorb(i, outcome),
            Plan::Gather(p) => p.absorb(i, outcome),
            Plan::Answered => {}
        }
    }
}

/// An answer as a server gave it, or why it gave none.
pub type Answer = Result<Vec<u8>, BackendError>;

/// Keeps a copy of an outcome.
pub(crate) fn own(outcome: Result<&[u8], &BackendError>) -> Answer {
    outcome.map(<[u8]>::to_vec).map_err(Clone::clone)
}

/// Whether a server's reply reports success.
pub(crate) fn is_success(raw: &[u8]) -> bool {
    matches!(mcproto::parse_response(raw), Ok(Some((r, _))) if r.is_success())
}

/// Whether a retrieval reads the replica the read policy picks (plain `get`)
/// rather than the primary (`gets`/`gat`/`gats`, so cas uniques come from the
/// replica that decides a later `cas`).
pub(crate) fn uses_read_policy(kind: GetKind, router: &Router) -> bool {
    kind == GetKind::Get && router.read_policy == ReadPolicy::RoundRobin
}

#[cfg(test)]
mod tests;

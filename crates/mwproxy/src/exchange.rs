//! One carrier's exchange with one server, without I/O: the rules both
//! engines follow when they talk to a server, in one place.
//!
//! A carrier (a pool worker, an async event loop) keeps an [`Exchange`] next
//! to each of its server connections. The engine only moves bytes; the
//! exchange decides everything else:
//!
//! - **Beginning** a round's calls ([`Exchange::begin`]): whether they may go
//!   to the server at all — a server that is down or stalled gets nothing and
//!   the calls fail at once, and after a backoff exactly one carrier becomes
//!   the probe (`health.rs`) — and which repairs go first on the same
//!   connection (`repair.rs`); a new connection to a server that requires a
//!   login (`-Y`) sends it before anything else. The calls are remembered in the order they are
//!   written, because a server answers in that order.
//! - **Waiting** ([`Exchange::check`]): a reply later than the timeout fails
//!   the connection; a server quiet for a slice while other servers answer is
//!   stalled, and then the oldest call stays waiting as the probe if this
//!   carrier may probe, while every other call is given up at once
//!   (`stalled`) and its late reply is read and dropped.
//! - **Finishing**: every call ends exactly once, with its reply, its failure
//!   or its give-up, and a [`BackendFact`] for the measurements. A reply brings
//!   the server back up and ends the probe; a finished repair batch is counted;
//!   a failed connection ([`Exchange::fail`]) ends every call in flight with
//!   the error, gives the repairs back for the next exchange and marks the
//!   server down. Nothing is ever sent twice.
//!
//! Replies may end calls of any request in any order: the routing core takes
//! them as they come.

use mwserve::stream::Addr;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::ServerName;

use crate::config::BackendConfig;
use crate::health::{Health, WorkWaiting};
use crate::recorder::BackendFact;
use crate::repair::{Batch, Repairs, REPAIR_CAP};
use crate::route::{BackendError, Framing, Outbox};

/// Where a server is and how it is spoken to: its address and, with TLS,
/// the name its certificate must carry. A server is its endpoint: the same
/// endpoint in a reloaded configuration is the same server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Resolved address.
    pub addr: Addr,
    /// What its certificate must say, when it is spoken to with TLS.
    pub tls_name: Option<ServerName<'static>>,
}

/// The servers as every carrier shares them: where they are, their health,
/// the repairs waiting for them, and how long a carrier waits for them.
///
/// Servers are numbered once and for all: a server keeps its number (its
/// slot) for the life of the process, so that a reload that adds or removes
/// servers leaves the others' connections, health and repairs alone. Each
/// configuration's routing (`Generation`) maps its own server positions to
/// these numbers. There are at most [`Servers::capacity`] of them (twice the
/// servers at start, and 16 more).
#[derive(Debug)]
pub struct Servers {
    /// Every server ever configured, by number.
    slots: RwLock<Vec<Endpoint>>,
    capacity: usize,
    /// Down, probing and stalled servers.
    pub health: Health,
    /// Keys to delete on a server before it serves again.
    pub repairs: Repairs,
    /// A reply later than this after its call was written fails the connection (ns).
    timeout_ns: AtomicU64,
    /// How long opening a connection may take (ms).
    connect_timeout_ms: AtomicU64,
    /// Longest quiet time before the stall check (ns).
    slice_ns: AtomicU64,
    /// Whether stalls are detected at all.
    stall: AtomicBool,
    /// The login a new connection sends first (servers started with `-Y`).
    login: RwLock<Option<Arc<[u8]>>>,
    /// TLS to the servers: the client configuration.
    tls: RwLock<Option<Arc<rustls::ClientConfig>>>,
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl Servers {
    /// Servers at `addrs` (numbered 0, 1, ... in that order), all up, with
    /// nothing to repair; `carriers` threads carry requests to them, and
    /// `work_waiting` says whether requests wait for one (see `health.rs`).
    pub fn new(addrs: Vec<Addr>, cfg: &BackendConfig, carriers: usize, work_waiting: WorkWaiting) -> Servers {
        let servers = Servers::for_start(addrs.len(), cfg, carriers, work_waiting);
        let endpoints: Vec<Endpoint> = addrs.into_iter().map(|addr| Endpoint { addr, tls_name: None }).collect();
        servers.register(&endpoints).expect("the first servers fit");
        servers
    }

    /// Room for the servers of a proxy that starts with `n` of them (none
    /// registered yet).
    pub fn for_start(n: usize, cfg: &BackendConfig, carriers: usize, work_waiting: WorkWaiting) -> Servers {
        let capacity = n * 2 + 16;
        let servers = Servers {
            slots: RwLock::new(Vec::new()),
            capacity,
            health: Health::new(capacity, cfg, carriers, work_waiting),
            repairs: Repairs::new(capacity),
            timeout_ns: AtomicU64::new(0),
            connect_timeout_ms: AtomicU64::new(0),
            slice_ns: AtomicU64::new(0),
            stall: AtomicBool::new(false),
            login: RwLock::new(None),
            tls: RwLock::new(None),
        };
        servers.configure(cfg);
        servers
    }

    /// Takes the timeouts and stall rules of `cfg` (at start and on a reload).
    pub fn configure(&self, cfg: &BackendConfig) {
        self.timeout_ns.store(cfg.timeout_ms * 1_000_000, Ordering::Relaxed);
        self.connect_timeout_ms.store(cfg.connect_timeout_ms, Ordering::Relaxed);
        self.slice_ns.store(cfg.stall_slice().as_nanos() as u64, Ordering::Relaxed);
        self.stall.store(cfg.stall_ms > 0, Ordering::Relaxed);
        self.health.configure(cfg);
    }

    /// The numbers of `endpoints`, in order: a server seen before keeps its
    /// number, a new one gets the next. Nothing changes when they do not all
    /// fit.
    pub fn register(&self, endpoints: &[Endpoint]) -> Result<Vec<usize>, String> {
        let mut slots = write(&self.slots);
        let new = endpoints.iter().filter(|e| !slots.contains(e)).count();
        if slots.len() + new > self.capacity {
            return Err(format!(
                "{} servers were configured since the start and {new} more would make more than {} \
                 (twice the servers at start, and 16): restart to add them",
                slots.len(),
                self.capacity
            ));
        }
        Ok(endpoints
            .iter()
            .map(|e| match slots.iter().position(|s| s == e) {
                Some(i) => i,
                None => {
                    slots.push(e.clone());
                    self.health.name(slots.len() - 1, e.addr.to_string());
                    slots.len() - 1
                }
            })
            .collect())
    }

    /// The endpoints of the servers numbered 0.. (every server configured since the start).
    pub fn endpoints(&self) -> Vec<Endpoint> {
        read(&self.slots).clone()
    }

    /// The address of server `s`.
    pub fn addr(&self, s: usize) -> Addr {
        read(&self.slots)[s].addr.clone()
    }

    /// How many servers may be numbered.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// New connections speak TLS with `cfg` (`None`: plaintext).
    pub fn set_tls(&self, cfg: Option<Arc<rustls::ClientConfig>>) {
        *write(&self.tls) = cfg;
    }

    /// How a new connection to server `s` speaks TLS, if it does: the
    /// configuration and the name its certificate must carry.
    pub fn tls(&self, s: usize) -> Option<(Arc<rustls::ClientConfig>, ServerName<'static>)> {
        let cfg = read(&self.tls).clone()?;
        let slots = read(&self.slots);
        let e = &slots[s];
        // Without a configured name: the server's IP address, or for a unix socket `localhost`.
        let name = e.tls_name.clone().unwrap_or_else(|| match e.addr.ip() {
            Some(ip) => ServerName::IpAddress(ip.into()),
            None => ServerName::DnsName(rustls::pki_types::DnsName::try_from("localhost").expect("a valid name")),
        });
        Some((cfg, name))
    }

    /// New connections send `login` first (servers started with `-Y`).
    pub fn set_login(&self, login: Option<Vec<u8>>) {
        *write(&self.login) = login.map(Arc::from);
    }

    /// The login a new connection sends first, if the servers want one.
    pub fn login(&self) -> Option<Arc<[u8]>> {
        read(&self.login).clone()
    }

    /// Whether server `s` is currently down or stalled.
    pub fn is_down(&self, s: usize) -> bool {
        self.health.is_down(s)
    }

    /// Servers ejected from the ring since start.
    pub fn ejections(&self) -> u64 {
        self.health.ejection.count()
    }

    /// When server `s` was last ejected (unix µs), 0 if never.
    pub fn ejected_at_us(&self, s: usize) -> u64 {
        self.health.ejection.at_us(s)
    }

    /// Requests waiting for server `s`'s replies now.
    pub fn waiting(&self, s: usize) -> u32 {
        self.health.waiting(s)
    }

    /// Longest quiet time before the stall check.
    pub fn slice(&self) -> Duration {
        Duration::from_nanos(self.slice_ns.load(Ordering::Relaxed))
    }

    /// How long opening a connection may take.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms.load(Ordering::Relaxed))
    }

    /// How long a reply may take.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns())
    }

    fn timeout_ns(&self) -> u64 {
        self.timeout_ns.load(Ordering::Relaxed)
    }

    fn slice_ns(&self) -> u64 {
        self.slice_ns.load(Ordering::Relaxed)
    }
}

/// What a connection carries and waits for, in the order it was written.
#[derive(Debug)]
enum Pending<T> {
    /// A call of a request: its reply ends it.
    Call { tag: T, framing: Framing, cap: usize, sent: u64 },
    /// Repairs written before the calls; `left` replies to read.
    Repair { batch: Batch, left: usize, sent: u64 },
    /// A call given up (its server stalled): its reply is read and dropped.
    Abandoned { framing: Framing, cap: usize, sent: u64 },
    /// The login a new connection sent first: `STORED` lets it in.
    Login { sent: u64 },
}

/// A call that ended: whose it is (`tag`, the engine's own), its reply or
/// why there is none, and the facts for the measurements.
pub struct Ended<'a, T> {
    /// The engine's name for the call.
    pub tag: T,
    /// The server's reply, or why it gave none.
    pub outcome: Result<&'a [u8], &'a BackendError>,
    /// Which server, when it was written and ended, how it failed.
    pub fact: BackendFact,
}

/// What the waiting rules say about a server that has calls in flight.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go on waiting (this carrier may have just become the probe).
    Wait,
    /// The server is stalled and this carrier's calls were given up; only
    /// replies to be dropped are left on the connection.
    GaveUp,
    /// The oldest call is overdue: the connection must be failed with
    /// [`BackendError::Timeout`].
    TimedOut,
}

/// One carrier's exchange with one server (see the module notes). `T` names
/// a call for the engine: a pool worker's request and call index, an async
/// loop's batch, request and call index.
#[derive(Debug)]
pub struct Exchange<T> {
    server: usize,
    fifo: VecDeque<Pending<T>>,
    /// Calls in `fifo` still waiting for a reply.
    calls: usize,
    /// This carrier is the server's probe.
    probe: bool,
    /// When the server last sent bytes, or calls started waiting (ns).
    progress: u64,
    /// When the server last completed a reply (ns): it answers in order, so
    /// the oldest call's wait for its own reply starts then at the earliest.
    answered_at: u64,
    /// The last connection failed: the next one opened is a reconnection.
    failed_before: bool,
    /// Reconnections not yet reported in a fact.
    reconnects: u64,
}

impl<T: Copy> Exchange<T> {
    /// An exchange with server `server`, nothing in flight.
    pub fn new(server: usize) -> Exchange<T> {
        Exchange {
            server,
            fifo: VecDeque::new(),
            calls: 0,
            probe: false,
            progress: 0,
            answered_at: 0,
            failed_before: false,
            reconnects: 0,
        }
    }

    /// Begins sending this round's calls for this server (`outbox`, with
    /// `owners[i]` naming call `i`): admits them, opens the connection with
    /// `open` (which says whether it made a new one), puts the repairs due
    /// and the calls' bytes into `out` and remembers what the server owes.
    /// Returns false when nothing may be written: the calls have ended with
    /// the reason (`ended`).
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &mut self,
        servers: &Servers,
        outbox: &Outbox,
        owners: &[T],
        out: &mut Vec<u8>,
        now: u64,
        open: impl FnOnce() -> Result<bool, BackendError>,
        ended: &mut impl FnMut(Ended<'_, T>),
    ) -> bool {
        let s = self.server;
        let calls = || outbox.calls().iter().zip(owners).filter(move |(c, _)| c.server == s && c.reply);
        let admitted = servers.health.admit(s).map(|probe| self.probe |= probe);
        if let Err(e) = &admitted {
            servers.health.gave_up(s, e);
        }
        match admitted.and_then(|()| open()) {
            Err(e) => {
                for (_, &tag) in calls() {
                    let fact = self.fact(now, now, Some(&e));
                    ended(Ended { tag, outcome: Err(&e), fact });
                }
                if !matches!(e, BackendError::Down | BackendError::Stalled) {
                    self.fail(servers, &e, now, ended);
                }
                return false;
            }
            Ok(opened) => {
                if opened && std::mem::take(&mut self.failed_before) {
                    self.reconnects += 1;
                }
                if let Some(login) = opened.then(|| servers.login()).flatten() {
                    out.extend_from_slice(&login);
                    if self.fifo.is_empty() {
                        self.progress = now;
                        servers.health.begin_wait(s);
                    }
                    self.fifo.push_back(Pending::Login { sent: now });
                }
            }
        }
        let was_idle = self.fifo.is_empty();
        if let Some(batch) = servers.repairs.take(s) {
            let left = batch.encode(out);
            self.fifo.push_back(Pending::Repair { batch, left, sent: now });
        }
        out.extend_from_slice(outbox.bytes(s));
        for (c, &tag) in calls() {
            self.fifo.push_back(Pending::Call { tag, framing: c.framing, cap: c.cap, sent: now });
            self.calls += 1;
        }
        if was_idle && !self.fifo.is_empty() {
            self.progress = now;
            servers.health.begin_wait(s);
        }
        true
    }

    /// The server sent bytes.
    pub fn progress(&mut self, servers: &Servers, now: u64) {
        self.progress = now;
        servers.health.progress(self.server);
    }

    /// Takes the complete replies at the start of `buf`, in the order the
    /// server owes them, ending their calls; returns the bytes used. An
    /// error (a reply that is not memcached's, or larger than its call
    /// allows) means the connection must be failed with it.
    pub fn replies(
        &mut self,
        servers: &Servers,
        buf: &[u8],
        now: u64,
        ended: &mut impl FnMut(Ended<'_, T>),
    ) -> Result<usize, BackendError> {
        let was_waiting = !self.fifo.is_empty();
        let mut at = 0;
        while let Some(head) = self.fifo.front_mut() {
            let (framing, cap) = match head {
                Pending::Call { framing, cap, .. } | Pending::Abandoned { framing, cap, .. } => (*framing, *cap),
                Pending::Repair { .. } => (mcproto::delete_reply_len as Framing, REPAIR_CAP),
                Pending::Login { .. } => (mcproto::status_reply_len as Framing, REPAIR_CAP),
            };
            let rest = &buf[at..];
            let n = match framing(rest) {
                Ok(Some(n)) => n,
                Ok(None) if rest.len() > cap => return Err(BackendError::TooLarge),
                Ok(None) => break,
                Err(e) => return Err(BackendError::Protocol(e.to_string())),
            };
            at += n;
            self.answered_at = now;
            match head {
                Pending::Repair { left, .. } if *left > 1 => *left -= 1,
                Pending::Repair { .. } => {
                    let Some(Pending::Repair { batch, .. }) = self.fifo.pop_front() else { unreachable!() };
                    servers.repairs.completed(&batch);
                    self.answered(servers);
                }
                Pending::Abandoned { .. } => {
                    self.fifo.pop_front();
                    // A reply all the same: the server answers. (The probe's
                    // call may be one an all-fastest gave up: without this its
                    // reply ended no probe, and the server stayed down for good.)
                    self.answered(servers);
                }
                Pending::Login { .. } => {
                    if &rest[..n] != mcproto::auth::STORED {
                        let why = String::from_utf8_lossy(&rest[..n]).trim_end().to_string();
                        return Err(BackendError::Protocol(format!("login refused: {why}")));
                    }
                    self.fifo.pop_front();
                }
                Pending::Call { .. } => {
                    let Some(Pending::Call { tag, sent, .. }) = self.fifo.pop_front() else { unreachable!() };
                    self.calls -= 1;
                    self.answered(servers);
                    let fact = self.fact(sent, now, None);
                    ended(Ended { tag, outcome: Ok(&rest[..n]), fact });
                }
            }
        }
        if was_waiting && self.fifo.is_empty() {
            servers.health.end_wait(self.server);
        }
        Ok(at)
    }

    /// Whether the waiting rules have something to say now (a call overdue,
    /// or the server quiet for a slice): the engine reads what has arrived,
    /// then asks [`Exchange::check`].
    pub fn due(&self, servers: &Servers, now: u64) -> bool {
        self.overdue(servers, now) || self.quiet(servers, now)
    }

    /// What waiting says now (see [`Verdict`]); calls given up for a stall
    /// end here with `stalled`.
    pub fn check(&mut self, servers: &Servers, now: u64, ended: &mut impl FnMut(Ended<'_, T>)) -> Verdict {
        if self.overdue(servers, now) {
            return Verdict::TimedOut;
        }
        let health = &servers.health;
        if !servers.stall.load(Ordering::Relaxed)
            || self.probe
            || self.calls == 0
            || !self.quiet(servers, now)
            || !health.stalled(self.server, health.now_ms())
        {
            return Verdict::Wait;
        }
        if health.claim_probe(self.server) {
            self.probe = true;
            self.abandon(servers, 1, now, ended);
            Verdict::Wait
        } else {
            self.abandon(servers, 0, now, ended);
            Verdict::GaveUp
        }
    }

    /// The connection failed (or was closed with replies owed): every call
    /// in flight ends with `e`, the repairs in flight wait for the next
    /// exchange, and the server is marked down — unless `e` is a stall,
    /// which was counted when its calls were given up.
    pub fn fail(&mut self, servers: &Servers, e: &BackendError, now: u64, ended: &mut impl FnMut(Ended<'_, T>)) {
        let s = self.server;
        if !self.fifo.is_empty() {
            servers.health.end_wait(s);
        }
        for p in std::mem::take(&mut self.fifo) {
            match p {
                Pending::Call { tag, sent, .. } => {
                    let fact = self.fact(sent, now, Some(e));
                    ended(Ended { tag, outcome: Err(e), fact });
                }
                Pending::Repair { batch, .. } => servers.repairs.give_back(s, batch),
                Pending::Abandoned { .. } | Pending::Login { .. } => {}
            }
        }
        self.calls = 0;
        if *e != BackendError::Stalled {
            servers.health.failed(s, e);
        }
        if std::mem::take(&mut self.probe) {
            servers.health.end_probe(s);
        }
        self.failed_before = true;
    }

    /// Gives up the calls `unneeded` names: their replies will be read and
    /// dropped, and they end without an outcome (their request no longer
    /// needs them: an all-fastest route answered). The server's health is
    /// not touched. Returns how many were given up.
    pub fn give_up(&mut self, mut unneeded: impl FnMut(&T) -> bool) -> usize {
        let mut n = 0;
        for p in self.fifo.iter_mut() {
            if let Pending::Call { tag, framing, cap, sent } = *p {
                if unneeded(&tag) {
                    *p = Pending::Abandoned { framing, cap, sent };
                    n += 1;
                }
            }
        }
        self.calls -= n;
        n
    }

    /// Whether anything written is still owed a reply (calls, repairs, or
    /// calls given up whose replies are to be dropped).
    pub fn in_flight(&self) -> bool {
        !self.fifo.is_empty()
    }

    /// Whether calls, repairs or a login still wait for replies (not
    /// counting calls given up).
    pub fn owed(&self) -> bool {
        self.fifo.iter().any(|p| !matches!(p, Pending::Abandoned { .. }))
    }

    /// How long a blocking carrier may wait for the server before asking
    /// [`Exchange::check`]: a slice, cut to what is left before the oldest
    /// call is overdue.
    pub fn wait_limit(&self, servers: &Servers, now: u64) -> Duration {
        let left = match self.fifo.front() {
            Some(p) => servers.timeout_ns().saturating_sub(now.saturating_sub(p.sent())),
            None => servers.timeout_ns(),
        };
        Duration::from_nanos(left.min(servers.slice_ns()))
    }

    /// Whether the oldest call has waited for its reply longer than the
    /// timeout: since it was sent, or since the server completed the reply
    /// before it if that was later — a server streaming a long pipeline of
    /// large replies is working, not timing out, while the calls at the back
    /// wait their turn.
    fn overdue(&self, servers: &Servers, now: u64) -> bool {
        self.fifo.front().is_some_and(|p| now.saturating_sub(p.sent().max(self.answered_at)) >= servers.timeout_ns())
    }

    fn quiet(&self, servers: &Servers, now: u64) -> bool {
        !self.fifo.is_empty() && now.saturating_sub(self.progress) >= servers.slice_ns()
    }

    /// A reply came: the server is up, and a probe is over.
    fn answered(&mut self, servers: &Servers) {
        if std::mem::take(&mut self.probe) {
            servers.health.end_probe(self.server);
        }
        servers.health.succeeded(self.server);
    }

    /// Gives up every call after the first `keep`: they end with `stalled`
    /// now, and their replies will be dropped.
    fn abandon(&mut self, servers: &Servers, keep: usize, now: u64, ended: &mut impl FnMut(Ended<'_, T>)) {
        let mut kept = 0;
        let mut given_up = Vec::new();
        for p in self.fifo.iter_mut() {
            if let Pending::Call { tag, framing, cap, sent } = *p {
                if kept < keep {
                    kept += 1;
                    continue;
                }
                given_up.push((tag, sent));
                *p = Pending::Abandoned { framing, cap, sent };
            }
        }
        if given_up.is_empty() {
            return;
        }
        self.calls -= given_up.len();
        let e = BackendError::Stalled;
        servers.health.gave_up(self.server, &e);
        for (tag, sent) in given_up {
            let fact = self.fact(sent, now, Some(&e));
            ended(Ended { tag, outcome: Err(&e), fact });
        }
    }

    fn fact(&mut self, sent: u64, done: u64, failure: Option<&BackendError>) -> BackendFact {
        BackendFact {
            server: self.server,
            sent,
            done,
            failed: failure.is_some(),
            timeout: matches!(failure, Some(BackendError::Timeout)),
            reconnects: std::mem::take(&mut self.reconnects),
        }
    }
}

impl<T> Pending<T> {
    /// When it was written: the oldest thing owed sets the deadline, calls
    /// given up included (a server that never answers them is failed, so it
    /// gets its backoff and probe instead of staying stalled).
    fn sent(&self) -> u64 {
        match self {
            Pending::Call { sent, .. }
            | Pending::Repair { sent, .. }
            | Pending::Abandoned { sent, .. }
            | Pending::Login { sent } => *sent,
        }
    }
}

#[cfg(test)]
mod tests;

//! The servers' health as every worker sees it: failures and backoff, the one
//! probe allowed at a time, and stall detection.
//!
//! - A request that fails marks its server **down** for a backoff (doubling
//!   from `retry_min_ms` to `retry_max_ms`). Until it ends, requests for that
//!   server fail at once (`unavailable`). When it ends, exactly one request
//!   (the **probe**) may try the server; the others keep failing at once
//!   instead of all retrying together. The probe's success brings the server
//!   back for everybody, its failure doubles the backoff.
//! - A server that is up but stops answering is **stalled**: requests are
//!   waiting for it and it has answered nothing for `stall_ms`, while other
//!   servers kept answering (so a machine that is merely overloaded, where
//!   every server slows down together, is not mistaken for a stall) — or
//!   while every carrier waits for it and other requests wait for a carrier
//!   (then nobody can talk to the other servers, so their silence proves
//!   nothing, and the waiting requests must not wait for its timeout). Then new
//!   requests are not sent to it, and of the requests already waiting one
//!   becomes the probe and waits up to the timeout, while the others give up
//!   at once. So a stalled server holds at most one worker, and requests for
//!   other servers' keys keep their usual speed.
//! - The **health checker** (`checker.rs`, `[backend] check_ms`) keeps this
//!   view current without client traffic: [`Health::check_due`] says which
//!   servers to check — every server once at start, a down server when its
//!   backoff has ended (taking the probe slot, so a request and a check never
//!   probe together), an up server no request has reached for `check_ms` —
//!   and [`Health::checked`] takes the outcome as a probe's or a request's
//!   would be taken: success brings the server up for everyone, failure marks
//!   it down or doubles its backoff. Until a server's first check is over it
//!   is *unchecked*, and `/readyz` does not count on it.
//! - Transitions (down, up again) are logged at warn, with what found them
//!   (`by = request` or `by = check`); failures of a server that is already
//!   down are summed up at most once every 10 seconds.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::backend_error::BackendError;
use crate::config::BackendConfig;

/// How often repeated failures of a down server are logged.
const LOG_EVERY_MS: u64 = 10_000;

/// One server's state.
#[derive(Debug, Default)]
struct Server {
    /// Its address, for the log (set when the server is registered).
    name: OnceLock<String>,
    /// Milliseconds since start before which nobody may try it.
    down_until_ms: AtomicU64,
    /// Consecutive failures; non-zero means down.
    failures: AtomicU32,
    /// A request is probing it (down, or stalled).
    probing: AtomicBool,
    /// Requests waiting for its replies right now.
    waiting: AtomicU32,
    /// When it last answered (or when requests started waiting for it).
    progress_ms: AtomicU64,
    /// When it went down.
    down_since_ms: AtomicU64,
    /// Failures not logged yet, and when the last log line was written.
    unlogged: AtomicU64,
    logged_ms: AtomicU64,
    /// The checker has checked it (since checks were on), and when it last finished a check.
    checked: AtomicBool,
    checked_ms: AtomicU64,
    /// Checks run, and those that failed.
    checks: AtomicU64,
    check_failures: AtomicU64,
}

/// Whether requests wait for a carrier (a worker, a loop) right now.
pub type WorkWaiting = Box<dyn Fn() -> bool + Send + Sync>;

/// Servers taken off the ring (twemproxy's `auto_eject_hosts`), by number:
/// a server that failed `eject_after` times in a row (no success between)
/// leaves the ring for `eject_for_ms`; the routing builds the ring of the
/// others meanwhile (`route::Router::placing`).
///
/// Failures and successes count whoever found them, a request or the health
/// checker, but only while the server is on the ring: the checker goes on
/// checking an ejected server, and its failures neither eject it again nor
/// stretch its time off the ring (as twemproxy, it is back after
/// `eject_for_ms`, and needs `eject_after` new failures to leave again); its
/// success does not bring it back early either — that would move its keys
/// back and forth with every blip.
#[derive(Debug)]
pub struct Ejection {
    started: Instant,
    on: AtomicBool,
    after: AtomicU32,
    for_ms: AtomicU64,
    /// Failures in a row since the last success or ejection.
    in_row: Vec<AtomicU32>,
    /// Milliseconds since start until which the server is off the ring; 0: on it.
    until_ms: Vec<AtomicU64>,
    /// When it was last ejected (unix µs, as twemproxy's `server_ejected_at`).
    at_us: Vec<AtomicU64>,
    count: AtomicU64,
}

impl Ejection {
    fn new(slots: usize) -> Ejection {
        Ejection {
            started: Instant::now(),
            on: AtomicBool::new(false),
            after: AtomicU32::new(2),
            for_ms: AtomicU64::new(30_000),
            in_row: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            until_ms: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            at_us: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
        }
    }

    fn configure(&self, cfg: &BackendConfig) {
        self.after.store(cfg.eject_after.max(1), Ordering::Relaxed);
        self.for_ms.store(cfg.eject_for_ms.max(1), Ordering::Relaxed);
        self.on.store(cfg.eject, Ordering::Relaxed);
    }

    /// Whether ejection is on.
    pub fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Milliseconds since start, the clock of [`Ejection::off_ring`].
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether server `s` is off the ring at `now_ms`.
    pub fn off_ring(&self, s: usize, now_ms: u64) -> bool {
        self.until_ms[s].load(Ordering::Relaxed) > now_ms
    }

    /// Servers ejected since start.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// When `s` was last ejected (unix µs), 0 if never.
    pub fn at_us(&self, s: usize) -> u64 {
        self.at_us[s].load(Ordering::Relaxed)
    }

    /// A failure of `s`: its `eject_after`-th in a row ejects it; whether it did.
    fn failure(&self, s: usize) -> Option<u64> {
        if !self.enabled() || self.off_ring(s, self.now_ms()) {
            return None;
        }
        let n = self.in_row[s].fetch_add(1, Ordering::AcqRel) + 1;
        if n < self.after.load(Ordering::Relaxed) {
            return None;
        }
        self.in_row[s].store(0, Ordering::Release);
        let for_ms = self.for_ms.load(Ordering::Relaxed);
        self.until_ms[s].store(self.now_ms() + for_ms, Ordering::Relaxed);
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        self.at_us[s].store(now_us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        Some(for_ms)
    }

    fn success(&self, s: usize) {
        self.in_row[s].store(0, Ordering::Relaxed);
    }
}

/// The health of every server, shared by all carriers.
pub struct Health {
    /// Servers off the ring.
    pub ejection: Arc<Ejection>,
    servers: Vec<Server>,
    started: Instant,
    /// Threads that carry requests to the servers.
    carriers: u32,
    work_waiting: WorkWaiting,
    /// When any server last answered.
    any_progress_ms: AtomicU64,
    /// The rules, which a reload may change.
    stall_ms: AtomicU64,
    check_ms: AtomicU64,
    retry_min_ms: AtomicU64,
    retry_max_ms: AtomicU64,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").field("servers", &self.servers).finish()
    }
}

impl Health {
    /// Every server up, for up to `slots` servers (named with
    /// [`Health::name`]) and `carriers` threads that carry requests to them;
    /// `work_waiting` says whether requests wait for one.
    pub fn new(slots: usize, cfg: &BackendConfig, carriers: usize, work_waiting: WorkWaiting) -> Health {
        let h = Health {
            ejection: Arc::new(Ejection::new(slots)),
            servers: (0..slots).map(|_| Server::default()).collect(),
            started: Instant::now(),
            carriers: carriers.max(1) as u32,
            work_waiting,
            any_progress_ms: AtomicU64::new(0),
            stall_ms: AtomicU64::new(0),
            check_ms: AtomicU64::new(0),
            retry_min_ms: AtomicU64::new(0),
            retry_max_ms: AtomicU64::new(0),
        };
        h.configure(cfg);
        h
    }

    /// Takes the stall, backoff and check rules of `cfg` (a reload).
    pub fn configure(&self, cfg: &BackendConfig) {
        self.stall_ms.store(cfg.stall_ms, Ordering::Relaxed);
        self.check_ms.store(cfg.check_ms, Ordering::Relaxed);
        self.retry_min_ms.store(cfg.retry_min_ms, Ordering::Relaxed);
        self.retry_max_ms.store(cfg.retry_max_ms, Ordering::Relaxed);
        self.ejection.configure(cfg);
    }

    /// Names slot `s` (its address) for the log; a slot is named once.
    pub fn name(&self, s: usize, name: String) {
        let _ = self.servers[s].name.set(name);
    }

    fn addr(&self, s: usize) -> &str {
        self.servers[s].name.get().map_or("?", String::as_str)
    }

    /// Milliseconds since the proxy started.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// May a request be sent to `s` now? `Ok(true)` means it is the probe and
    /// must call [`Health::end_probe`] when its exchange is over.
    pub fn admit(&self, s: usize) -> Result<bool, BackendError> {
        let h = &self.servers[s];
        let now = self.now_ms();
        if h.failures.load(Ordering::Relaxed) > 0 {
            if now < h.down_until_ms.load(Ordering::Relaxed) || !self.claim_probe(s) {
                return Err(BackendError::Down);
            }
            return Ok(true);
        }
        if self.stalled(s, now) {
            return Err(BackendError::Stalled);
        }
        Ok(false)
    }

    /// Becomes the probe of `s` if nobody is.
    pub fn claim_probe(&self, s: usize) -> bool {
        self.servers[s].probing.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// The probe of `s` is over.
    pub fn end_probe(&self, s: usize) {
        self.servers[s].probing.store(false, Ordering::Release);
    }

    /// A request starts waiting for replies from `s`.
    pub fn begin_wait(&self, s: usize) {
        let h = &self.servers[s];
        if h.waiting.fetch_add(1, Ordering::AcqRel) == 0 {
            h.progress_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// A request stops waiting for `s`.
    pub fn end_wait(&self, s: usize) {
        self.servers[s].waiting.fetch_sub(1, Ordering::AcqRel);
    }

    /// `s` sent bytes.
    pub fn progress(&self, s: usize) {
        let now = self.now_ms();
        self.servers[s].progress_ms.store(now, Ordering::Relaxed);
        self.any_progress_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Whether `s` counts as stalled at `now_ms` (see the module notes).
    pub fn stalled(&self, s: usize, now_ms: u64) -> bool {
        let stall_ms = self.stall_ms.load(Ordering::Relaxed);
        if stall_ms == 0 {
            return false;
        }
        let h = &self.servers[s];
        let waiting = h.waiting.load(Ordering::Acquire);
        if waiting == 0 {
            return false;
        }
        let last = h.progress_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) <= stall_ms {
            return false;
        }
        let others = self.any_progress_ms.load(Ordering::Relaxed);
        others.saturating_sub(last) > stall_ms / 2 || (waiting >= self.carriers && (self.work_waiting)())
    }

    /// An exchange with `s` failed: it is down for a backoff.
    pub fn failed(&self, s: usize, e: &BackendError) {
        self.down(s, e, "request");
    }

    /// `s` failed (`by` a request or a check): down for a backoff, doubled if it was down already.
    fn down(&self, s: usize, e: &BackendError, by: &str) {
        let h = &self.servers[s];
        let now = self.now_ms();
        let n = h.failures.fetch_add(1, Ordering::AcqRel);
        let (min, max) = (self.retry_min_ms.load(Ordering::Relaxed), self.retry_max_ms.load(Ordering::Relaxed));
        let backoff = (min << n.min(16)).min(max);
        h.down_until_ms.store(now + backoff, Ordering::Relaxed);
        if n == 0 {
            h.down_since_ms.store(now, Ordering::Relaxed);
            h.logged_ms.store(now, Ordering::Relaxed);
            tracing::warn!(server = %self.addr(s), by, "server down: {e}; retrying in {backoff} ms");
        } else {
            self.note_error(s, e, now);
        }
        if let Some(ms) = self.ejection.failure(s) {
            tracing::warn!(server = %self.addr(s), "server ejected from the ring for {ms} ms: its keys go to the others");
        }
    }

    /// A request to `s` was given up (stalled) without blaming the server.
    pub fn gave_up(&self, s: usize, e: &BackendError) {
        self.note_error(s, e, self.now_ms());
    }

    fn note_error(&self, s: usize, e: &BackendError, now: u64) {
        let h = &self.servers[s];
        let n = h.unlogged.fetch_add(1, Ordering::Relaxed) + 1;
        let last = h.logged_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= LOG_EVERY_MS
            && h.logged_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            h.unlogged.fetch_sub(n, Ordering::Relaxed);
            tracing::warn!(server = %self.addr(s), "{n} failed requests or checks in the last {} s; last: {e}", (now - last) / 1000);
        }
    }

    /// An exchange with `s` succeeded: it is up.
    pub fn succeeded(&self, s: usize) {
        self.up(s, "request");
    }

    /// `s` answered (`by` a request or a check): up for everyone.
    fn up(&self, s: usize, by: &str) {
        self.ejection.success(s);
        let h = &self.servers[s];
        if h.failures.load(Ordering::Relaxed) != 0 {
            h.failures.store(0, Ordering::Release);
            h.down_until_ms.store(0, Ordering::Relaxed);
            let down_ms = self.now_ms().saturating_sub(h.down_since_ms.load(Ordering::Relaxed));
            tracing::warn!(server = %self.addr(s), by, "server up again after {down_ms} ms");
        }
    }

    /// Whether the health checker should check `s` now: `Some(true)` as
    /// the probe of a down server whose backoff has ended (the probe slot is
    /// taken; [`Health::checked`] gives it back), `Some(false)` an up server
    /// never checked, or that no request has reached for `check_ms` and none
    /// is on its way to (those are watched by the exchange's rules); `None`
    /// otherwise: checks off, the server in its backoff or probed by a
    /// request, or checked or reached within `check_ms`.
    pub fn check_due(&self, s: usize) -> Option<bool> {
        let check_ms = self.check_ms.load(Ordering::Relaxed);
        if check_ms == 0 {
            return None;
        }
        let h = &self.servers[s];
        let now = self.now_ms();
        if h.failures.load(Ordering::Acquire) > 0 {
            return (now >= h.down_until_ms.load(Ordering::Relaxed) && self.claim_probe(s)).then_some(true);
        }
        // The first check comes whatever the traffic: `/readyz` waits for it.
        if !h.checked.load(Ordering::Acquire) {
            return Some(false);
        }
        if h.waiting.load(Ordering::Acquire) > 0 {
            return None;
        }
        let reached = h.progress_ms.load(Ordering::Relaxed).max(h.checked_ms.load(Ordering::Relaxed));
        (now.saturating_sub(reached) >= check_ms).then_some(false)
    }

    /// The checker's check of `s` is over (`probe`: it held the probe slot):
    /// counted, and taken as a request's outcome is — success brings the
    /// server up for everyone, failure marks it down (or doubles its backoff).
    pub fn checked(&self, s: usize, probe: bool, outcome: Result<(), &BackendError>) {
        let h = &self.servers[s];
        h.checks.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(()) => self.up(s, "check"),
            Err(e) => {
                h.check_failures.fetch_add(1, Ordering::Relaxed);
                self.down(s, e, "check");
            }
        }
        h.checked_ms.store(self.now_ms(), Ordering::Relaxed);
        h.checked.store(true, Ordering::Release);
        if probe {
            self.end_probe(s);
        }
    }

    /// Whether checks are on and `s` has not been checked yet: nobody knows
    /// whether it answers.
    pub fn unchecked(&self, s: usize) -> bool {
        self.check_ms.load(Ordering::Relaxed) > 0 && !self.servers[s].checked.load(Ordering::Acquire)
    }

    /// Checks of `s` run since start, and those that failed.
    pub fn checks(&self, s: usize) -> (u64, u64) {
        let h = &self.servers[s];
        (h.checks.load(Ordering::Relaxed), h.check_failures.load(Ordering::Relaxed))
    }

    /// Whether `s` is currently down (or stalled).
    pub fn is_down(&self, s: usize) -> bool {
        self.servers[s].failures.load(Ordering::Relaxed) > 0 || self.stalled(s, self.now_ms())
    }

    /// Requests waiting for `s`'s replies now.
    pub fn waiting(&self, s: usize) -> u32 {
        self.servers[s].waiting.load(Ordering::Relaxed)
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Whether there are no servers.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }
}

#[cfg(test)]
mod tests;

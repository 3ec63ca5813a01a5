//! The output budget: bytes of replies built and not yet written, all
//! clients together (`[server] output_budget`).
//!
//! `max_reply_bytes` bounds one reply, `max_pending_output` what one
//! connection may leave unread before it is no longer read; neither bounds
//! what many connections that never read hold together (100 of them, each
//! with one unread `XRANGE` of 16 MiB, took mwmq to 1.6 GB). So:
//!
//! - **Every reply counts** from the moment it is built until its last byte
//!   is written to the socket ([`Share`]: a connection's unwritten replies).
//! - **A request whose reply may be large** (it returns message bodies or
//!   entries, or a listing: RECV, POP, PEEK, QARCHIVE, QDEAD, QLIST,
//!   XRANGE, XREAD, XREADGROUP, XCLAIM, XAUTOCLAIM, XPENDING, XINFO STREAM,
//!   GROUPS and CONSUMERS, a PING's echo) first reserves what it may return ([`Bounds::of`]: at most
//!   `max_reply_bytes`), before its statement runs, since the database's
//!   rows are in mwmq's memory as soon as they arrive. Once its reply is
//!   built the reservation becomes the reply's real size. A request whose
//!   reservation does not fit **waits**, unread behind it (TCP backpressure
//!   reaches its client), until it does; one always fits when nothing else
//!   is held, so any request can go through.
//! - **Connections that hold unwritten replies run nothing** while the
//!   budget is used up (small requests too: a client pipelining SENDs
//!   without reading holds its replies); a connection that holds none
//!   always may.
//! - **Readers that stall while others wait are closed**: while a request
//!   waits for the budget, a connection whose unwritten replies made no
//!   progress for `reply_stall_ms` is closed (its leases given back), as
//!   Redis closes a client past its output buffer's soft limit. Without it
//!   clients that never read would hold the budget forever, and every
//!   RECV after them would wait: a memory attack turned into a denial of
//!   service.
//!
//! Every other reply is small ([`SMALL_REPLY`]): what is held is at most
//! `output_budget`, plus a reply being swapped for its reservation, plus
//! one small reply per connection. mwmq's memory for replies is then about
//! that, plus the statements in flight building theirs (bounded by the
//! database connections, not by the clients). Progress of a reader is seen
//! through mwmq's writes, which the kernel lets through every 32 KiB the
//! client takes (`peer::limit_unsent`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::command::local_command;
use crate::command::Command;
use crate::config::Config;
use crate::xcommand::XCmd;

/// What every connection's replies hold together, and who waits for room.
#[derive(Debug)]
pub struct OutputBudget {
    limit: usize,
    held: AtomicUsize,
    /// Requests waiting for room now.
    waiting: AtomicUsize,
    /// Requests that had to wait, since start.
    delayed: AtomicU64,
    /// The most ever held.
    peak: AtomicUsize,
    /// How long a reader may make no progress while others wait.
    pub stall: Duration,
    /// Room was given back (the async engine's waiters listen).
    freed: tokio::sync::Notify,
}

impl OutputBudget {
    /// A budget of `limit` bytes; readers stalled `stall` while others wait are closed (zero: never).
    pub fn new(limit: usize, stall: Duration) -> OutputBudget {
        OutputBudget {
            limit,
            held: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            delayed: AtomicU64::new(0),
            peak: AtomicUsize::new(0),
            stall,
            freed: tokio::sync::Notify::new(),
        }
    }

    /// Takes `n` bytes if they fit, or if nothing is held (one request of
    /// any size can always go through).
    pub fn try_take(&self, n: usize) -> bool {
        let mut cur = self.held.load(Ordering::Relaxed);
        loop {
            if cur != 0 && cur + n > self.limit {
                return false;
            }
            match self.held.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(cur + n, Ordering::Relaxed);
                    return true;
                }
                Err(v) => cur = v,
            }
        }
    }

    /// Takes `n` bytes whether they fit or not (a reply that is built already).
    fn add(&self, n: usize) {
        let now = self.held.fetch_add(n, Ordering::AcqRel) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// Gives `n` bytes back, and wakes the requests waiting for room.
    fn give(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.held.fetch_sub(n, Ordering::AcqRel);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.freed.notify_waiters();
        }
    }

    /// Whether more is held than the budget (requests of connections that
    /// hold unwritten replies then wait).
    pub fn over(&self) -> bool {
        self.held.load(Ordering::Relaxed) > self.limit
    }

    /// Whether a connection whose unwritten replies are `mine` bytes may run a request.
    pub fn may_run(&self, mine: usize) -> bool {
        mine == 0 || !self.over()
    }

    /// A reservation of `n` bytes, if they fit now.
    pub fn reserve(self: &Arc<Self>, n: usize) -> Option<Share> {
        self.try_take(n).then(|| Share { budget: self.clone(), n })
    }

    /// Waits for `n` bytes of room (the async engine); `gone` ends the wait
    /// early (the client left, mwmq stops): `None`.
    pub async fn wait_for(self: &Arc<Self>, n: usize, gone: impl Fn() -> bool) -> Option<Share> {
        if let Some(s) = self.reserve(n) {
            return Some(s);
        }
        let _waiting = self.waiter();
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(s) = self.reserve(n) {
                return Some(s);
            }
            if gone() {
                return None;
            }
            // (Woken when room is given back; the time bounds how late `gone` is seen.)
            let _ = tokio::time::timeout(Duration::from_millis(100), freed).await;
        }
    }

    /// Counts a request waiting for room while the guard lives.
    pub fn waiter(&self) -> Waiting<'_> {
        self.wait_began();
        Waiting(self)
    }

    fn wait_began(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        self.delayed.fetch_add(1, Ordering::Relaxed);
    }

    fn wait_ended(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether a reader whose unwritten replies last moved at `progress`
    /// is to be closed now: requests wait for room, and it stalled longer
    /// than `reply_stall_ms`.
    pub fn stalled(&self, progress: Instant) -> bool {
        !self.stall.is_zero() && self.waiting.load(Ordering::Relaxed) > 0 && progress.elapsed() >= self.stall
    }

    /// The facts INFO and /metrics show.
    pub fn snapshot(&self) -> OutputSnapshot {
        OutputSnapshot {
            limit: self.limit,
            held: self.held.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            delayed: self.delayed.load(Ordering::Relaxed),
        }
    }
}

/// A request counted as waiting for room (see [`OutputBudget::waiter`]).
pub struct Waiting<'a>(&'a OutputBudget);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.wait_ended();
    }
}

/// Requests waiting for room, in the order they came (the pool engine's:
/// a worker that cannot reserve a request's reply puts it here and goes on
/// with other work; the net thread lets them go as room is given back).
#[derive(Debug)]
pub struct Line<T> {
    budget: Arc<OutputBudget>,
    items: std::sync::Mutex<std::collections::VecDeque<T>>,
}

impl<T> Line<T> {
    /// An empty line for `budget`.
    pub fn new(budget: &Arc<OutputBudget>) -> Line<T> {
        Line { budget: budget.clone(), items: Default::default() }
    }

    fn items(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<T>> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `item` waits for room.
    pub fn push(&self, item: T) {
        self.budget.wait_began();
        self.items().push_back(item);
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.items().is_empty()
    }

    /// The waiting items whose need (`need`) fits now, each with its
    /// reservation: the smallest first (a consumer's RECV of one message
    /// goes before a reader of a whole reply's worth, whom clients that do
    /// not read could otherwise keep ahead of it), in order among equals.
    pub fn admit(&self, need: impl Fn(&T) -> usize) -> Vec<(T, Share)> {
        let mut items = self.items();
        let mut order: Vec<(usize, usize)> = items.iter().enumerate().map(|(i, t)| (need(t), i)).collect();
        order.sort_unstable();
        let mut taken = Vec::new();
        for (n, i) in order {
            if let Some(share) = self.budget.reserve(n) {
                taken.push((i, share));
            } else if self.budget.held.load(Ordering::Relaxed) >= self.budget.limit {
                break;
            }
        }
        taken.sort_unstable_by_key(|(i, _)| std::cmp::Reverse(*i));
        let mut out: Vec<(T, Share)> = taken
            .into_iter()
            .map(|(i, share)| {
                self.budget.wait_ended();
                (items.remove(i).expect("in range"), share)
            })
            .collect();
        out.reverse();
        out
    }

    /// Every waiting item, whether it fits or not (mwmq stops).
    pub fn take_all(&self) -> Vec<T> {
        let all: Vec<T> = self.items().drain(..).collect();
        for _ in &all {
            self.budget.wait_ended();
        }
        all
    }
}

/// The output budget at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutputSnapshot {
    /// `output_budget`.
    pub limit: usize,
    /// Bytes of replies unwritten and reserved now.
    pub held: usize,
    /// The most ever held.
    pub peak: usize,
    /// Requests waiting for room now.
    pub waiting: usize,
    /// Requests that waited for room, since start.
    pub delayed: u64,
}

/// A part of the budget held by a reply or a reservation; given back when dropped.
#[derive(Debug)]
pub struct Share {
    budget: Arc<OutputBudget>,
    n: usize,
}

impl Share {
    /// Nothing yet, of `budget`.
    pub fn none(budget: &Arc<OutputBudget>) -> Share {
        Share { budget: budget.clone(), n: 0 }
    }

    /// Now holds `n` bytes (whether they fit or not: what is built is built).
    pub fn set(&mut self, n: usize) {
        if n > self.n {
            self.budget.add(n - self.n);
        } else {
            self.budget.give(self.n - n);
        }
        self.n = n;
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.n
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.budget.give(self.n);
    }
}

/// A RECV's, POP's, QARCHIVE's ... message counted beyond its body: its id,
/// lease, sender (at most 200 bytes), the archive's and dead letters' other
/// fields, and RESP's framing.
pub const PER_MESSAGE: usize = 1024;
/// A stream entry counted beyond its fields and values when reserving (the
/// database functions count 16 per field or value and 64 per entry; an
/// entry of many small fields may weigh more, and is counted as what it is
/// once its reply is built).
pub const PER_ENTRY: usize = 4096;
/// The most a reply that reserves nothing may weigh (see [`Bounds::of`]):
/// INFO, the largest of them, is about 3 KiB; an error quotes at most 64
/// bytes of what the client sent beside names (at most 200 bytes). What
/// the output budget may hold beyond `output_budget` is at most this much
/// per connection (each may add one reply after the budget was last seen
/// not used up), besides a reply being swapped for its reservation.
pub const SMALL_REPLY: usize = 8 * 1024;

/// A consumer or pending entry in XINFO or XPENDING (a name of at most 200 bytes, numbers, framing).
pub const PER_ROW: usize = 320;

/// What each kind of request may reserve.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// `max_reply_bytes`.
    reply: usize,
    /// The largest message or entry (the largest `max_body`) with its framing.
    message: usize,
    entry: usize,
    /// Consumers a group may have (0: no limit).
    consumers: usize,
}

impl Bounds {
    /// The bounds of `cfg`.
    pub fn new(cfg: &Config) -> Bounds {
        let s = &cfg.server;
        let body = cfg.users.iter().filter_map(|u| u.max_body).fold(s.max_body, usize::max);
        Bounds {
            reply: s.max_reply_bytes,
            message: body + PER_MESSAGE,
            entry: body + PER_ENTRY,
            consumers: usize::try_from(s.max_consumers_per_group).unwrap_or(usize::MAX),
        }
    }

    /// What `c`'s reply may weigh, for a request whose reply may be large;
    /// `None` for one whose reply is small (at most [`SMALL_REPLY`]: a
    /// number, an id, a name, OK, an error, INFO). Every command is named
    /// here (no catch-all), so that a new one is classed when it is added.
    pub fn of(&self, c: &Command) -> Option<usize> {
        let up_to = |n: usize, each: usize| Some(n.saturating_mul(each).min(self.reply.max(each)));
        match c {
            Command::Recv(r) => up_to(r.count as usize, self.message),
            Command::Pop { .. } | Command::Peek { .. } => Some(self.message),
            Command::Archive { count, .. } | Command::DeadLetters { count, .. } => up_to(*count as usize, self.message),
            // (QLIST's names are at most max_reply_bytes: `commands/queues.rs`.)
            Command::List { .. } => Some(self.reply),
            // (At most max_reply_bytes of them: `commands/schedules.rs`.)
            Command::Schedules => Some(self.reply),
            // (PING echoes its message, which may be as large as max_body.)
            Command::Ping(Some(m)) if m.len() + 64 > SMALL_REPLY => Some(m.len() + 64),
            Command::Stream(x) => self.of_stream(x),
            local_command!()
            | Command::Create(..)
            | Command::Alter(..)
            | Command::Pause(..)
            | Command::QueueInfo(_)
            | Command::Redrive { .. }
            | Command::Touch { .. }
            | Command::Drop(_)
            | Command::Len(_)
            | Command::Send(_)
            | Command::Ack { .. }
            | Command::Nack { .. }
            | Command::Schedule(_)
            | Command::Unschedule(_) => None,
        }
    }

    fn of_stream(&self, x: &XCmd) -> Option<usize> {
        let most = crate::streambounds::MAX_REPLY_ENTRIES as usize;
        let count = |c: &Option<i64>| c.map_or(most, |c| (c.max(1) as usize).min(most));
        let up_to = |n: usize, each: usize| Some(n.saturating_mul(each).min(self.reply.max(each)));
        // (Stream names and their framing, beside the entries.)
        let names = |n: usize| n * PER_ROW;
        match x {
            XCmd::Range { count: c, .. } => up_to(count(c), self.entry),
            XCmd::Read { count: c, streams, .. } => {
                up_to(count(c).saturating_mul(streams.len()), self.entry).map(|b| b + names(streams.len()))
            }
            XCmd::ReadGroup { count: c, streams, .. } => {
                up_to(count(c).saturating_mul(streams.len()), self.entry).map(|b| b + names(streams.len()))
            }
            XCmd::Claim(c) if c.justid => Some(c.ids.len() * 64),
            XCmd::Claim(c) => up_to(c.ids.len(), self.entry),
            XCmd::AutoClaim { count: c, justid, .. } => {
                let n = count(&Some(*c));
                let each = if *justid { 64 } else { self.entry };
                // (Deleted ids beside what it claims.)
                up_to(n, each).map(|b| b + n * 64)
            }
            XCmd::Pending { range: Some(p), .. } => up_to(count(&Some(p.count)), PER_ROW),
            XCmd::InfoStream { full: None, .. } => Some(2 * self.entry + 1024),
            XCmd::InfoStream { full: Some(_), .. } => Some(self.reply.max(self.entry) + 4096),
            XCmd::InfoConsumers { .. } => match self.consumers {
                0 => Some(self.reply),
                n => up_to(n, PER_ROW),
            },
            // XPENDING's summary: a row per consumer with entries pending.
            XCmd::Pending { range: None, .. } => match self.consumers {
                0 => Some(self.reply),
                n => up_to(n, PER_ROW).map(|b| b + 256),
            },
            // (A stream's groups are not counted: at most a whole reply.)
            XCmd::InfoGroups(_) => Some(self.reply),
            XCmd::Add { .. }
            | XCmd::Len(_)
            | XCmd::Del { .. }
            | XCmd::Trim { .. }
            | XCmd::GroupCreate { .. }
            | XCmd::GroupSetId { .. }
            | XCmd::GroupDeadLetter { .. }
            | XCmd::GroupDestroy { .. }
            | XCmd::CreateConsumer { .. }
            | XCmd::DelConsumer { .. }
            | XCmd::Ack { .. }
            | XCmd::Type(_)
            | XCmd::Exists(_)
            | XCmd::DelKeys(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: usize) -> Arc<OutputBudget> {
        Arc::new(OutputBudget::new(limit, Duration::from_secs(10)))
    }

    #[test]
    fn reservations_fit_or_wait_and_one_always_goes() {
        let b = budget(100);
        let big = b.reserve(500).expect("nothing held: any size goes");
        assert!(b.reserve(1).is_none(), "over the budget: nothing more");
        drop(big);
        let a = b.reserve(60).unwrap();
        assert!(b.reserve(50).is_none());
        let c = b.reserve(40).unwrap();
        assert_eq!(b.snapshot().held, 100);
        drop((a, c));
        assert_eq!(b.snapshot().held, 0);
        assert_eq!(b.snapshot().peak, 500);
    }

    #[test]
    fn a_share_follows_its_reply_and_gives_back_on_drop() {
        let b = budget(100);
        let mut s = b.reserve(80).unwrap();
        s.set(30);
        assert_eq!(b.snapshot().held, 30);
        let mut mine = Share::none(&b);
        mine.set(150);
        assert!(b.over() && !b.may_run(1) && b.may_run(0));
        mine.set(0);
        assert!(!b.over() && b.may_run(1));
        drop(s);
        assert_eq!(b.snapshot().held, 0);
    }

    #[test]
    fn stalled_readers_count_only_while_someone_waits() {
        let b = Arc::new(OutputBudget::new(100, Duration::from_millis(1)));
        let long_ago = Instant::now() - Duration::from_secs(1);
        assert!(!b.stalled(long_ago), "nobody waits: a reader may take its time");
        let w = b.waiter();
        assert!(b.stalled(long_ago) && !b.stalled(Instant::now() + Duration::from_secs(1)));
        drop(w);
        assert_eq!((b.snapshot().waiting, b.snapshot().delayed), (0, 1));
        let never = OutputBudget::new(100, Duration::ZERO);
        let _w = never.waiter();
        assert!(!never.stalled(long_ago), "reply_stall_ms 0: never");
    }

    #[test]
    fn the_line_lets_the_smallest_go_first_and_keeps_the_rest() {
        let b = budget(100);
        let line = Line::new(&b);
        let held = b.reserve(60).unwrap();
        for n in [50, 30, 20, 30] {
            line.push(n);
        }
        assert_eq!(b.snapshot().waiting, 4);
        let admit = || -> (Vec<usize>, Vec<Share>) { line.admit(|n| *n).into_iter().unzip() };
        let (got, first) = admit();
        assert_eq!(got, [20], "40 free: the smallest goes");
        assert_eq!((b.snapshot().waiting, b.snapshot().held), (3, 80), "its share went with it");
        drop(held);
        let (got, second) = admit();
        assert_eq!(got, [30, 30], "80 free: the two 30s, in the order they came; not the 50");
        drop((first, second));
        let (got, _third) = admit();
        assert_eq!(got, [50]);
        assert!(line.is_empty() && b.snapshot().waiting == 0);
        line.push(7);
        assert_eq!(line.take_all(), [7]);
        assert_eq!(b.snapshot().waiting, 0);
    }

    #[test]
    fn bounds_are_what_a_reply_may_weigh_and_at_most_the_reply_bound() {
        let mut cfg = Config::default();
        cfg.server.max_body = 1000;
        cfg.server.max_reply_bytes = 10_000;
        let b = Bounds::new(&cfg);
        let recv =
            |count| Command::Recv(crate::command::Recv { queue: "q".into(), from: None, vt_ms: 1, count, wait_ms: 0 });
        assert_eq!(b.of(&recv(1)), Some(1000 + PER_MESSAGE));
        assert_eq!(b.of(&recv(1000)), Some(10_000));
        assert_eq!(b.of(&Command::Pop { queue: "q".into(), from: None }), Some(1000 + PER_MESSAGE));
        assert_eq!(b.of(&Command::Len("q".into())), None);
        assert_eq!(
            b.of(&Command::Send(crate::command::Send {
                queue: "q".into(),
                body: vec![],
                to: None,
                delay_ms: 0,
                key: None,
                group: None,
                priority: 0
            })),
            None
        );
        let range = |count| {
            Command::Stream(XCmd::Range {
                key: "s".into(),
                start: crate::xcommand::Sid::ZERO,
                end: crate::xcommand::Sid::MAX,
                count,
                rev: false,
            })
        };
        assert_eq!(b.of(&range(Some(1))), Some(1000 + PER_ENTRY));
        assert_eq!(b.of(&range(None)), Some(10_000));
    }
}

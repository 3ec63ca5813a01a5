//! What the threads of one mwmq process share: the configuration, the
//! request queue, the database pool, the waiting RECVs, the measurements,
//! the net thread's counters, the input budget and the output budget.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::Sender;
use mio::Waker;
use mwserve::queue::WorkQueue;

use crate::config::Config;
use crate::db::{LeaseRef, Pools};
use crate::engine::job::{Done, Work};
use crate::telemetry::{DbFacts, MqAcc, NetCounters, Stamps, Telemetry};
use crate::waiters::Waiters;
use mwstats::slots::SlotWriter;

/// Bytes of request arguments being read or waiting, all clients together.
#[derive(Debug)]
pub struct InputBudget {
    used: AtomicUsize,
    limit: usize,
}

impl InputBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> InputBudget {
        InputBudget { used: AtomicUsize::new(0), limit }
    }

    /// Takes `n` bytes if they fit (always when nothing is taken, so that
    /// one request of any allowed size can go through).
    pub fn take(&self, n: usize) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            if cur != 0 && cur + n > self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    /// Gives `n` bytes back.
    pub fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// The state every thread of the process shares.
pub struct Shared {
    /// The configuration as validated.
    pub config: Config,
    /// Requests waiting for a worker.
    pub queue: WorkQueue<Work>,
    /// Database connections: a pool per database, and which queue lives where.
    pub pool: Pools,
    /// RECVs waiting for messages.
    pub waiters: Waiters,
    /// Measurements.
    pub telemetry: Telemetry,
    /// Net thread counters.
    pub net: NetCounters,
    /// Shutting down: no new connections or requests.
    pub stopping: AtomicBool,
    /// Clients served at once (after the file-descriptor plan).
    pub max_connections: usize,
    /// Connections open now.
    pub open_connections: AtomicUsize,
    /// Input bytes in flight.
    pub input: InputBudget,
    /// Bytes of replies built and not yet written (`output.rs`).
    pub output: Arc<crate::output::OutputBudget>,
    /// What a request whose reply may be large reserves of `output`.
    pub bounds: crate::output::Bounds,
    /// The pool engine's requests waiting for room in `output`.
    pub reply_line: crate::output::Line<Box<crate::engine::job::Job>>,
    /// When the process started.
    pub started: Instant,
    /// Where workers report answered requests (set once the net thread exists).
    pub done: Mutex<Option<(Sender<Done>, Arc<Waker>)>>,
    /// The listening address.
    pub port: u16,
    /// Who may connect (none configured: anyone).
    pub users: crate::users::Users,
    /// Logins waiting for the login threads, and failures by source address.
    pub logins: crate::logins::Logins,
    /// Each queue's counters since start.
    pub queues: crate::queues::PerQueue,
    /// QINFO's recent database figures.
    pub info_cache: crate::queues::InfoCache,
    /// The queues known to be paused (for `/metrics`).
    pub paused: crate::queues::Paused,
    /// Queues lately found not plain (their RECVs skip the plain statements).
    pub not_plain: crate::queues::NotPlain,
    /// Queues lately found to have held messages of other priorities than
    /// 0: their RECVs, POPs and PEEKs go straight to the statements that
    /// walk the priorities (`policies.rs`), for a second at a time.
    pub prioritized: crate::queues::NotPlain,
    /// Queues lately found being marked prioritized by a transaction that
    /// has not ended (an application's): SENDs with a PRIORITY to them are
    /// refused at once, for a second at a time (`policies.rs`).
    pub being_marked: crate::queues::NotPlain,
    /// Each queue's rates over the last minutes (the `/ui` page's charts).
    pub rates: crate::rates::History,
    /// VACUUMs of the messages table this process ran.
    pub vacuums: std::sync::atomic::AtomicU64,
    /// Stream replies refused or cut by `max_reply_bytes` (INFO, `/metrics`).
    pub stream_replies: crate::streambounds::ReplyCounts,
    /// The TLS listener's configuration (`--tls-cert`), when there is one.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Failed TLS handshakes, logged at most every 10 s.
    pub tls_log: mwserve::process::Throttled,
}

impl Shared {
    /// Tells the net thread that a request of connection `token` was answered.
    pub fn done(&self, d: Done) {
        let g = self.done.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tx, waker)) = g.as_ref() {
            if tx.send(d).is_ok() {
                let _ = waker.wake();
            }
        }
    }

    /// Queues leases to give back (a worker does it).
    pub fn release_later(&self, leases: Vec<LeaseRef>) {
        if !leases.is_empty() {
            self.queue.push_again(Work::Release(leases));
        }
    }

    /// Records one request's stages in `carrier`'s slot (a worker of the pool
    /// engine, a loop of the async engine).
    pub fn record_request(
        &self,
        writer: &mut SlotWriter<MqAcc>,
        carrier: u32,
        s: &Stamps,
        d: &crate::telemetry::Done,
        db: &DbFacts,
    ) {
        // A long poll's wait is not part of its response time: measured from
        // when it was last queued, as if it had arrived then.
        let shift = s.parked_ns;
        let t = mwstats::stages::Timeline {
            request_id: s.request_id,
            op: d.op,
            keys: d.keys,
            hits: db.hits,
            status: d.status,
            worker: carrier,
            servers: u32::from(db.statements > 0),
            t_recv: s.t_recv + shift,
            t_parsed: s.t_parsed + shift,
            t_enqueue: s.t_enqueue.max(s.t_parsed + shift),
            t_dequeue: d.t_dequeue,
            t_pool: db.t_pool,
            t_send: db.t_send.unwrap_or(d.t_dequeue),
            t_backend_done: db.t_done.or(db.t_send).unwrap_or(d.t_dequeue),
            t_reply: d.t_reply,
        };
        let primary = &self.pool[db.db].counters.primary;
        if db.unavailable {
            primary.unavailable(db.t_done.unwrap_or(d.t_reply));
        } else if db.statements > 0 && !db.failed {
            primary.answered(db.t_done.unwrap_or(d.t_reply));
        }
        let trace_every = self.config.stats.trace_every;
        let busy = d.busy.unwrap_or_else(|| d.t_reply.saturating_sub(d.t_dequeue));
        writer.record(&self.telemetry.slots, |acc| {
            acc.stages.record(&t, trace_every);
            acc.stages.busy_ns += busy;
            acc.db_requests += db.statements;
            acc.db_errors += u64::from(db.failed);
            acc.db_unavailable += u64::from(db.unavailable);
            if shift > 0 {
                acc.long_polls += 1;
                acc.long_poll.record_ns(shift);
            }
        });
    }
}

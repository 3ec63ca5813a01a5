//! Measurement: each worker records every request it answers into its own
//! accumulator (the request stages of `mwstats::stages`, plus the database's
//! figures); the net thread and the pool count what they see. The stats
//! thread (`windows.rs`) collects them at every wall-clock window boundary
//! into the run's totals kept here.

use std::sync::atomic::{AtomicU64, Ordering};

use mwstats::slots::Accumulator;
use mwstats::stages::Stages;
use mwstats::writer::TraceRow;
use mwstats::Hist;

use crate::command::MqOp;
use crate::db::Pools;

/// What one worker measured (or the sum of several).
#[derive(Clone, Debug, Default)]
pub struct MqAcc {
    /// Counts, response time, per-stage times, busy and queued time, trace rows.
    pub stages: Stages<MqOp>,
    /// Statements sent to the database.
    pub db_requests: u64,
    /// Statements that failed.
    pub db_errors: u64,
    /// Of those, because the database was unavailable (`-TRYAGAIN`).
    pub db_unavailable: u64,
    /// Requests that parked waiting for messages.
    pub long_polls: u64,
    /// How long they waited.
    pub long_poll: Hist,
}

impl Accumulator for MqAcc {
    /// Adds another accumulator (trace rows are moved).
    fn absorb(&mut self, o: &mut MqAcc) {
        if !o.stages.dirty {
            return;
        }
        self.stages.merge(&mut o.stages);
        self.db_requests += o.db_requests;
        self.db_errors += o.db_errors;
        self.db_unavailable += o.db_unavailable;
        self.long_polls += o.long_polls;
        self.long_poll.merge(&o.long_poll);
    }

    /// Back to empty.
    fn clear(&mut self) {
        if !self.stages.dirty {
            return;
        }
        self.stages.reset();
        (self.db_requests, self.db_errors, self.db_unavailable, self.long_polls) = (0, 0, 0, 0);
        self.long_poll.reset();
    }

    fn is_dirty(&self) -> bool {
        self.stages.dirty
    }

    fn take_trace(&mut self) -> Vec<TraceRow> {
        std::mem::take(&mut self.stages.trace)
    }

    fn put_trace(&mut self, rows: Vec<TraceRow>) {
        self.stages.trace = rows;
    }
}

/// Pool counters at one instant.
#[derive(Debug, Default, Clone, Copy)]
pub struct PoolSnapshot {
    pub(crate) waits: u64,
    pub(crate) timeouts: u64,
    pub(crate) connects: u64,
    pub(crate) connect_failures: u64,
    pub(crate) lost: u64,
}

impl PoolSnapshot {
    /// The pool's counters now.
    pub fn of(p: &Pools) -> PoolSnapshot {
        PoolSnapshot {
            waits: p.sum(|c| &c.waits),
            timeouts: p.sum(|c| &c.timeouts),
            connects: p.sum(|c| &c.connects),
            connect_failures: p.sum(|c| &c.connect_failures),
            lost: p.sum(|c| &c.lost),
        }
    }
}

/// mwmq's part of the run's totals: the net and pool counters at the end of
/// the last closed window.
pub type LastCounters = (NetSnapshot, PoolSnapshot);

/// What the closed windows add up to.
pub type RunTotals = mwstats::totals::Totals<MqAcc, LastCounters>;

/// Measurement state shared by the workers, the stats thread and the admin endpoint.
pub type Telemetry = mwstats::totals::Telemetry<MqAcc, LastCounters>;

/// Empty telemetry for `workers` workers.
pub fn telemetry(workers: usize) -> Telemetry {
    Telemetry::new(workers, MqAcc::default, (NetSnapshot::default(), PoolSnapshot::default()))
}

/// Counters of the net thread (cumulative).
#[derive(Debug, Default)]
pub struct NetCounters {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections closed.
    pub closed: AtomicU64,
    /// Connections refused over the limit.
    pub rejected: AtomicU64,
    /// Bytes read from clients.
    pub bytes_in: AtomicU64,
    /// Bytes written to clients.
    pub bytes_out: AtomicU64,
    /// Inputs that were not RESP (answered, then the connection closed).
    pub protocol_errors: AtomicU64,
    /// Times the request queue was found full.
    pub queue_full: AtomicU64,
    /// Leases given back because their reply did not reach the client.
    pub leases_released: AtomicU64,
    /// Client connections whose TLS handshake failed (plaintext to the TLS
    /// port, a missing or foreign client certificate, ...).
    pub tls_handshake_failures: AtomicU64,
    /// Connections closed for not finishing the TLS handshake within `[tls] handshake_timeout_secs`.
    pub handshake_timeouts: AtomicU64,
    /// Connections closed because too many others were handshaking (`[tls] max_handshaking`).
    pub handshake_refused: AtomicU64,
    /// Connections closed for not logging in within `[auth] login_timeout_secs`.
    pub login_timeouts: AtomicU64,
    /// Connections closed for leaving their replies unread (`reply_stall_ms`)
    /// while requests waited for the output budget.
    pub stalled_readers: AtomicU64,
}

impl NetCounters {
    /// Adds `n` to a counter.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The values in a fixed order (see [`NetSnapshot`]).
    pub fn snapshot(&self) -> NetSnapshot {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetSnapshot {
            accepted: v(&self.accepted),
            closed: v(&self.closed),
            rejected: v(&self.rejected),
            bytes_in: v(&self.bytes_in),
            bytes_out: v(&self.bytes_out),
            protocol_errors: v(&self.protocol_errors),
            queue_full: v(&self.queue_full),
            leases_released: v(&self.leases_released),
            tls_handshake_failures: v(&self.tls_handshake_failures),
            handshake_timeouts: v(&self.handshake_timeouts),
            handshake_refused: v(&self.handshake_refused),
            login_timeouts: v(&self.login_timeouts),
            stalled_readers: v(&self.stalled_readers),
        }
    }
}

/// The net counters at one instant.
#[derive(Debug, Default, Clone, Copy)]
pub struct NetSnapshot {
    /// See [`NetCounters`].
    pub accepted: u64,
    /// See [`NetCounters`].
    pub closed: u64,
    /// See [`NetCounters`].
    pub rejected: u64,
    /// See [`NetCounters`].
    pub bytes_in: u64,
    /// See [`NetCounters`].
    pub bytes_out: u64,
    /// See [`NetCounters`].
    pub protocol_errors: u64,
    /// See [`NetCounters`].
    pub queue_full: u64,
    /// See [`NetCounters`].
    pub leases_released: u64,
    /// See [`NetCounters`].
    pub tls_handshake_failures: u64,
    /// See [`NetCounters`].
    pub handshake_timeouts: u64,
    /// See [`NetCounters`].
    pub handshake_refused: u64,
    /// See [`NetCounters`].
    pub login_timeouts: u64,
    /// See [`NetCounters`].
    pub stalled_readers: u64,
}

/// When a request arrived and was parsed and queued, and how long it was parked.
#[derive(Debug, Clone, Copy)]
pub struct Stamps {
    /// Unique per process (trace sampling uses it).
    pub request_id: u64,
    /// When the read that completed it returned (ns, `mwstats::clock`).
    pub t_recv: u64,
    /// Parsed.
    pub t_parsed: u64,
    /// Queued for a worker or a database connection.
    pub t_enqueue: u64,
    /// Time spent parked waiting for messages (a long poll), ns.
    pub parked_ns: u64,
}

/// How a request ended.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    /// Its operation.
    pub op: MqOp,
    /// Keys (messages asked for).
    pub keys: u64,
    /// `ok`, `client_error` or `server_error`.
    pub status: &'static str,
    /// When a worker or a connection took it up.
    pub t_dequeue: u64,
    /// When its reply was written.
    pub t_reply: u64,
    /// The carrier's busy time for it (shared by a batch), if not `t_reply - t_dequeue`.
    pub busy: Option<u64>,
}

/// Database facts of one request, for its measurements.
#[derive(Default, Clone, Copy, Debug)]
pub struct DbFacts {
    /// When it had a connection (ns).
    pub t_pool: Option<u64>,
    /// When its statement was sent.
    pub t_send: Option<u64>,
    /// When the database answered.
    pub t_done: Option<u64>,
    /// Statements run.
    pub statements: u64,
    /// The database failed it.
    pub failed: bool,
    /// ... by being unreachable.
    pub unavailable: bool,
    /// Messages it got.
    pub hits: u64,
    /// The database it went to (`[[databases]]`).
    pub db: usize,
}

impl DbFacts {
    /// The facts of a batch's `i`-th request: its own hits; the statements
    /// and a failure counted once, on the first.
    pub fn share(&self, i: usize, hits: u64) -> DbFacts {
        DbFacts {
            hits,
            statements: u64::from(i == 0) * self.statements,
            failed: i == 0 && self.failed,
            unavailable: i == 0 && self.unavailable,
            ..*self
        }
    }

    /// Notes how a statement failed; the reply's status.
    pub fn failed_with(&mut self, e: &crate::db::DbError) -> &'static str {
        match e {
            // The database answered; the request was wrong.
            crate::db::DbError::NoQueue(_)
            | crate::db::DbError::Exists(_)
            | crate::db::DbError::OverQuota(_)
            | crate::db::DbError::Redis(_)
            | crate::db::DbError::CountOwned(_) => "client_error",
            crate::db::DbError::Unavailable(_) | crate::db::DbError::Failed(_) => {
                self.failed = true;
                self.unavailable = matches!(e, crate::db::DbError::Unavailable(_));
                "server_error"
            }
        }
    }
}

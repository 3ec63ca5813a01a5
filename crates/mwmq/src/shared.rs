//! What the threads of one mwmq process share: the configuration, the
//! request queue and what travels in it, the database pool, the waiting
//! RECVs, the measurements and the net thread's counters.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::Sender;
use mio::Waker;
use mwserve::queue::WorkQueue;

use crate::command::Command;
use crate::config::Config;
use crate::conn::ClientConn;
use crate::db::{LeaseRef, Pool};
use crate::events::Waiters;
use crate::resp::Reply;
use crate::telemetry::Telemetry;

/// One request on its way through mwmq.
pub struct Job {
    /// The client's connection.
    pub conn: Arc<ClientConn>,
    /// The net thread's handle on the connection.
    pub token: usize,
    /// The command, or the reply refusing the request.
    pub cmd: Result<Command, Reply>,
    /// Unique per process (trace sampling uses it).
    pub request_id: u64,
    /// When the read that completed the request returned (ns, `mwstats::clock`).
    pub t_recv: u64,
    /// Parsed.
    pub t_parsed: u64,
    /// Put on the request queue.
    pub t_enqueue: u64,
    /// Input-budget bytes the request holds until it is answered.
    pub size: usize,
    /// A RECV ... WAIT waits for messages until then.
    pub wait_until: Option<Instant>,
    /// Time spent parked waiting for messages so far (ns).
    pub parked_ns: u64,
    /// When it was last parked (ns), while it is.
    pub parked_at: Option<u64>,
    /// The wait is over: answer with whatever there is.
    pub last_try: bool,
}

/// What the request queue carries.
pub enum Work {
    /// A client's request (also a parked RECV that woke up).
    Request(Box<Job>),
    /// Leases whose replies never reached their client: give them back.
    Release(Vec<LeaseRef>),
}

/// A worker tells the net thread that a connection's request is answered
/// (only when the net thread waits for it: see `ClientConn::finish_request`).
#[derive(Debug, Clone, Copy)]
pub struct Done {
    /// The connection's token.
    pub token: usize,
    /// Its id (tokens are reused).
    pub conn_id: u64,
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
}

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
    /// Database connections.
    pub pool: Pool,
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
    /// When the process started.
    pub started: Instant,
    /// Where workers report answered requests (set once the net thread exists).
    pub done: Mutex<Option<(Sender<Done>, Arc<Waker>)>>,
    /// The listening address.
    pub port: u16,
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
}

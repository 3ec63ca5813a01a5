//! The measurements every thread shares: the carriers' accumulator slots and
//! the run's totals of closed windows (summary.json, `/metrics`, `stats`).
//! The stats thread that closes the windows lives in `windows.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use mwstats::clock::unix_ms;
use mwstats::slots::Accumulator;
use mwstats::WindowRecord;

use crate::recorder::{Slots, WorkerAcc};
use crate::stats::{NetCounters, WorkerCounters};

/// Measurement state shared by workers, the stats thread, `stats` and the admin endpoint.
pub struct Telemetry {
    /// Per-worker accumulators.
    pub slots: Slots,
    /// Servers the accumulators are sized for.
    servers: usize,
    /// Totals of closed windows.
    run: Mutex<RunTotals>,
    /// Set after the workers have stopped: close the last window and finish.
    pub(crate) stop: AtomicBool,
}

/// What the closed windows add up to.
pub struct RunTotals {
    /// Everything recorded in closed windows.
    pub total: WorkerAcc,
    /// Start of the run, wall clock.
    pub start_unix_ms: u64,
    /// The last closed window.
    pub last: Option<WindowRecord>,
    /// Net counters at the end of the last closed window.
    pub(crate) net_last: Vec<u64>,
    /// Counter values at the last `stats reset`.
    reset_workers: WorkerCounters,
    reset_net: Vec<u64>,
}

/// Counters of the `stats` command: closed windows plus what workers hold now.
pub struct LiveCounters {
    /// memcached-style counters.
    pub counters: WorkerCounters,
    /// Requests completed.
    pub requests: u64,
    /// Nanoseconds workers were busy.
    pub busy_ns: u64,
    /// Net counters in `NetCounters::NAMES` order.
    pub net: Vec<u64>,
}

impl RunTotals {
    /// Net counters at the end of the last closed window (`NetCounters::NAMES` order).
    pub fn net_last(&self) -> &[u64] {
        &self.net_last
    }
}

impl Telemetry {
    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.servers
    }

    /// Empty telemetry for `workers` workers and `servers` servers.
    pub fn new(workers: usize, servers: usize) -> Telemetry {
        let zero_net = vec![0; NetCounters::NAMES.len()];
        Telemetry {
            slots: Slots::new((0..workers).map(|_| WorkerAcc::new(servers)).collect()),
            servers,
            run: Mutex::new(RunTotals {
                total: WorkerAcc::new(servers),
                start_unix_ms: unix_ms(),
                last: None,
                net_last: zero_net.clone(),
                reset_workers: WorkerCounters::default(),
                reset_net: zero_net,
            }),
            stop: AtomicBool::new(false),
        }
    }

    /// The totals of closed windows.
    pub fn run(&self) -> MutexGuard<'_, RunTotals> {
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the stats thread to close the last window and finish.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Current counters (since start or the last `stats reset`).
    ///
    /// The run's lock is held while the workers' slots are read: the stats
    /// thread moves what it collects from the slots into the run's totals
    /// under the same lock, so every request is counted exactly once.
    pub fn live(&self, net: &NetCounters) -> LiveCounters {
        let run = self.run();
        let mut counters = run.total.counters.clone();
        let mut requests = run.total.requests();
        let mut busy_ns = run.total.busy_ns;
        for i in 0..self.slots.len() {
            let g = self.slots.lock(i);
            counters.add(&g.counters);
            requests += g.requests();
            busy_ns += g.busy_ns;
        }
        let net_now: Vec<u64> = net.values().iter().zip(&run.reset_net).map(|(v, b)| v.saturating_sub(*b)).collect();
        LiveCounters { counters: counters.since(&run.reset_workers), requests, busy_ns, net: net_now }
    }

    /// The run's totals plus what the workers hold now (no trace rows), read
    /// as one consistent view (see [`Telemetry::live`]).
    pub fn everything(&self) -> WorkerAcc {
        let run = self.run();
        let mut acc = WorkerAcc::new(self.servers);
        self.slots.peek(&mut acc);
        acc.absorb(&mut run.total.clone());
        acc
    }

    /// `stats reset`: counters shown by `stats` start again from zero
    /// (results files and `/metrics` keep counting).
    pub fn reset_counters(&self, net: &NetCounters) {
        let mut run = self.run();
        let mut c = run.total.counters.clone();
        for i in 0..self.slots.len() {
            c.add(&self.slots.lock(i).counters);
        }
        run.reset_workers = c;
        run.reset_net = net.values();
    }
}

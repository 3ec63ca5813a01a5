//! The measurements every thread shares (`mwstats::totals`: the carriers'
//! accumulator slots and the run's totals of closed windows), with what only
//! mwproxy keeps: the net counters at the end of the last window and the
//! counters at the last `stats reset`. The stats thread that closes the
//! windows lives in `windows.rs`.

use std::ops::Deref;

use crate::recorder::WorkerAcc;
use crate::stats::{NetCounters, WorkerCounters};

/// mwproxy's part of the run's totals.
pub struct ProxyTotals {
    /// Net counters at the end of the last closed window (`NetCounters::NAMES` order).
    pub net_last: Vec<u64>,
    /// Counter values at the last `stats reset`.
    reset_workers: WorkerCounters,
    reset_net: Vec<u64>,
}

/// What the closed windows add up to.
pub type RunTotals = mwstats::totals::Totals<WorkerAcc, ProxyTotals>;

/// Measurement state shared by the carriers, the stats thread, `stats` and the admin endpoint.
pub struct Telemetry {
    shared: mwstats::totals::Telemetry<WorkerAcc, ProxyTotals>,
    /// Servers the accumulators are sized for.
    servers: usize,
}

impl Deref for Telemetry {
    type Target = mwstats::totals::Telemetry<WorkerAcc, ProxyTotals>;
    fn deref(&self) -> &Self::Target {
        &self.shared
    }
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

impl Telemetry {
    /// Empty telemetry for `carriers` carriers and `servers` servers.
    pub fn new(carriers: usize, servers: usize) -> Telemetry {
        let zero_net = vec![0; NetCounters::NAMES.len()];
        let own =
            ProxyTotals { net_last: zero_net.clone(), reset_workers: WorkerCounters::default(), reset_net: zero_net };
        Telemetry { shared: mwstats::totals::Telemetry::new(carriers, || WorkerAcc::new(servers), own), servers }
    }

    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.servers
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
        let net_now: Vec<u64> =
            net.values().iter().zip(&run.extra.reset_net).map(|(v, b)| v.saturating_sub(*b)).collect();
        LiveCounters { counters: counters.since(&run.extra.reset_workers), requests, busy_ns, net: net_now }
    }

    /// `stats reset`: counters shown by `stats` start again from zero
    /// (results files and `/metrics` keep counting).
    pub fn reset_counters(&self, net: &NetCounters) {
        let mut run = self.run();
        let mut c = run.total.counters.clone();
        for i in 0..self.slots.len() {
            c.add(&self.slots.lock(i).counters);
        }
        run.extra.reset_workers = c;
        run.extra.reset_net = net.values();
    }
}

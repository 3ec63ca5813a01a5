//! Measurement of every request, off the request path.
//!
//! While a worker carries a job it notes plain facts (timestamps, hits, which
//! servers answered how fast) in a [`JobFacts`]. When the job is done it adds
//! them to its own [`WorkerAcc`] (the stages every middleware measures, from
//! `mwstats::stages`, plus mwproxy's own per-server figures): a handful of histogram records and counter
//! additions under the worker's own mutex, which nobody else takes except the
//! stats thread once per window (and `stats`/`/metrics` when asked). If that
//! lock is ever busy the worker records into a private spill accumulator
//! instead, so a worker never waits before a reply; it moves the spill into its
//! slot after the reply is out, before taking more work.
//!
//! The stats thread (`telemetry.rs`) swaps every worker's accumulator for an
//! empty one at each wall-clock-aligned window boundary, merges them, and
//! writes the window.

use std::ops::{Deref, DerefMut};

use mwstats::slots::Accumulator;
use mwstats::stages::{Stages, Timeline};
use mwstats::{Hist, OpKind};

use crate::stats::WorkerCounters;

/// One server as seen by a worker during a window.
#[derive(Clone, Debug, Default)]
pub struct BackendAcc {
    /// Requests sent.
    pub requests: u64,
    /// Requests without a usable reply.
    pub errors: u64,
    /// Of those, timeouts.
    pub timeouts: u64,
    /// Connections opened after a failure.
    pub reconnects: u64,
    /// Send-to-reply time of this server.
    pub server: Hist,
}

impl BackendAcc {
    fn merge(&mut self, o: &BackendAcc) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.timeouts += o.timeouts;
        self.reconnects += o.reconnects;
        self.server.merge(&o.server);
    }
}

/// Everything measured during a window, for one worker or merged: the
/// request stages every middleware measures (`mwstats::stages`, reached
/// through `Deref`), plus each server and memcached's counters.
#[derive(Clone, Debug)]
pub struct WorkerAcc {
    /// Counts, response time, per-stage times, busy and queued time, trace rows.
    pub stages: Stages<OpKind>,
    /// Per server, by its number (`Servers`); grown as servers are used.
    pub backends: Vec<BackendAcc>,
    /// memcached-style counters.
    pub counters: WorkerCounters,
}

impl Deref for WorkerAcc {
    type Target = Stages<OpKind>;
    fn deref(&self) -> &Stages<OpKind> {
        &self.stages
    }
}

impl DerefMut for WorkerAcc {
    fn deref_mut(&mut self) -> &mut Stages<OpKind> {
        &mut self.stages
    }
}

/// What a server that sent nothing yet looks like.
static NOTHING: std::sync::LazyLock<BackendAcc> = std::sync::LazyLock::new(BackendAcc::default);

impl WorkerAcc {
    /// Server `s`'s figures (empty when it has none yet).
    pub fn backend(&self, s: usize) -> &BackendAcc {
        self.backends.get(s).unwrap_or(&NOTHING)
    }

    /// An empty accumulator for `servers` servers.
    pub fn new(servers: usize) -> WorkerAcc {
        WorkerAcc {
            stages: Stages::default(),
            backends: vec![BackendAcc::default(); servers],
            counters: WorkerCounters::default(),
        }
    }
}

/// One server's part of a job: one call, from the write to its end.
#[derive(Clone, Copy, Debug)]
pub struct BackendFact {
    /// Server index.
    pub server: usize,
    /// When the call was handed to the server's connection (ns).
    pub sent: u64,
    /// When its reply was parsed, or it failed (ns).
    pub done: u64,
    /// No usable reply.
    pub failed: bool,
    /// The failure was a timeout.
    pub timeout: bool,
    /// Connections opened after a failure.
    pub reconnects: u64,
}

/// What a worker notes while it carries one job.
#[derive(Debug, Default)]
pub struct JobFacts {
    /// Taken by the worker.
    pub t_dequeue: u64,
    /// First request sent to a server.
    pub t_send: Option<u64>,
    /// Last server reply parsed.
    pub t_backend_done: u64,
    /// Keys found (retrievals).
    pub hits: u64,
    /// Exchanges with servers.
    pub backend: Vec<BackendFact>,
    /// memcached-style counters of this job.
    pub counters: WorkerCounters,
}

impl JobFacts {
    /// Notes one call's end: the first call written starts the server time
    /// (`t_send`), the last one to end closes it (`t_backend_done`).
    pub fn add(&mut self, fact: BackendFact) {
        self.t_send = Some(self.t_send.map_or(fact.sent, |t| t.min(fact.sent)));
        self.t_backend_done = self.t_backend_done.max(fact.done);
        self.backend.push(fact);
    }

    /// Forgets the previous job's facts, keeping allocations.
    pub fn begin(&mut self, t_dequeue: u64) {
        self.t_dequeue = t_dequeue;
        self.t_send = None;
        self.t_backend_done = t_dequeue;
        self.hits = 0;
        self.backend.clear();
        self.counters = WorkerCounters::default();
    }
}

/// The timestamps and outcome of a finished job, as recorded.
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    /// Request id (for trace sampling).
    pub request_id: u64,
    /// Operation class.
    pub op: OpKind,
    /// Keys requested.
    pub keys: u64,
    /// The reply was an error; `server_error` distinguishes server-side ones.
    pub status: &'static str,
    /// Bytes read.
    pub t_recv: u64,
    /// Parsed.
    pub t_parsed: u64,
    /// Queued.
    pub t_enqueue: u64,
    /// Reply handed to the socket.
    pub t_reply: u64,
}

/// Adds a finished job to an accumulator.
pub fn record(acc: &mut WorkerAcc, f: &Finished, facts: &JobFacts, worker: usize, trace_every: u64) {
    let mut servers: Vec<usize> = facts.backend.iter().map(|b| b.server).collect();
    servers.sort_unstable();
    servers.dedup();
    let t_send = facts.t_send.unwrap_or(facts.t_dequeue);
    let timeline = Timeline {
        request_id: f.request_id,
        op: f.op,
        keys: f.keys,
        hits: facts.hits,
        status: f.status,
        worker: worker as u32,
        servers: servers.len() as u32,
        t_recv: f.t_recv,
        t_parsed: f.t_parsed,
        t_enqueue: f.t_enqueue,
        t_dequeue: facts.t_dequeue,
        t_pool: None,
        t_send,
        t_backend_done: facts.t_backend_done,
        t_reply: f.t_reply,
    };
    acc.stages.record(&timeline, trace_every);
    acc.counters.add(&facts.counters);
    for b in &facts.backend {
        if b.server >= acc.backends.len() {
            acc.backends.resize_with(b.server + 1, BackendAcc::default);
        }
        let a = &mut acc.backends[b.server];
        a.requests += 1;
        a.errors += u64::from(b.failed);
        a.timeouts += u64::from(b.timeout);
        a.reconnects += b.reconnects;
        a.server.record_ns(b.done.saturating_sub(b.sent));
    }
}

impl Accumulator for WorkerAcc {
    /// Adds another accumulator (trace rows are moved, not copied).
    fn absorb(&mut self, o: &mut WorkerAcc) {
        if !o.dirty {
            return;
        }
        self.stages.merge(&mut o.stages);
        if self.backends.len() < o.backends.len() {
            self.backends.resize_with(o.backends.len(), BackendAcc::default);
        }
        for (a, b) in self.backends.iter_mut().zip(&o.backends) {
            a.merge(b);
        }
        self.counters.add(&o.counters);
    }

    /// Back to empty, keeping allocations.
    fn clear(&mut self) {
        if !self.dirty {
            return;
        }
        self.stages.reset();
        for b in &mut self.backends {
            let mut server = std::mem::take(&mut b.server);
            server.reset();
            *b = BackendAcc { server, ..BackendAcc::default() };
        }
        self.counters = WorkerCounters::default();
    }

    fn is_dirty(&self) -> bool {
        self.dirty
    }

    fn take_trace(&mut self) -> Vec<mwstats::writer::TraceRow> {
        std::mem::take(&mut self.stages.trace)
    }

    fn put_trace(&mut self, rows: Vec<mwstats::writer::TraceRow>) {
        self.stages.trace = rows;
    }
}

/// The per-worker accumulators that the stats thread collects.
pub type Slots = mwstats::slots::Slots<WorkerAcc>;

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(id: u64, recv: u64) -> Finished {
        Finished {
            request_id: id,
            op: OpKind::Get,
            keys: 1,
            status: "ok",
            t_recv: recv,
            t_parsed: recv + 1_000,
            t_enqueue: recv + 2_000,
            t_reply: recv + 50_000,
        }
    }

    #[test]
    fn records_times_and_samples_traces() {
        let mut acc = WorkerAcc::new(2);
        let mut facts = JobFacts::default();
        for id in 0..10 {
            facts.begin(id * 100_000 + 5_000);
            let (sent, done) = (facts.t_dequeue + 1_000, facts.t_dequeue + 30_000);
            facts.add(BackendFact { server: 1, sent, done, failed: false, timeout: false, reconnects: 0 });
            facts.hits = 1;
            record(&mut acc, &finished(id, id * 100_000), &facts, 0, 5);
        }
        let get = acc.ops.get(OpKind::Get);
        assert_eq!((get.count, get.hits, get.misses), (10, 10, 0));
        assert_eq!(acc.queue.quantile(0.5), 3);
        assert_eq!(acc.server.quantile(0.5), 29);
        assert_eq!(acc.service.quantile(0.5), 45);
        assert_eq!(acc.backends[1].requests, 10);
        assert_eq!(acc.trace.len(), 2);
        assert!(acc.trace[0].t_send <= acc.trace[0].t_backend_done);
        let slots = Slots::new(vec![WorkerAcc::new(2), WorkerAcc::new(2)]);
        std::mem::swap(&mut *slots.lock(1), &mut acc);
        let mut total = WorkerAcc::new(2);
        let mut spares = vec![WorkerAcc::new(2), WorkerAcc::new(2)];
        slots.collect(&mut spares, &mut total);
        assert_eq!(total.ops.all().count, 10);
        assert_eq!(total.trace.len(), 2);
        assert!(!slots.lock(1).dirty);
    }
}

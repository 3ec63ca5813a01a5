//! Measurement: each worker records every request it answers into its own
//! accumulator (the request stages of `mwstats::stages`, plus the database's
//! figures); the stats thread collects them at every wall-clock window
//! boundary and writes windows.jsonl, trace.csv and, at the end, summary.json
//! in the results format that mwproxy and mwload also write.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mwstats::clock::unix_ms;
use mwstats::record::{BackendRecord, ConnectionsRecord, DatabaseRecord, MiddlewareRecord, FORMAT};
use mwstats::slots::{Accumulator, Slots};
use mwstats::stages::Stages;
use mwstats::window::{next_boundary, sleep_until};
use mwstats::writer::ResultsWriter;
use mwstats::{Hist, Metadata, WindowRecord};

use crate::command::MqOp;
use crate::shared::{NetSnapshot, Shared};

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

impl MqAcc {
    /// Adds another accumulator (trace rows are moved).
    pub fn merge(&mut self, o: &mut MqAcc) {
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
    pub fn reset(&mut self) {
        if !self.stages.dirty {
            return;
        }
        self.stages.reset();
        self.db_requests = 0;
        self.db_errors = 0;
        self.db_unavailable = 0;
        self.long_polls = 0;
        self.long_poll.reset();
    }
}

impl Accumulator for MqAcc {
    fn absorb(&mut self, other: &mut Self) {
        self.merge(other);
    }
    fn clear(&mut self) {
        self.reset();
    }
    fn is_dirty(&self) -> bool {
        self.stages.dirty
    }
}

/// Pool counters at one instant.
#[derive(Debug, Default, Clone, Copy)]
pub struct PoolSnapshot {
    waits: u64,
    timeouts: u64,
    connects: u64,
    connect_failures: u64,
    lost: u64,
}

impl PoolSnapshot {
    fn of(shared: &Shared) -> PoolSnapshot {
        let c = &shared.pool.counters;
        let v = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        PoolSnapshot {
            waits: v(&c.waits),
            timeouts: v(&c.timeouts),
            connects: v(&c.connects),
            connect_failures: v(&c.connect_failures),
            lost: v(&c.lost),
        }
    }
}

/// What the closed windows add up to.
pub struct RunTotals {
    /// Everything recorded in closed windows.
    pub total: MqAcc,
    /// Start of the run, wall clock.
    pub start_unix_ms: u64,
    /// The last closed window.
    pub last: Option<WindowRecord>,
    net_last: NetSnapshot,
    pool_last: PoolSnapshot,
}

/// Measurement state shared by the workers, the stats thread and the admin endpoint.
pub struct Telemetry {
    /// Per-worker accumulators.
    pub slots: Slots<MqAcc>,
    run: Mutex<RunTotals>,
    stop: AtomicBool,
}

impl Telemetry {
    /// Empty telemetry for `workers` workers.
    pub fn new(workers: usize) -> Telemetry {
        Telemetry {
            slots: Slots::new((0..workers).map(|_| MqAcc::default()).collect()),
            run: Mutex::new(RunTotals {
                total: MqAcc::default(),
                start_unix_ms: unix_ms(),
                last: None,
                net_last: NetSnapshot::default(),
                pool_last: PoolSnapshot::default(),
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

    /// The run's totals plus what the workers hold now (no trace rows).
    pub fn everything(&self) -> MqAcc {
        let run = self.run();
        let mut acc = MqAcc::default();
        for i in 0..self.slots.len() {
            let mut c = self.slots.lock(i).clone();
            c.stages.trace.clear();
            acc.merge(&mut c);
        }
        let mut t = run.total.clone();
        t.stages.trace.clear();
        acc.merge(&mut t);
        acc
    }
}

/// The results-format record of `acc` over `[start, start + duration)`.
fn build_record(
    shared: &Shared,
    acc: &MqAcc,
    window: Option<u64>,
    start_unix_ms: u64,
    duration_ms: u64,
    (net_now, net_before): (NetSnapshot, NetSnapshot),
    (pool_now, pool_before): (PoolSnapshot, PoolSnapshot),
) -> WindowRecord {
    let cfg = &shared.config;
    let workers = cfg.server.workers as u64;
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let mut backends = BTreeMap::new();
    backends.insert(
        "postgres".to_string(),
        BackendRecord {
            requests: acc.db_requests,
            errors: acc.db_errors,
            timeouts: acc.db_unavailable,
            server_us: acc.stages.server.summary(),
        },
    );
    let s = &acc.stages;
    WindowRecord {
        format: FORMAT.into(),
        source: "mwmq".into(),
        instance: cfg.stats.instance.clone(),
        window,
        start_unix_ms,
        duration_ms,
        ops: s.ops.records(),
        middleware: Some(MiddlewareRecord {
            queue_length_mean: s.queue_length_mean(duration_ms),
            workers,
            worker_utilisation: s.utilisation(workers, duration_ms),
            net_us: s.net.summary(),
            queue_us: s.queue.summary(),
            server_us: s.server.summary(),
            service_us: s.service.summary(),
            backends,
            connections: ConnectionsRecord {
                open: net_now.accepted.saturating_sub(net_now.closed),
                accepted: d(net_now.accepted, net_before.accepted),
                closed: d(net_now.closed, net_before.closed),
                rejected: d(net_now.rejected, net_before.rejected),
            },
            bytes_in: d(net_now.bytes_in, net_before.bytes_in),
            bytes_out: d(net_now.bytes_out, net_before.bytes_out),
            protocol_errors: d(net_now.protocol_errors, net_before.protocol_errors),
            queue_full: d(net_now.queue_full, net_before.queue_full),
            pool_us: Some(s.pool.summary()),
            database: Some(DatabaseRecord {
                pool_size: shared.pool.size() as u64,
                pool_open: shared.pool.occupancy().0 as u64,
                pool_waits: d(pool_now.waits, pool_before.waits),
                pool_timeouts: d(pool_now.timeouts, pool_before.timeouts),
                connects: d(pool_now.connects, pool_before.connects),
                connect_failures: d(pool_now.connect_failures, pool_before.connect_failures),
                connections_lost: d(pool_now.lost, pool_before.lost),
                long_polls: acc.long_polls,
                long_poll_us: acc.long_poll.summary(),
                leases_released: d(net_now.leases_released, net_before.leases_released),
            }),
        }),
        client: None,
        metadata: None,
    }
}

/// The record of the window in progress (for `/stats`).
pub fn current_record(shared: &Shared) -> (WindowRecord, Option<WindowRecord>) {
    let t = &shared.telemetry;
    let mut live = MqAcc::default();
    for i in 0..t.slots.len() {
        let mut c = t.slots.lock(i).clone();
        c.stages.trace.clear();
        live.merge(&mut c);
    }
    let run = t.run();
    let start = run.last.as_ref().map(|l| l.start_unix_ms + l.duration_ms).unwrap_or(run.start_unix_ms);
    let now = unix_ms();
    let rec = build_record(
        shared,
        &live,
        None,
        start,
        now.saturating_sub(start),
        (shared.net.snapshot(), run.net_last),
        (PoolSnapshot::of(shared), run.pool_last),
    );
    (rec, run.last.clone())
}

/// Runs until [`Telemetry::stop`]: one window per boundary, then the summary.
pub fn run_stats_thread(shared: Arc<Shared>, mut out: Option<ResultsWriter>) {
    let t = &shared.telemetry;
    let window_ms = shared.config.stats.window_ms;
    let mut spares: Vec<MqAcc> = (0..t.slots.len()).map(|_| MqAcc::default()).collect();
    let mut window = MqAcc::default();
    let mut start = t.run().start_unix_ms;
    let mut boundary = next_boundary(start, window_ms);
    let mut index = 0;
    loop {
        let stopped = sleep_until(boundary, || t.stop.load(Ordering::Relaxed));
        let end = if stopped { unix_ms().max(start) } else { boundary };
        {
            let mut run = t.run();
            t.slots.collect(&mut spares, &mut window);
            let trace = std::mem::take(&mut window.stages.trace);
            run.total.merge(&mut window);
            window.stages.trace = trace;
        }
        let net_now = shared.net.snapshot();
        let pool_now = PoolSnapshot::of(&shared);
        let (net_before, pool_before) = {
            let run = t.run();
            (run.net_last, run.pool_last)
        };
        let record = build_record(
            &shared,
            &window,
            Some(index),
            start,
            end - start,
            (net_now, net_before),
            (pool_now, pool_before),
        );
        if let Some(w) = out.as_mut() {
            if let Err(e) = w.window(&record).and_then(|_| w.trace(&window.stages.trace)) {
                tracing::error!("cannot write results: {e}; results output stopped");
                out = None;
            }
        }
        {
            let mut run = t.run();
            run.net_last = net_now;
            run.pool_last = pool_now;
            run.last = Some(record);
        }
        window.reset();
        if stopped {
            break;
        }
        start = boundary;
        boundary += window_ms;
        index += 1;
    }
    if let Some(mut w) = out {
        if let Err(e) = w.summary(&summary_record(&shared)) {
            tracing::error!("cannot write summary.json: {e}");
        }
    }
}

/// The whole run as one record, with metadata.
pub fn summary_record(shared: &Shared) -> WindowRecord {
    let run = shared.telemetry.run();
    let end = run.last.as_ref().map(|l| l.start_unix_ms + l.duration_ms).unwrap_or_else(unix_ms);
    let mut r = build_record(
        shared,
        &run.total,
        None,
        run.start_unix_ms,
        end - run.start_unix_ms,
        (run.net_last, NetSnapshot::default()),
        (run.pool_last, PoolSnapshot::default()),
    );
    let config = serde_json::to_value(&shared.config).unwrap_or_default();
    r.metadata = Some(Metadata::of_run(crate::VERSION, config, run.start_unix_ms, end));
    r
}

/// Opens the results directory if one was configured.
pub fn open_results(dir: Option<&str>, trace_every: u64) -> std::io::Result<Option<ResultsWriter>> {
    match dir {
        Some(d) => ResultsWriter::create(Path::new(d), trace_every > 0).map(Some),
        None => Ok(None),
    }
}

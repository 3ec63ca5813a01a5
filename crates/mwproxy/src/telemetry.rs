//! The stats thread: closes a window at every wall-clock boundary, writes it
//! (windows.jsonl, trace.csv), keeps the run's totals (summary.json,
//! `/metrics`, `stats`), and turns accumulators into results-format records.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mwstats::clock::unix_ms;
use mwstats::record::{BackendRecord, ConnectionsRecord, MiddlewareRecord, FORMAT};
use mwstats::window::{next_boundary, sleep_until};
use mwstats::writer::ResultsWriter;
use mwstats::{Metadata, WindowRecord};

use crate::recorder::{Slots, WorkerAcc};
use crate::shared::Shared;
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
    stop: AtomicBool,
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
    net_last: Vec<u64>,
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
        crate::recorder::peek(&self.slots, &mut acc);
        acc.merge_copy(&run.total);
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

/// The results-format record of `acc` over `[start, start + duration)`.
pub fn build_record(
    shared: &Shared,
    acc: &WorkerAcc,
    window: Option<u64>,
    start_unix_ms: u64,
    duration_ms: u64,
    net_now: &[u64],
    net_before: &[u64],
) -> WindowRecord {
    let cfg = &shared.config;
    let delta =
        |name: &str| NetCounters::value_of(net_now, name).saturating_sub(NetCounters::value_of(net_before, name));
    let workers = cfg.proxy.carriers() as u64;
    let backends = shared
        .servers
        .addrs
        .iter()
        .zip(&acc.backends)
        .map(|(addr, b)| {
            (
                addr.to_string(),
                BackendRecord {
                    requests: b.requests,
                    errors: b.errors,
                    timeouts: b.timeouts,
                    server_us: b.server.summary(),
                },
            )
        })
        .collect();
    let open = NetCounters::value_of(net_now, "total_connections")
        .saturating_sub(NetCounters::value_of(net_now, "closed_connections"));
    WindowRecord {
        format: FORMAT.into(),
        source: "mwproxy".into(),
        instance: cfg.stats.instance.clone(),
        window,
        start_unix_ms,
        duration_ms,
        ops: acc.ops.records(),
        middleware: Some(MiddlewareRecord {
            queue_length_mean: acc.queue_length_mean(duration_ms),
            workers,
            worker_utilisation: acc.utilisation(workers, duration_ms),
            net_us: acc.net.summary(),
            queue_us: acc.queue.summary(),
            server_us: acc.server.summary(),
            service_us: acc.service.summary(),
            backends,
            connections: ConnectionsRecord {
                open,
                accepted: delta("total_connections"),
                closed: delta("closed_connections"),
                rejected: delta("rejected_connections"),
            },
            bytes_in: delta("bytes_read"),
            bytes_out: delta("bytes_written"),
            protocol_errors: delta("protocol_errors"),
            queue_full: delta("queue_full"),
            pool_us: None,
            database: None,
        }),
        client: None,
        metadata: None,
    }
}

/// Runs until [`Telemetry::stop`]: one window per boundary, then the summary.
pub fn run_stats_thread(shared: Arc<Shared>, mut out: Option<ResultsWriter>) {
    let t = &shared.telemetry;
    let window_ms = shared.config.stats.window_ms;
    let workers = t.slots.len();
    let mut spares: Vec<WorkerAcc> = (0..workers).map(|_| WorkerAcc::new(t.servers())).collect();
    let mut window = WorkerAcc::new(t.servers());
    let mut start = t.run().start_unix_ms;
    let mut boundary = next_boundary(start, window_ms);
    let mut index = 0;
    loop {
        let stopped = sleep_until(boundary, || t.stop.load(Ordering::Relaxed));
        let end = if stopped { unix_ms().max(start) } else { boundary };
        {
            // Into the run's totals at once, under the lock that `stats` reads
            // under: the window's figures are never out of sight while its
            // record is built and written. Trace rows go only to trace.csv.
            let mut run = t.run();
            t.slots.collect(&mut spares, &mut window);
            let trace = std::mem::take(&mut window.trace);
            run.total.merge(&mut window);
            window.trace = trace;
        }
        let net_now = shared.net.values();
        let net_before = t.run().net_last.clone();
        // A record (with its encoded histograms) is only needed for the files and `/stats`.
        let record = (out.is_some() || shared.config.stats.admin.is_some())
            .then(|| build_record(&shared, &window, Some(index), start, end - start, &net_now, &net_before));
        if let (Some(w), Some(record)) = (out.as_mut(), record.as_ref()) {
            let written = w.window(record).and_then(|_| w.trace(&window.trace));
            if let Err(e) = written {
                tracing::error!("cannot write results: {e}; results output stopped");
                out = None;
            }
        }
        {
            let mut run = t.run();
            run.net_last = net_now;
            run.last = record;
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
        let summary = summary_record(&shared);
        if let Err(e) = w.summary(&summary) {
            tracing::error!("cannot write summary.json: {e}");
        }
    }
}

/// The whole run as one record, with metadata.
pub fn summary_record(shared: &Shared) -> WindowRecord {
    let run = shared.telemetry.run();
    let end = run.last.as_ref().map(|l| l.start_unix_ms + l.duration_ms).unwrap_or_else(unix_ms);
    let zero = vec![0; NetCounters::NAMES.len()];
    let mut r =
        build_record(shared, &run.total, None, run.start_unix_ms, end - run.start_unix_ms, &run.net_last, &zero);
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

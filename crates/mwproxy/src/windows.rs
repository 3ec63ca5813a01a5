//! The stats thread's side of mwproxy's measurements: closing a window
//! (collecting the carriers' accumulators into the run's totals, under the
//! lock that `stats` reads under) and turning accumulators into
//! results-format records, for windows.jsonl, summary.json and `/stats`. The
//! loop over the windows is the one every middleware shares
//! (`mwserve::results`).

use std::sync::Arc;

use mwserve::results::{run_windows, Windows};
use mwstats::clock::unix_ms;
use mwstats::record::{BackendRecord, ConnectionsRecord, MiddlewareRecord, FORMAT};
use mwstats::slots::Accumulator;
use mwstats::writer::{ResultsWriter, TraceRow};
use mwstats::{Metadata, WindowRecord};

use crate::config::{Config, ServiceConfig};
use crate::recorder::WorkerAcc;
use crate::shared::Shared;
use crate::stats::NetCounters;

/// Runs the stats thread until the telemetry is stopped; the summary is
/// written after the last window.
pub fn run_stats_thread(shared: Arc<Shared>, out: Option<ResultsWriter>) {
    let t = &shared.telemetry;
    let servers = t.servers();
    let mut w = ProxyWindows {
        spares: (0..t.slots.len()).map(|_| WorkerAcc::new(servers)).collect(),
        window: WorkerAcc::new(servers),
        net_now: Vec::new(),
        shared: shared.clone(),
    };
    let start = t.run().start_unix_ms;
    // A record (with its encoded histograms) is only needed for the files and `/stats`.
    let always = shared.config.stats.admin.is_some();
    run_windows(&mut w, start, shared.config.stats.window_ms, t.stopping(), out, always);
}

/// The window being closed.
struct ProxyWindows {
    shared: Arc<Shared>,
    spares: Vec<WorkerAcc>,
    window: WorkerAcc,
    /// Net counters at the end of the window.
    net_now: Vec<u64>,
}

impl Windows for ProxyWindows {
    fn close(&mut self, index: u64, start: u64, end: u64, wanted: bool) -> Option<WindowRecord> {
        let net_before = self.shared.telemetry.close_window(&mut self.spares, &mut self.window).extra.net_last.clone();
        self.net_now = self.shared.net.values();
        let (s, w) = (&self.shared, &self.window);
        wanted.then(|| build_record(s, w, Some(index), start, end - start, &self.net_now, &net_before))
    }

    fn trace(&self) -> &[TraceRow] {
        &self.window.trace
    }

    fn next(&mut self, record: Option<WindowRecord>) {
        let mut run = self.shared.telemetry.run();
        run.extra.net_last = std::mem::take(&mut self.net_now);
        run.last = record;
        drop(run);
        self.window.clear();
    }

    fn summary(&self) -> WindowRecord {
        summary_record(&self.shared)
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
    // The servers of the configuration in use, and those a reload removed
    // while they still carried requests of this window.
    let generation = shared.generation();
    let backends = shared
        .servers
        .endpoints()
        .iter()
        .enumerate()
        .map(|(i, e)| (e.addr.clone(), acc.backend(i), generation.uses(i)))
        .filter(|(_, b, used)| *used || b.requests > 0)
        .map(|(addr, b, _)| {
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
        instance: cfg.stats.instance_or(Config::INSTANCE).to_string(),
        window,
        start_unix_ms,
        duration_ms,
        collected_late_us: None,
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

/// The whole run as one record, with metadata.
pub fn summary_record(shared: &Shared) -> WindowRecord {
    let run = shared.telemetry.run();
    let end = run.last.as_ref().map(|l| l.start_unix_ms + l.duration_ms).unwrap_or_else(unix_ms);
    let zero = vec![0; NetCounters::NAMES.len()];
    let mut r =
        build_record(shared, &run.total, None, run.start_unix_ms, end - run.start_unix_ms, &run.extra.net_last, &zero);
    let config = serde_json::to_value(&shared.generation().config).unwrap_or_default();
    r.metadata = Some(Metadata::of_run(crate::VERSION, config, run.start_unix_ms, end));
    r
}

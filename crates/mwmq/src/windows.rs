//! The stats thread's side of mwmq's measurements: closing a window
//! (collecting the workers' accumulators into the run's totals) and turning
//! accumulators into results-format records, for windows.jsonl, trace.csv,
//! summary.json and `/stats`. The loop over the windows is the one every
//! middleware shares (`mwserve::results`).

use std::collections::BTreeMap;
use std::sync::Arc;

use mwserve::results::{run_windows, Windows};
use mwstats::clock::unix_ms;
use mwstats::record::{BackendRecord, ConnectionsRecord, DatabaseRecord, MiddlewareRecord, FORMAT};
use mwstats::slots::Accumulator;
use mwstats::writer::{ResultsWriter, TraceRow};
use mwstats::{Metadata, WindowRecord};

use crate::config::{Config, ServiceConfig};
use crate::shared::Shared;
use crate::telemetry::{MqAcc, NetSnapshot, PoolSnapshot};

/// Runs the stats thread until the telemetry is stopped; the summary is
/// written after the last window.
pub fn run_stats_thread(shared: Arc<Shared>, out: Option<ResultsWriter>) {
    let t = &shared.telemetry;
    let mut w = MqWindows {
        spares: (0..t.slots.len()).map(|_| MqAcc::default()).collect(),
        window: MqAcc::default(),
        now: (NetSnapshot::default(), PoolSnapshot::default()),
        shared: shared.clone(),
    };
    let start = t.run().start_unix_ms;
    run_windows(&mut w, start, shared.config.stats.window_ms, t.stopping(), out, true);
}

/// The window being closed.
struct MqWindows {
    shared: Arc<Shared>,
    spares: Vec<MqAcc>,
    window: MqAcc,
    /// Net and pool counters at the end of the window.
    now: (NetSnapshot, PoolSnapshot),
}

impl Windows for MqWindows {
    fn close(&mut self, index: u64, start: u64, end: u64, wanted: bool) -> Option<WindowRecord> {
        let before = self.shared.telemetry.close_window(&mut self.spares, &mut self.window).extra;
        self.now = (self.shared.net.snapshot(), PoolSnapshot::of(&self.shared.pool));
        let (net, pool) = ((self.now.0, before.0), (self.now.1, before.1));
        wanted.then(|| build_record(&self.shared, &self.window, Some(index), start, end - start, net, pool))
    }

    fn trace(&self) -> &[TraceRow] {
        &self.window.stages.trace
    }

    fn next(&mut self, record: Option<WindowRecord>) {
        let mut run = self.shared.telemetry.run();
        run.extra = self.now;
        run.last = record;
        drop(run);
        self.window.clear();
    }

    fn summary(&self) -> WindowRecord {
        summary_record(&self.shared)
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
        instance: cfg.stats.instance_or(Config::INSTANCE).to_string(),
        window,
        start_unix_ms,
        duration_ms,
        collected_late_us: None,
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
    // The slots are read under the run's lock, which the stats thread holds
    // while it closes a window: what they hold is then this window's.
    let run = t.run();
    let mut live = MqAcc::default();
    t.slots.peek(&mut live);
    let start = run.window_start();
    let now = unix_ms();
    let rec = build_record(
        shared,
        &live,
        None,
        start,
        now.saturating_sub(start),
        (shared.net.snapshot(), run.extra.0),
        (PoolSnapshot::of(&shared.pool), run.extra.1),
    );
    (rec, run.last.clone())
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
        (run.extra.0, NetSnapshot::default()),
        (run.extra.1, PoolSnapshot::default()),
    );
    let config = serde_json::to_value(shared.config.redacted()).unwrap_or_default();
    r.metadata = Some(Metadata::of_run(crate::VERSION, config, run.start_unix_ms, end));
    r
}

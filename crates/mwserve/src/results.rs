//! The stats thread's window loop, the same for every middleware: close a
//! window at every wall-clock multiple of the window length, write it
//! (windows.jsonl, trace.csv), and at the end write summary.json. What a
//! window holds and how its record is built is the middleware's
//! ([`Windows`]).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use mwstats::clock::{unix_ms, unix_us};
use mwstats::window::{next_boundary, sleep_until};
use mwstats::writer::ResultsWriter;
use mwstats::writer::TraceRow;
use mwstats::WindowRecord;

use crate::config::StatsConfig;
use crate::start::StartError;

/// What the window loop asks of a middleware's measurements.
pub trait Windows {
    /// Moves what was recorded since the last window into the run's totals
    /// and returns the record of window `index` over `[start, end)` (wall
    /// clock, ms) when `wanted`.
    fn close(&mut self, index: u64, start_unix_ms: u64, end_unix_ms: u64, wanted: bool) -> Option<WindowRecord>;
    /// The sampled requests of the window just closed.
    fn trace(&self) -> &[TraceRow];
    /// The window is written: keep its record as the last one (`/stats`)
    /// and start the next one empty.
    fn next(&mut self, record: Option<WindowRecord>);
    /// The whole run as one record, with metadata.
    fn summary(&self) -> WindowRecord;
}

/// Opens the results directory of `stats`, if one is configured.
pub fn open_results(stats: &StatsConfig) -> Result<Option<ResultsWriter>, StartError> {
    match &stats.out {
        Some(d) => ResultsWriter::create(Path::new(d), stats.trace_every > 0)
            .map(Some)
            .map_err(|e| StartError::Results(d.clone(), e)),
        None => Ok(None),
    }
}

/// Runs until `stop` is set: one window per boundary from `start_unix_ms`,
/// written to `out`; then the summary. `always` builds every window's record
/// even without files (for the admin endpoint's `/stats`).
pub fn run_windows(
    w: &mut impl Windows,
    start_unix_ms: u64,
    window_ms: u64,
    stop: &AtomicBool,
    mut out: Option<ResultsWriter>,
    always: bool,
) {
    let mut start = start_unix_ms;
    let mut boundary = next_boundary(start, window_ms);
    let mut index = 0;
    loop {
        let stopped = sleep_until(boundary, || stop.load(Ordering::Relaxed));
        let end = if stopped { unix_ms().max(start) } else { boundary };
        let late_us = unix_us().saturating_sub(end * 1000);
        let mut record = w.close(index, start, end, out.is_some() || always);
        if let Some(r) = record.as_mut() {
            r.collected_late_us = Some(late_us);
        }
        if let (Some(f), Some(r)) = (out.as_mut(), record.as_ref()) {
            if let Err(e) = f.window(r).and_then(|_| f.trace(w.trace())) {
                tracing::error!("cannot write results: {e}; results output stopped");
                out = None;
            }
        }
        w.next(record);
        if stopped {
            break;
        }
        start = boundary;
        boundary += window_ms;
        index += 1;
    }
    if let Some(mut f) = out {
        if let Err(e) = f.summary(&w.summary()) {
            tracing::error!("cannot write summary.json: {e}");
        }
    }
}

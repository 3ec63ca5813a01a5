//! What every thread of a measuring middleware shares of its measurements:
//! one accumulator slot per carrier ([`Slots`]) and the run's totals of the
//! closed windows, which the stats thread grows once a window and `stats`,
//! `/metrics` and summary.json read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::clock::unix_ms;
use crate::slots::{Accumulator, Slots};
use crate::WindowRecord;

/// What the closed windows add up to; `extra` is the middleware's own (the
/// counters it read at the end of the last window, ...).
pub struct Totals<A, X> {
    /// Everything recorded in closed windows (without trace rows).
    pub total: A,
    /// Start of the run, wall clock (ms).
    pub start_unix_ms: u64,
    /// The last closed window's record.
    pub last: Option<WindowRecord>,
    /// The middleware's own part.
    pub extra: X,
}

impl<A, X> Totals<A, X> {
    /// Where the window in progress began: the end of the last closed one.
    pub fn window_start(&self) -> u64 {
        self.last.as_ref().map(|l| l.start_unix_ms + l.duration_ms).unwrap_or(self.start_unix_ms)
    }
}

/// The carriers' slots and the run's totals.
pub struct Telemetry<A, X> {
    /// One accumulator per carrier (worker, event loop).
    pub slots: Slots<A>,
    run: Mutex<Totals<A, X>>,
    stop: AtomicBool,
}

impl<A: Accumulator + Clone, X> Telemetry<A, X> {
    /// `carriers` empty slots made by `empty`, and empty totals with `extra`.
    pub fn new(carriers: usize, empty: impl Fn() -> A, extra: X) -> Telemetry<A, X> {
        Telemetry {
            slots: Slots::new((0..carriers).map(|_| empty()).collect()),
            run: Mutex::new(Totals { total: empty(), start_unix_ms: unix_ms(), last: None, extra }),
            stop: AtomicBool::new(false),
        }
    }

    /// The totals of closed windows.
    pub fn run(&self) -> MutexGuard<'_, Totals<A, X>> {
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the stats thread to close the last window and finish.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Set by [`Telemetry::stop`].
    pub fn stopping(&self) -> &AtomicBool {
        &self.stop
    }

    /// Closes a window: what the slots hold goes into `window` and into the
    /// run's totals at once, under the lock that readers of the totals take,
    /// so nothing is ever out of sight or counted twice; the totals stay
    /// locked for the caller.
    pub fn close_window(&self, spares: &mut [A], window: &mut A) -> MutexGuard<'_, Totals<A, X>> {
        let mut run = self.run();
        self.slots.close_window(spares, window, &mut run.total);
        run
    }

    /// The run's totals plus what the carriers hold now (no trace rows), as
    /// one consistent view.
    pub fn everything(&self) -> A {
        let run = self.run();
        let mut acc = run.total.clone();
        self.slots.peek(&mut acc);
        acc
    }
}

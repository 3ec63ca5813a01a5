//! `mwstats`: what mwproxy, mwmq and mwload share for measurement.
//!
//! - [`clock`]: one monotonic nanosecond clock per process, linked to wall time;
//! - [`hist`]: HDR histograms in microseconds with their portable encoding;
//! - [`ops`]: per-operation counts and response times of a window;
//! - [`record`], [`writer`], [`reader`]: the results format (docs/results-format.md);
//! - [`window`]: wall-clock-aligned window boundaries;
//! - [`stages`]: a middleware's per-stage times of every request (shared by mwproxy and mwmq);
//! - [`slots`]: per-thread accumulators collected once per window without making threads wait;
//! - [`totals`]: the slots and the run's totals of closed windows, as a middleware's threads share them;
//! - [`prom`]: Prometheus text exposition of counters and histograms.

pub mod clock;
pub mod hist;
pub mod ops;
pub mod prom;
pub mod reader;
pub mod record;
pub mod redact;
pub mod slots;
pub mod stages;
pub mod totals;
pub mod window;
pub mod writer;

pub use hist::{Hist, HistSummary};
pub use ops::{MqOp, OpAcc, OpClass, OpKind, Ops};
pub use record::{Metadata, WindowRecord, FORMAT};

/// The git revision the binaries were built from (`unknown` outside a checkout).
pub const GIT_REVISION: &str = env!("MWLAB_GIT_REVISION");

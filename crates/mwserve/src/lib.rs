//! `mwserve`: the parts of a middleware process that do not depend on its
//! protocol, shared by mwproxy (memcached) and mwmq (RESP over PostgreSQL).
//!
//! - [`queue`]: the bounded, fair request queue between net threads and workers;
//! - [`fdlimit`]: raising the open-file limit and working out how many clients fit;
//! - [`http`]: the small blocking HTTP admin endpoint (`/metrics`, `/stats`, `/healthz`);
//! - [`process`]: logging set-up, stopping on SIGTERM/SIGINT, size and boolean flags.

pub mod fdlimit;
pub mod http;
pub mod process;
pub mod queue;

//! `mwserve`: the server shell both middlewares share — mwproxy (memcached)
//! and mwmq (RESP over PostgreSQL) — so that what a server needs besides its
//! protocol is written once.
//!
//! - [`cli`]: the flags every middleware has, and its `main` ([`cli::serve`]);
//! - [`config`]: configuration files (unknown keys refused), the `[stats]`
//!   section, [`config::ConfigError`];
//! - [`start`]: why a middleware could not start;
//! - [`listen`]: binding, accepting and refusing clients (over the
//!   connection limit, or without file descriptors);
//! - [`stream`]: addresses and connections, TCP or unix sockets;
//! - [`queue`]: the bounded, fair request queue between net threads and workers;
//! - [`fdlimit`]: raising the open-file limit and working out how many clients fit;
//! - [`http`]: the small HTTP admin endpoint (`/metrics`, `/stats`, `/healthz`),
//!   whose probes idle or slow sockets cannot take down;
//! - [`results`]: the stats thread's window loop and the results directory;
//! - [`shell`]: what a running middleware has besides its own threads
//!   (address, stats thread, admin endpoint);
//! - [`throttle`]: failed logins per source (address, IPv6 /64, unix uid) and
//!   per user name (both middlewares);
//! - [`process`]: logging, stopping on SIGTERM/SIGINT, size and boolean flags.

pub mod cli;
pub mod config;
pub mod fdlimit;
pub mod http;
pub mod listen;
pub mod process;
pub mod queue;
pub mod results;
pub mod shell;
pub mod start;
pub mod stream;
pub mod throttle;
pub mod tls;

//! mwmq: a message-queue middleware over PostgreSQL, seed 004's system as
//! real software. Clients speak RESP2 (any Redis client, redis-cli,
//! redis-benchmark); one net thread parses their requests into a bounded
//! queue; workers take one request at a time, borrow a connection from a
//! bounded pool, run one short statement and reply; every request is timed
//! at each stage (net, queue, pool wait, database, service) in the results
//! format that mwproxy and mwload write. See docs/mwmq.md.

pub mod admin;
pub mod cli;
pub mod command;
pub mod commands;
pub mod config;
pub mod db;
pub mod deadline;
pub mod engine;
pub mod events;
pub mod limits;
pub mod logins;
pub mod output;
pub mod peer;
pub mod placement;
pub mod policies;
pub mod poller;
pub mod queues;
pub mod rates;
pub mod rebalance;
pub mod retention;
pub mod schedule;
/// RESP as mwmq speaks it (the server side of `respproto`).
pub use respproto::server as resp;
pub mod server;
pub mod session;
pub mod shared;
pub mod sqlguard;
pub mod streambounds;
pub mod streamrules;
pub mod telemetry;
pub mod ticker;
pub mod users;
pub mod waiters;
pub mod windows;
pub mod words;
pub mod xcommand;

pub use config::Config;
pub use mwserve::cli::Service;
pub use mwserve::shell::Stopper;
pub use server::{Mq, StartError};

/// mwmq's version (reported by `INFO` and in summaries).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

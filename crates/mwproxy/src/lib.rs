//! mwproxy: a memcached middleware that spreads, replicates and shards
//! requests over many memcached servers and measures itself.
//!
//! Two engines carry requests, over one routing core:
//!
//! - the **pool engine** (`--engine pool`, the seed reports' architecture):
//!   net threads accept clients and parse their requests (`net.rs`) into each
//!   connection's line (`conn.rs`); a bounded, fair queue (`queue.rs`) hands
//!   connections to a pool of workers (`worker.rs`), each of which owns a
//!   blocking connection to every server (`backend.rs`);
//! - the **async engine** (`--engine async`): each event loop (`net.rs` with a
//!   [`pipeline::Pipeline`]) owns its clients and one pipelined connection to
//!   every server, and carries its clients' requests itself.
//!
//! Both take the same batches and waves of a connection's requests and
//! deliver and record them alike (`batch.rs`). What a request does — which
//! servers, which bytes, how the replies combine — is decided by the routing
//! core (`route/`) — or, with a route tree over several pools, by the tree
//! (`routes/`) over each pool's routing core — how a request talks to a server — admission, probe,
//! repairs first, stall, timeout, failure — by the exchange (`exchange.rs`)
//! over the servers' shared health (`health.rs`) and repair logs
//! (`repair.rs`); none of these does I/O. A health checker thread
//! (`checker.rs`) keeps the health current when no request reaches a server. The engines only move bytes. The
//! shell every middleware has — flags, configuration, listener, admin
//! endpoint, stats thread — is `mwserve`'s; [`Proxy`] starts it all and
//! `main.rs` only parses the command line (`cli.rs`).

pub mod admin;
pub mod auth;
pub mod backend;
pub mod backend_error;
pub mod batch;
pub mod budget;
pub mod carry;
pub mod checker;
pub mod cli;
pub mod config;
pub mod conn;
pub mod credentials;
pub mod exchange;
pub mod fdlimit;
pub mod generation;
pub mod health;
pub mod local;
pub mod mccli;
pub mod net;
pub mod nutcli;
pub mod nutstats;
pub mod pipeline;
pub mod pools;
pub mod queue;
pub mod recorder;
pub mod reload;
pub mod repair;
pub mod route;
pub mod routes;
pub mod server;
pub mod shared;
pub mod stats;
pub mod telemetry;
pub mod twemproxy;
pub mod windows;
pub mod worker;

pub use config::{Config, ServiceConfig};
pub use mwserve::cli::Service;
pub use mwserve::shell::Stopper;
pub use server::{Proxy, StartError};

/// The version mwproxy reports (`version` command, `stats`).
pub const VERSION: &str = concat!("mwproxy-", env!("CARGO_PKG_VERSION"));

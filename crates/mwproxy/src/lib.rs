//! mwproxy: a memcached middleware that spreads, replicates and shards
//! requests over many memcached servers and measures itself.
//!
//! The pool engine: net threads accept clients and parse their requests
//! (`net.rs`) into each connection's line (`conn.rs`); a bounded, fair queue
//! (`queue.rs`) hands connections to a pool of workers (`worker.rs`), each of
//! which owns a connection to every server (`backend.rs`), carries out a batch
//! of the connection's requests and answers in request order. What a request
//! does — which servers, which bytes, how the replies combine — is decided by
//! the routing core (`route/`), which has no I/O. The servers' health
//! (`health.rs`), the repairs that keep replicas converging (`repair.rs`) and
//! the memory budgets (`budget.rs`) are shared by all threads (`shared.rs`).
//! The binary in `main.rs` only parses the command line (`cli.rs`) and starts
//! a [`Proxy`].

pub mod admin;
pub mod backend;
pub mod batch;
pub mod budget;
pub mod cli;
pub mod config;
pub mod conn;
pub mod exchange;
pub mod fdlimit;
pub mod health;
pub mod local;
pub mod net;
pub mod pipeline;
pub mod queue;
pub mod recorder;
pub mod repair;
pub mod route;
pub mod server;
pub mod shared;
pub mod stats;
pub mod telemetry;
pub mod windows;
pub mod worker;

pub use config::{Config, ServiceConfig};
pub use mwserve::cli::{Service, Stopper};
pub use server::{Proxy, StartError};

/// The version mwproxy reports (`version` command, `stats`).
pub const VERSION: &str = concat!("mwproxy-", env!("CARGO_PKG_VERSION"));

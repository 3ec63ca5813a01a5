//! mwproxy: a memcached middleware that spreads, replicates and shards
//! requests over many memcached servers and measures itself.
//!
//! The pool engine: net threads accept clients and parse their requests
//! (`net.rs`), a bounded FIFO queue hands them to a pool of workers
//! (`worker.rs`, `commands.rs`), each of which owns a connection to every
//! server (`backend.rs`) and answers the client in request order (`conn.rs`).
//! Keys are placed with ketama consistent hashing (`mcproto::ring`). The binary in
//! `main.rs` only parses the command line (`cli.rs`) and starts a [`Proxy`].

pub mod admin;
pub mod backend;
pub mod cli;
mod commands;
pub mod config;
pub mod conn;
pub mod net;
pub mod recorder;
pub mod server;
pub mod stats;
pub mod telemetry;
pub mod worker;

pub use config::Config;
pub use server::{Proxy, StartError, Stopper};

/// The version mwproxy reports (`version` command, `stats`).
pub const VERSION: &str = concat!("mwproxy-", env!("CARGO_PKG_VERSION"));

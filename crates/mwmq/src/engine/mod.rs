//! The two engines, which only move bytes and requests: what a command
//! does is `commands/`, the driver of its statements `commands/carry.rs`.
//!
//! - the **async engine** (`aio.rs`, the default): each event loop thread
//!   owns its clients and a few pipelined database connections;
//! - the **pool engine** (`--engine pool`): one net thread (`net.rs`) reads
//!   each connection (`conn.rs`) and queues its requests as jobs (`job.rs`);
//!   workers (`worker.rs`) carry them out on pooled connections.

pub mod aio;
pub mod conn;
pub mod job;
pub mod net;
pub mod worker;

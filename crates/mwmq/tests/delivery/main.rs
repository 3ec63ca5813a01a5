//! How messages are handed out, beyond first come first served: ordered
//! groups (`groups.rs`), pausing a queue and limiting its deliveries
//! (`limits.rs`), priorities (`priorities.rs`) and retry backoff
//! (`backoff.rs`), and the plans of the statements that do it
//! (`plans.rs`). One test binary for all (each binary is linked on its own).

#[path = "../common/mod.rs"]
mod common;

mod backoff;
mod groups;
mod limits;
mod plans;
mod priorities;

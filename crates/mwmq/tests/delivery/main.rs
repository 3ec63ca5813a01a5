//! How messages are handed out, beyond first come first served: ordered
//! groups (`groups.rs`), pausing a queue and limiting its deliveries
//! (`limits.rs`). One test binary for both (each binary is linked on its own).

#[path = "../common/mod.rs"]
mod common;

mod groups;
mod limits;

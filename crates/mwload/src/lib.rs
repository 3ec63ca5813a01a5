//! mwload: a memcached (and mwmq) load generator that measures right.
//!
//! Closed loop (threads x connections x virtual clients, think time) and open
//! loop (Poisson arrivals at a target rate, latency from the intended send
//! time), key patterns (uniform, sequential, gaussian, zipf), value sizes, a
//! set:get:delete mix with multi-gets, several targets placed with mwproxy's
//! ketama ring, prefill and verification. Results in the shared results format
//! (`mwstats`), a live progress line and a memtier-style table. With
//! `--protocol mq` the same engine drives mwmq over RESP: SENDs and receives
//! (POP, or RECV then ACK), clients in pairs sending to each other.

pub mod acc;
pub mod config;
pub mod engine;
/// RESP as mwload speaks it to mwmq (the client side of `respproto`).
pub use respproto::client as resp;
pub mod rng;
pub mod run;
pub mod sample;
pub mod secure;
pub mod workload;

//! `respproto`: RESP, the Redis serialization protocol, without I/O — bytes
//! in, requests or replies out — for both ends of mwmq's connections, as
//! `mcproto` is for memcached's:
//!
//! - [`server`]: the request parser (arrays of bulk strings and inline
//!   commands, fed whatever bytes arrived, with limits) and the reply
//!   encoder (RESP2, and RESP3 for clients that ask with `HELLO 3`), used by
//!   mwmq;
//! - [`client`]: requests written as arrays of bulk strings, and replies read
//!   far enough to count messages and find the lease to acknowledge, used by
//!   mwload.
//!
//! Tested with frames split at every byte boundary and under proptest
//! (`tests/fuzz.rs`).

pub mod client;
pub mod server;

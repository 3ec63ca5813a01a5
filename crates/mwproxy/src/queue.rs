//! The request queue between the net threads and the workers
//! (`mwserve::queue::WorkQueue`, shared with mwmq).
//!
//! mwproxy queues connections that have requests waiting, not the requests
//! themselves: those wait in their connection's own line (`conn.rs`), so that
//! a connection's requests take effect in order and a pipelining connection
//! is one entry, not thousands. A connection is in the queue (or in a worker)
//! at most once. Fresh entries are connections that had nothing waiting until
//! the net thread read a request; entries sent again are connections a worker
//! put back after a bounded batch because more of their requests wait.

use std::sync::Arc;

use crate::conn::ClientConn;

/// Connections waiting for a worker.
pub type WorkQueue = mwserve::queue::WorkQueue<Arc<ClientConn>>;

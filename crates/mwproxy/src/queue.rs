//! The request queue between the net threads and the workers.
//!
//! It holds connections that have requests waiting, not the requests
//! themselves: those wait in their connection's own line (`conn.rs`), so that
//! a connection's requests take effect in order and a pipelining connection
//! is one entry, not thousands. A connection is in the queue (or in a worker)
//! at most once.
//!
//! Two lines make it fair: **fresh** connections, which had nothing waiting
//! until the net thread read a request, and connections sent **again** by a
//! worker after a bounded batch because more of their requests wait. When both
//! have entries, workers take from them in turn, so a client with one request
//! at a time waits for at most about one batch, however many pipelining
//! clients keep the workers busy, and the pipelining clients are never starved.
//! The fresh line is bounded (`queue_capacity`); when it is full the net
//! thread stops reading and TCP backpressure reaches the clients. The other is
//! bounded by the number of connections.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::conn::ClientConn;

#[derive(Default)]
struct Lines {
    fresh: VecDeque<Arc<ClientConn>>,
    again: VecDeque<Arc<ClientConn>>,
    closed: bool,
    idle_workers: usize,
}

/// Connections waiting for a worker.
pub struct WorkQueue {
    lines: Mutex<Lines>,
    ready: Condvar,
    capacity: usize,
}

impl WorkQueue {
    /// A queue taking at most `capacity` fresh connections.
    pub fn new(capacity: usize) -> WorkQueue {
        WorkQueue { lines: Mutex::new(Lines::default()), ready: Condvar::new(), capacity }
    }

    fn lock(&self) -> MutexGuard<'_, Lines> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a connection that just got work; gives it back when the fresh line is full.
    pub fn push_fresh(&self, conn: Arc<ClientConn>) -> Result<(), Arc<ClientConn>> {
        let mut l = self.lock();
        if l.fresh.len() >= self.capacity {
            return Err(conn);
        }
        l.fresh.push_back(conn);
        self.wake(l);
        Ok(())
    }

    /// Queues a connection that still has work after a batch, or whose
    /// client read its replies again.
    pub fn push_again(&self, conn: Arc<ClientConn>) {
        let mut l = self.lock();
        l.again.push_back(conn);
        self.wake(l);
    }

    fn wake(&self, l: MutexGuard<'_, Lines>) {
        let idle = l.idle_workers > 0;
        drop(l);
        if idle {
            self.ready.notify_one();
        }
    }

    /// The next connection to serve; `turn` alternates between the lines when
    /// both have entries. Blocks while both are empty; `None` once the queue
    /// is closed and empty.
    pub fn pop(&self, turn: &mut bool) -> Option<Arc<ClientConn>> {
        let mut l = self.lock();
        loop {
            let take_again = match (l.fresh.is_empty(), l.again.is_empty()) {
                (false, false) => {
                    *turn = !*turn;
                    *turn
                }
                (true, false) => true,
                (false, true) => false,
                (true, true) => {
                    if l.closed {
                        return None;
                    }
                    l.idle_workers += 1;
                    l = self.ready.wait(l).unwrap_or_else(|p| p.into_inner());
                    l.idle_workers -= 1;
                    continue;
                }
            };
            return if take_again { l.again.pop_front() } else { l.fresh.pop_front() };
        }
    }

    /// Connections waiting now.
    pub fn len(&self) -> usize {
        let l = self.lock();
        l.fresh.len() + l.again.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// No more fresh connections will come: workers finish what is queued, then stop.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

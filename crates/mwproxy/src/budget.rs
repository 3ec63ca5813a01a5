//! Memory budgets: how many bytes of requests may wait and how many bytes of
//! replies may stay unread, per connection and in total.
//!
//! A client that pipelines requests and never reads its replies must not make
//! the proxy grow without bound, and must not stop it from serving others.
//! So, per connection:
//! - its requests are not read while `max_pending_input` bytes of them wait;
//! - its waiting requests are not run, and it is not read, while more than
//!   `max_pending_output` bytes of its replies are unread;
//!
//! and in total, while all connections together hold more than
//! `memory_budget` bytes of waiting requests (or of unread replies), only
//! connections that hold none are read (or served). They can always take
//! one step, so well-behaved clients keep being served while greedy ones
//! wait for their own replies to be read.
//!
//! A request still arriving counts too ([`Budget::reserve`]): once its size
//! is known (a binary header, a storage command's line) a connection holds
//! that much of the total before reading more of it, and is not read on
//! while the total has no room (unless nothing else is held: one request can
//! always arrive). A reservation is whole, so every connection that holds
//! one can finish its request, and a client that sends half a value and
//! stops holds its share of the budget, not memory beside it. The proxy's
//! memory is then bounded by the budgets plus one read (16 KiB) and one
//! reply per connection.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::ProxyConfig;

/// Budgets and what is used of them now.
#[derive(Debug)]
pub struct Budget {
    /// Per connection: bytes of waiting requests before it is not read.
    pub input_per_conn: usize,
    /// Per connection: bytes of unread replies before it is paused.
    pub output_per_conn: usize,
    /// All connections: bytes of waiting requests, and of unread replies.
    pub total: usize,
    input: AtomicUsize,
    output: AtomicUsize,
    /// Requests waiting in connections' lines.
    queued: AtomicUsize,
}

impl Budget {
    /// The budgets of `cfg`.
    pub fn new(cfg: &ProxyConfig) -> Budget {
        Budget {
            input_per_conn: cfg.max_pending_input,
            output_per_conn: cfg.max_pending_output,
            total: cfg.memory_budget,
            input: AtomicUsize::new(0),
            output: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
        }
    }

    /// Whether a connection whose line holds `bytes` may be read.
    pub fn may_read(&self, bytes: usize) -> bool {
        bytes == 0 || (bytes < self.input_per_conn && self.input.load(Ordering::Relaxed) < self.total)
    }

    /// Whether a connection with `unread` bytes of replies may run requests (and be read).
    pub fn may_run(&self, unread: usize) -> bool {
        unread == 0 || (unread <= self.output_per_conn && self.output.load(Ordering::Relaxed) <= self.total)
    }

    /// A connection that holds `held` bytes for a request still arriving
    /// asks to hold `want`: granted when all connections' waiting and
    /// arriving requests stay within the total, or when no other connection
    /// holds any; less than it holds is always granted.
    pub fn reserve(&self, held: usize, want: usize) -> bool {
        if want <= held {
            moved(&self.input, held, want);
            return true;
        }
        let mut now = self.input.load(Ordering::Relaxed);
        loop {
            let others = now.saturating_sub(held);
            if others > 0 && others + want > self.total {
                return false;
            }
            match self.input.compare_exchange_weak(now, now + (want - held), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(n) => now = n,
            }
        }
    }

    /// A connection's waiting requests changed from `before` to `after` bytes.
    pub fn input_moved(&self, before: usize, after: usize) {
        moved(&self.input, before, after);
    }

    /// A connection's unread replies changed from `before` to `after` bytes.
    pub fn output_moved(&self, before: usize, after: usize) {
        moved(&self.output, before, after);
    }

    /// Requests were put in (`n > 0`) or taken from a line.
    pub fn queued_moved(&self, before: usize, after: usize) {
        moved(&self.queued, before, after);
    }

    /// Bytes of waiting requests, all connections.
    pub fn input_bytes(&self) -> usize {
        self.input.load(Ordering::Relaxed)
    }

    /// Bytes of unread replies, all connections.
    pub fn output_bytes(&self) -> usize {
        self.output.load(Ordering::Relaxed)
    }

    /// Requests waiting for a worker, all connections.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

fn moved(counter: &AtomicUsize, before: usize, after: usize) {
    if after > before {
        counter.fetch_add(after - before, Ordering::Relaxed);
    } else if before > after {
        counter.fetch_sub(before - after, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_holding_nothing_may_always_go_on() {
        let cfg =
            ProxyConfig { max_pending_input: 100, max_pending_output: 100, memory_budget: 150, ..Default::default() };
        let b = Budget::new(&cfg);
        assert!(b.may_read(0) && b.may_read(99) && !b.may_read(100));
        assert!(b.may_run(0) && b.may_run(100) && !b.may_run(101));
        b.output_moved(0, 200);
        assert!(!b.may_run(10), "over the total only connections without unread replies run");
        assert!(b.may_run(0));
        b.output_moved(200, 50);
        assert!(b.may_run(10));
        b.input_moved(0, 160);
        assert!(!b.may_read(1) && b.may_read(0));
        assert_eq!((b.input_bytes(), b.output_bytes()), (160, 50));
    }

    #[test]
    fn requests_still_arriving_hold_the_budget_whole_or_not_at_all() {
        let cfg =
            ProxyConfig { max_pending_input: 100, max_pending_output: 100, memory_budget: 150, ..Default::default() };
        let b = Budget::new(&cfg);
        assert!(b.reserve(0, 1000), "alone, a request larger than the budget may arrive");
        assert!(!b.reserve(0, 10), "while it holds the budget, another may not");
        assert!(b.reserve(1000, 100) && b.input_bytes() == 100, "giving back is always granted");
        assert!(b.reserve(0, 50) && b.input_bytes() == 150);
        assert!(!b.reserve(0, 1), "the total is held");
        assert!(!b.may_read(1), "and connections with waiting requests are not read");
        assert!(b.reserve(50, 0) && b.reserve(100, 0));
        assert_eq!(b.input_bytes(), 0);
    }
}

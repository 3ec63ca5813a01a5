//! The side queues: copies of requests that nobody waits for, handed from
//! the carriers to the side threads (`side.rs`), one queue and one thread
//! per lane ([`Lanes`]). Pushing never blocks and never wakes a side thread
//! unless it sleeps for want of copies; what bounds a queue is the nodes
//! that push (`run.rs`: each holds at most its `queue` of copies waiting or
//! on their way).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Copies waiting for the side thread.
pub struct Queue<T> {
    items: Mutex<Waiting<T>>,
    ready: Condvar,
}

struct Waiting<T> {
    copies: VecDeque<T>,
    closed: bool,
    /// The side thread waits for copies (only then is it woken: a wake-up
    /// is a system call, and copies need no haste).
    idle: bool,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            items: Mutex::new(Waiting { copies: VecDeque::new(), closed: false, idle: false }),
            ready: Condvar::new(),
        }
    }
}

impl<T> std::fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({} waiting)", self.lock().copies.len())
    }
}

impl<T> Queue<T> {
    fn lock(&self) -> MutexGuard<'_, Waiting<T>> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `copy` over; false once the queue is closed.
    pub fn push(&self, copy: T) -> bool {
        let mut q = self.lock();
        if q.closed {
            return false;
        }
        q.copies.push_back(copy);
        if std::mem::take(&mut q.idle) {
            self.ready.notify_one();
        }
        true
    }

    /// Waits for copies and moves up to `most` of them into `out`; false
    /// once the queue is closed and empty.
    pub fn pop(&self, most: usize, out: &mut Vec<T>) -> bool {
        let mut q = self.lock();
        while q.copies.is_empty() && !q.closed {
            q.idle = true;
            q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        q.idle = false;
        let n = q.copies.len().min(most);
        out.extend(q.copies.drain(..n));
        n > 0
    }

    /// No more copies: the side thread ends once it has carried the ones it holds.
    pub fn close(&self) {
        let mut q = self.lock();
        q.closed = true;
        q.copies.clear();
        self.ready.notify_all();
    }
}

/// How many side threads carry copies. A copy goes to the lane of the first
/// pool its route reaches (pools in the order of their names, round the
/// lanes), so copies to a pool that stalls wait behind copies to the pools
/// of their own lane only, not behind everyone's: a silent shadow pool no
/// longer makes all-initial drop its copies to healthy pools.
pub const LANES: usize = 4;

/// The side queues, one per lane.
#[derive(Debug)]
pub struct Lanes<T> {
    queues: Vec<Queue<T>>,
}

impl<T> Default for Lanes<T> {
    fn default() -> Self {
        Lanes { queues: (0..LANES).map(|_| Queue::default()).collect() }
    }
}

impl<T> Lanes<T> {
    /// The queue of `lane` (taken modulo [`LANES`]).
    pub fn lane(&self, lane: usize) -> &Queue<T> {
        &self.queues[lane % LANES]
    }

    /// No more copies on any lane.
    pub fn close(&self) {
        for q in &self.queues {
            q.close();
        }
    }
}

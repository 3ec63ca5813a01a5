//! The side queues: copies of requests that nobody waits for, handed from
//! the carriers to the side threads (`side.rs`), one queue and one thread
//! per lane ([`Lanes`]). Pushing never blocks and never wakes a side thread
//! unless it sleeps for want of copies; what bounds a queue is the nodes
//! that push (`run.rs`: each holds at most its `queue` of copies waiting or
//! on their way) and the bytes all of them hold together ([`Lanes::reserve`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// The side queues, one per lane, and the bytes of the copies on them.
#[derive(Debug)]
pub struct Lanes<T> {
    queues: Vec<Queue<T>>,
    /// Bytes of copies waiting or on their way, every node's of every tree
    /// (a reload's old tree too), and the most they may be: each node holds
    /// at most its own bound, but a tree may have a thousand shadow nodes
    /// (one per prefix), and twelve of them held 800 MB for one silent pool.
    held: AtomicU64,
    budget: u64,
}

/// What all copies may hold unless said otherwise: mwproxy's default
/// `memory_budget`.
pub const DEFAULT_BUDGET: u64 = 256 << 20;

impl<T> Default for Lanes<T> {
    fn default() -> Self {
        Lanes::with_budget(DEFAULT_BUDGET)
    }
}

impl<T> Lanes<T> {
    /// Lanes whose copies hold at most `budget` bytes together.
    pub fn with_budget(budget: u64) -> Lanes<T> {
        Lanes { queues: (0..LANES).map(|_| Queue::default()).collect(), held: AtomicU64::new(0), budget }
    }

    /// Counts `bytes` more held by copies, unless that would pass the
    /// budget (false: the copy is not made).
    pub fn reserve(&self, bytes: u64) -> bool {
        let before = self.held.fetch_add(bytes, Ordering::Relaxed);
        if before + bytes > self.budget {
            self.held.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// `bytes` reserved are held no more.
    pub fn release(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Bytes held by copies now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

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

//! The request queue between the net threads and the workers.
//!
//! What it holds is up to the middleware: mwproxy queues connections that
//! have requests waiting (their requests wait in the connection's own line),
//! mwmq queues requests. An entry is in the queue at most once.
//!
//! Two lines make it fair: **fresh** entries, put by a net thread when it
//! read a request, and entries sent **again** by a worker (after a bounded
//! batch, or when a parked request became ready). When both have entries,
//! workers take from them in turn, so a client with one request at a time
//! waits for at most about one batch, however many busy clients keep the
//! workers occupied, and those are never starved either. The fresh line is
//! bounded (`capacity`); when it is full the net thread stops reading and TCP
//! backpressure reaches the clients. The other line is bounded by whatever
//! bounds the entries (connections, parked requests).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

struct Lines<T> {
    fresh: VecDeque<T>,
    again: VecDeque<T>,
    closed: bool,
    idle_workers: usize,
}

/// Work waiting for a worker.
pub struct WorkQueue<T> {
    lines: Mutex<Lines<T>>,
    ready: Condvar,
    capacity: usize,
}

impl<T> WorkQueue<T> {
    /// A queue taking at most `capacity` fresh entries.
    pub fn new(capacity: usize) -> WorkQueue<T> {
        WorkQueue {
            lines: Mutex::new(Lines { fresh: VecDeque::new(), again: VecDeque::new(), closed: false, idle_workers: 0 }),
            ready: Condvar::new(),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lines<T>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues fresh work; gives it back when the fresh line is full.
    pub fn push_fresh(&self, item: T) -> Result<(), T> {
        let mut l = self.lock();
        if l.fresh.len() >= self.capacity {
            return Err(item);
        }
        l.fresh.push_back(item);
        self.wake(l);
        Ok(())
    }

    /// Queues work that is ready again (not bounded by the capacity).
    pub fn push_again(&self, item: T) {
        let mut l = self.lock();
        l.again.push_back(item);
        self.wake(l);
    }

    fn wake(&self, l: MutexGuard<'_, Lines<T>>) {
        let idle = l.idle_workers > 0;
        drop(l);
        if idle {
            self.ready.notify_one();
        }
    }

    /// The next entry; `turn` alternates between the lines when both have
    /// entries. Blocks while both are empty; `None` once the queue is closed
    /// and empty.
    pub fn pop(&self, turn: &mut bool) -> Option<T> {
        self.pop_inner(turn, None).unwrap_or(None)
    }

    /// Like [`WorkQueue::pop`], but waits at most `timeout`: `Err(())` when
    /// nothing came in time.
    #[allow(clippy::result_unit_err)]
    pub fn pop_timeout(&self, turn: &mut bool, timeout: Duration) -> Result<Option<T>, ()> {
        self.pop_inner(turn, Some(timeout))
    }

    fn pop_inner(&self, turn: &mut bool, timeout: Option<Duration>) -> Result<Option<T>, ()> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
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
                        return Ok(None);
                    }
                    l.idle_workers += 1;
                    l = match deadline {
                        None => self.ready.wait(l).unwrap_or_else(|p| p.into_inner()),
                        Some(d) => {
                            let left = d.saturating_duration_since(std::time::Instant::now());
                            if left.is_zero() {
                                l.idle_workers -= 1;
                                return Err(());
                            }
                            self.ready.wait_timeout(l, left).unwrap_or_else(|p| p.into_inner()).0
                        }
                    };
                    l.idle_workers -= 1;
                    continue;
                }
            };
            return Ok(if take_again { l.again.pop_front() } else { l.fresh.pop_front() });
        }
    }

    /// Takes up to `max` more entries for which `matches` holds, from
    /// anywhere in either line (oldest first), without waiting: a worker
    /// that batches compatible work calls it after [`WorkQueue::pop`].
    pub fn take_matching(&self, max: usize, mut matches: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        if max == 0 {
            return out;
        }
        let mut guard = self.lock();
        let l = &mut *guard;
        for line in [&mut l.fresh, &mut l.again] {
            let mut i = 0;
            while i < line.len() && out.len() < max {
                if matches(&line[i]) {
                    out.extend(line.remove(i));
                } else {
                    i += 1;
                }
            }
        }
        out
    }

    /// Entries waiting now.
    pub fn len(&self) -> usize {
        let l = self.lock();
        l.fresh.len() + l.again.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// No more fresh work will come: workers finish what is queued, then stop.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Whether [`WorkQueue::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_fresh_line_and_alternation() {
        let q = WorkQueue::new(2);
        assert!(q.push_fresh(1).is_ok());
        assert!(q.push_fresh(2).is_ok());
        assert_eq!(q.push_fresh(3), Err(3));
        q.push_again(10);
        q.push_again(11);
        let mut turn = false;
        let order: Vec<i32> = (0..4).map(|_| q.pop(&mut turn).unwrap()).collect();
        assert_eq!(order, [10, 1, 11, 2]);
        assert_eq!(q.pop_timeout(&mut turn, Duration::from_millis(5)), Err(()));
        q.close();
        assert_eq!(q.pop(&mut turn), None);
    }

    #[test]
    fn matching_entries_are_taken_from_both_lines() {
        let q = WorkQueue::new(8);
        for i in [1, 2, 3, 4] {
            q.push_fresh(i).unwrap();
        }
        q.push_again(6);
        assert_eq!(q.take_matching(2, |x| x % 2 == 0), [2, 4]);
        assert_eq!(q.take_matching(5, |x| x % 2 == 0), [6]);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn a_waiting_worker_is_woken() {
        let q = std::sync::Arc::new(WorkQueue::new(4));
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.pop(&mut false));
        std::thread::sleep(Duration::from_millis(20));
        q.push_fresh(7).unwrap();
        assert_eq!(t.join().unwrap(), Some(7));
    }
}

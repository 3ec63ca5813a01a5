//! Long polls: a `RECV ... WAIT ms` that finds nothing does not hold a
//! worker. The worker parks the request here and takes other work; a parked
//! request goes back to the request queue when its queue may have a message
//! for it (a SEND committed here, another process's notification, the poll,
//! the end of its wait: see `events.rs`, whose threads drive it).
//!
//! A wake-up that comes between a RECV finding nothing and its parking is
//! not lost: each queue has a sequence number of wake-ups, read before the
//! RECV and checked when parking.

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use mwserve::queue::WorkQueue;

use crate::job::{Job, Work};

#[derive(Default)]
pub(crate) struct State {
    #[allow(clippy::vec_box)] // jobs move between the queue and here as boxes
    parked: HashMap<String, Vec<Box<Job>>>,
    /// Requests that wait on several names (XREAD of several streams) are
    /// parked under their first: a wake-up of another name wakes it too.
    also: HashMap<String, HashSet<String>>,
    seq: HashMap<String, u64>,
    /// Queues with new messages not yet announced to other processes.
    pub(crate) announce: HashSet<String>,
    /// Maintenance asked for (a queue was dropped).
    pub(crate) tidy: bool,
    /// Run every parked request again now (the listener reconnected).
    pub(crate) poll_now: bool,
    pub(crate) stopping: bool,
}

/// RECVs waiting for messages.
pub struct Waiters {
    state: Mutex<State>,
    /// The timer thread waits on it: a request parked, mwmq is stopping.
    pub(crate) changed: Condvar,
    /// The notifier thread waits on it: a queue to announce, maintenance asked for.
    pub(crate) announced: Condvar,
    /// Other processes on the database hear of new messages (`database.notify`).
    notify: bool,
    /// Rung at every wake-up and at the stop: the async engine's waiting
    /// RECVs look at their queue's wake-up number again.
    pub bell: tokio::sync::Notify,
}

impl Waiters {
    /// Nobody waiting; new messages are announced to other processes when `notify`.
    pub fn new(notify: bool) -> Waiters {
        Waiters {
            state: Mutex::default(),
            changed: Condvar::new(),
            announced: Condvar::new(),
            notify,
            bell: Default::default(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The wake-up number of the queues or streams (the sum of theirs),
    /// read before a RECV or XREAD that may park.
    pub fn seq(&self, names: &[&str]) -> u64 {
        let s = self.lock();
        names.iter().map(|n| s.seq.get(*n).copied().unwrap_or(0)).fold(0, u64::wrapping_add)
    }

    /// Parks `job` unless a wake-up came since `seen` or mwmq is stopping:
    /// then the job is given back to be run again at once.
    pub fn park(&self, names: &[&str], job: Box<Job>, seen: u64) -> Result<(), Box<Job>> {
        let mut s = self.lock();
        let now = names.iter().map(|n| s.seq.get(*n).copied().unwrap_or(0)).fold(0, u64::wrapping_add);
        if s.stopping || now != seen || names.is_empty() {
            return Err(job);
        }
        let first = names[0].to_string();
        for other in &names[1..] {
            s.also.entry(other.to_string()).or_default().insert(first.clone());
        }
        s.parked.entry(first).or_default().push(job);
        drop(s);
        self.changed.notify_all();
        Ok(())
    }

    /// Requests parked now.
    pub fn parked(&self) -> usize {
        self.lock().parked.values().map(Vec::len).sum()
    }

    /// A message may be there for `queue`'s waiters: they run again.
    pub fn wake(&self, queue_of_work: &WorkQueue<Work>, queue: &str) {
        let jobs = {
            let mut s = self.lock();
            *s.seq.entry(queue.to_string()).or_insert(0) += 1;
            let mut jobs = s.parked.remove(queue).unwrap_or_default();
            for first in s.also.remove(queue).unwrap_or_default() {
                jobs.extend(s.parked.remove(&first).unwrap_or_default());
            }
            jobs
        };
        self.bell.notify_waiters();
        for job in jobs {
            requeue(queue_of_work, job);
        }
    }

    /// A SEND to `queue` committed here: wake local waiters and announce it.
    pub fn sent(&self, queue_of_work: &WorkQueue<Work>, queue: &str) {
        if self.notify {
            let fresh = self.lock().announce.insert(queue.to_string());
            if fresh {
                self.announced.notify_one();
            }
        }
        self.wake(queue_of_work, queue);
    }

    /// A queue was dropped: its messages are removed soon.
    pub fn dropped(&self, queue_of_work: &WorkQueue<Work>, queue: &str) {
        self.lock().tidy = true;
        self.announced.notify_one();
        self.wake(queue_of_work, queue);
    }

    /// Stopping: every parked request is answered now; none parks again.
    pub fn stop(&self, queue_of_work: &WorkQueue<Work>) {
        let all: Vec<Box<Job>> = {
            let mut s = self.lock();
            s.stopping = true;
            s.parked.drain().flat_map(|(_, v)| v).collect()
        };
        self.changed.notify_all();
        self.announced.notify_all();
        self.bell.notify_waiters();
        for mut job in all {
            job.last_try = true;
            requeue(queue_of_work, job);
        }
    }

    /// Runs every parked request again (the poll), and answers those whose wait is over.
    pub(crate) fn poll(&self, queue_of_work: &WorkQueue<Work>, now: Instant, everything: bool) -> Option<Instant> {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        {
            let mut s = self.lock();
            for jobs in s.parked.values_mut() {
                let mut keep = Vec::with_capacity(jobs.len());
                for mut job in jobs.drain(..) {
                    let until = job.wait_until.unwrap_or(now);
                    if job.conn.is_closed() {
                        // Its client left: answer into the void so the net thread frees it.
                        job.last_try = true;
                        due.push(job);
                    } else if until <= now {
                        job.last_try = true;
                        due.push(job);
                    } else if everything {
                        due.push(job);
                    } else {
                        next = Some(next.map_or(until, |n| n.min(until)));
                        keep.push(job);
                    }
                }
                *jobs = keep;
            }
            s.parked.retain(|_, v| !v.is_empty());
            if s.parked.is_empty() {
                s.also.clear();
            }
        }
        for job in due {
            requeue(queue_of_work, job);
        }
        next
    }
}

fn requeue(queue_of_work: &WorkQueue<Work>, mut job: Box<Job>) {
    let now = mwstats::clock::now_ns();
    if let Some(at) = job.parked_at.take() {
        job.parked_ns += now.saturating_sub(at);
    }
    job.t_enqueue = now;
    queue_of_work.push_again(Work::Request(job));
}

//! What happened to each queue since this process started: messages sent,
//! received, acknowledged, NACKed, dead-lettered and dropped (QINFO's totals
//! and `/metrics`' `mwmq_queue_*` series). What a queue holds now comes from
//! the database (`QINFO`).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// One queue's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Messages sent to it.
    pub sent: u64,
    /// Messages handed out (RECV leases, POPs).
    pub received: u64,
    /// ACKs that found their lease current.
    pub acked: u64,
    /// NACKs that found their lease current.
    pub nacked: u64,
    /// Messages moved to its dead-letter queue.
    pub dead_lettered: u64,
    /// Messages over the delivery limit dropped (no dead-letter queue).
    pub dropped: u64,
}

impl Counts {
    /// Names and values, in output order.
    pub fn fields(&self) -> [(&'static str, u64); 6] {
        [
            ("sent", self.sent),
            ("received", self.received),
            ("acked", self.acked),
            ("nacked", self.nacked),
            ("dead_lettered", self.dead_lettered),
            ("dropped", self.dropped),
        ]
    }
}

/// Every queue's counters.
#[derive(Debug, Default)]
pub struct PerQueue(Mutex<BTreeMap<String, Counts>>);

impl PerQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Counts>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes `queue`'s counters.
    pub fn add(&self, queue: &str, f: impl FnOnce(&mut Counts)) {
        let mut m = self.lock();
        match m.get_mut(queue) {
            Some(c) => f(c),
            None => f(m.entry(queue.to_string()).or_default()),
        }
    }

    /// `queue`'s counters.
    pub fn get(&self, queue: &str) -> Counts {
        self.lock().get(queue).copied().unwrap_or_default()
    }

    /// Every queue's, by name.
    pub fn all(&self) -> Vec<(String, Counts)> {
        self.lock().iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// A dropped queue is forgotten.
    pub fn forget(&self, queue: &str) {
        self.lock().remove(queue);
    }
}

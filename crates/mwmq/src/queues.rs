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

/// QINFO's database figures per queue, kept for `[queues] info_cache_ms`:
/// clients looping on QINFO cost the database one count a queue per period,
/// not one per request (8 of them pushed a neighbour's SEND to 276 ms). At
/// most [`INFO_CACHE_MAX`] queues are kept; past that, expired entries go.
#[derive(Debug, Default)]
pub struct InfoCache(Mutex<std::collections::HashMap<String, (std::time::Instant, crate::db::QueueState)>>);

/// Queues whose QINFO figures are kept at most.
pub const INFO_CACHE_MAX: usize = 10_000;

impl InfoCache {
    /// `queue`'s figures if they are younger than `ttl`.
    pub fn get(&self, queue: &str, ttl: std::time::Duration) -> Option<crate::db::QueueState> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(queue).filter(|(at, _)| at.elapsed() < ttl).map(|(_, s)| s.clone())
    }

    /// Keeps `queue`'s figures, read just now.
    pub fn put(&self, queue: &str, state: crate::db::QueueState, ttl: std::time::Duration) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= INFO_CACHE_MAX {
            m.retain(|_, (at, _)| at.elapsed() < ttl);
            if m.len() >= INFO_CACHE_MAX {
                return;
            }
        }
        m.insert(queue.to_string(), (std::time::Instant::now(), state));
    }

    /// A dropped or changed queue's figures are forgotten.
    pub fn forget(&self, queue: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(queue);
    }
}

/// Queues lately found not plain (paused, limited or with a delivery limit),
/// whose RECVs therefore go straight to `mwmq_recv` instead of first trying
/// the plain statement (or the batch's) that cannot serve them: a statement
/// fewer per RECV. Remembered for [`NOT_PLAIN_FOR`]: a queue made plain
/// again is served by the plain statements that much later, and meanwhile
/// by `mwmq_recv`, which serves any queue. At most [`INFO_CACHE_MAX`] queues.
#[derive(Debug, Default)]
pub struct NotPlain(Mutex<std::collections::HashMap<String, std::time::Instant>>);

/// How long a queue found not plain is remembered.
pub const NOT_PLAIN_FOR: std::time::Duration = std::time::Duration::from_secs(1);

impl NotPlain {
    /// Whether `queue` was found not plain within [`NOT_PLAIN_FOR`].
    pub fn is(&self, queue: &str) -> bool {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(queue).is_some_and(|at| at.elapsed() < NOT_PLAIN_FOR)
    }

    /// `queue` was found not plain just now.
    pub fn found(&self, queue: &str) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= INFO_CACHE_MAX {
            m.retain(|_, at| at.elapsed() < NOT_PLAIN_FOR);
            if m.len() >= INFO_CACHE_MAX {
                return;
            }
        }
        m.insert(queue.to_string(), std::time::Instant::now());
    }
}

/// The queues known to be paused, per database: read from each database at
/// every maintenance pass (`maintenance_s`) and changed at once by this
/// process's own QPAUSE and QRESUME; `/metrics` shows them.
#[derive(Debug, Default)]
pub struct Paused(Mutex<std::collections::BTreeMap<usize, std::collections::BTreeSet<String>>>);

impl Paused {
    /// `queue` of database `db` paused (`on`) or resumed.
    pub fn set(&self, db: usize, queue: &str, on: bool) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let set = m.entry(db).or_default();
        if on {
            set.insert(queue.to_string());
        } else {
            set.remove(queue);
        }
    }

    /// Database `db`'s paused queues are `names`.
    pub fn refresh(&self, db: usize, names: impl IntoIterator<Item = String>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(db, names.into_iter().collect());
    }

    /// Every paused queue, by name.
    pub fn names(&self) -> Vec<String> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let all: std::collections::BTreeSet<&String> = m.values().flatten().collect();
        all.into_iter().cloned().collect()
    }
}

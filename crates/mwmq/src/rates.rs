//! Each queue's rates over the last minutes, for the `/ui` page's charts:
//! a thread samples this process's per-queue counters ([`crate::queues`])
//! every `[queues] rates_sample_ms` (10 s) and keeps what changed in each
//! of the last [`SAMPLES`] periods. A queue nothing happened to in a period costs nothing in it,
//! so the memory follows the queues in use, not the queues that exist.
//! (Counted by this process: behind a load balancer, each mwmq shows its
//! own share.)

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::queues::Counts;

/// Periods kept (ten minutes at the default period).
pub const SAMPLES: usize = 60;

/// What happened to a queue in one period: messages sent, handed out,
/// acknowledged and dead-lettered.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// SENDs.
    pub sent: u32,
    /// Handed out (RECV, POP).
    pub received: u32,
    /// ACKs.
    pub acked: u32,
    /// Dead-lettered or dropped over the delivery limit.
    pub dead: u32,
}

impl Moved {
    fn between(before: &Counts, now: &Counts) -> Moved {
        let d = |a: u64, b: u64| u32::try_from(b.saturating_sub(a)).unwrap_or(u32::MAX);
        Moved {
            sent: d(before.sent, now.sent),
            received: d(before.received, now.received),
            acked: d(before.acked, now.acked),
            dead: d(before.dead_lettered + before.dropped, now.dead_lettered + now.dropped),
        }
    }
}

/// One period: when it ended (ms since 1970) and the queues that moved in it.
type Period = (u64, HashMap<Arc<str>, Moved>);

/// The periods kept, oldest first, and the counters of the last sample.
type Kept = (VecDeque<Period>, HashMap<Arc<str>, Counts>);

/// The last periods' movements, and the counters they were taken from.
#[derive(Debug, Default)]
pub struct History {
    inner: Mutex<Kept>,
}

/// A queue's series: one value per period kept, oldest first, per second.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize)]
pub struct Series {
    /// SENDs per second.
    pub sent: Vec<f64>,
    /// Messages handed out per second.
    pub received: Vec<f64>,
    /// ACKs per second.
    pub acked: Vec<f64>,
    /// Dead letters per second.
    pub dead: Vec<f64>,
}

impl History {
    /// Takes a sample of `counts` (every queue's counters) at `now_ms`.
    pub fn sample(&self, counts: Vec<(String, Counts)>, now_ms: u64) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (periods, last) = &mut *g;
        let mut moved = HashMap::new();
        let mut seen = HashMap::with_capacity(counts.len());
        for (name, c) in counts {
            let name: Arc<str> = last.get_key_value(name.as_str()).map_or_else(|| name.into(), |(k, _)| k.clone());
            let m = Moved::between(last.get(&name).unwrap_or(&Counts::default()), &c);
            if m != Moved::default() {
                moved.insert(name.clone(), m);
            }
            seen.insert(name, c);
        }
        // A queue no longer counted (dropped) is forgotten with its counters.
        *last = seen;
        periods.push_back((now_ms, moved));
        while periods.len() > SAMPLES {
            periods.pop_front();
        }
    }

    /// `queue`'s rates in the periods kept (each `period` long), oldest
    /// first, and when the last ended.
    pub fn series(&self, queue: &str, period: Duration) -> (Series, u64) {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let per_s = |n: u32| f64::from(n) / period.as_secs_f64();
        let mut s = Series::default();
        for (_, moved) in &g.0 {
            let m = moved.get(queue).copied().unwrap_or_default();
            s.sent.push(per_s(m.sent));
            s.received.push(per_s(m.received));
            s.acked.push(per_s(m.acked));
            s.dead.push(per_s(m.dead));
        }
        (s, g.0.back().map_or(0, |p| p.0))
    }

    /// Queues that moved in some period kept (memory use, for tests).
    pub fn tracked(&self) -> usize {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.iter().map(|p| p.1.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(sent: u64, acked: u64) -> Counts {
        Counts { sent, acked, ..Counts::default() }
    }

    #[test]
    fn rates_per_period_and_only_what_moved_is_kept() {
        let h = History::default();
        h.sample(vec![("a".into(), counts(5, 0)), ("idle".into(), counts(7, 7))], 10_000);
        h.sample(vec![("a".into(), counts(105, 20)), ("idle".into(), counts(7, 7))], 20_000);
        h.sample(vec![("a".into(), counts(105, 50)), ("idle".into(), counts(7, 7))], 30_000);
        let ten = Duration::from_secs(10);
        let (a, end) = h.series("a", ten);
        assert_eq!(end, 30_000);
        // The first period counts from zero (the process's start).
        assert_eq!(a.sent, vec![0.5, 10.0, 0.0]);
        assert_eq!(a.acked, vec![0.0, 2.0, 3.0]);
        assert_eq!(h.series("idle", ten).0.sent, vec![0.7, 0.0, 0.0]);
        assert_eq!(h.series("never", ten).0.sent, vec![0.0, 0.0, 0.0]);
        // Entries: a in each of three periods, idle in the first only.
        assert_eq!(h.tracked(), 4);
        for i in 0..SAMPLES as u64 + 5 {
            h.sample(vec![("a".into(), counts(105 + i, 50))], 40_000 + i);
        }
        assert_eq!(h.series("a", ten).0.sent.len(), SAMPLES, "at most SAMPLES periods");
        assert_eq!(h.series("idle", ten).0.sent, vec![0.0; SAMPLES], "a dropped queue is forgotten");
    }
}

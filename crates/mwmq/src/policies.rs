//! A job queue's policies on top of a queue (schema 17,
//! `sql/0017_priorities_backoff.sql`): priorities and retry backoff.
//!
//! **Priorities.** `SEND q body PRIORITY n` (and `mwmq.send(..., priority
//! => n)`) gives a message a priority from 0 to [`MAX_PRIORITY`]; a
//! message without one has 0. Within a queue the highest priority ready is
//! handed out first, and within one priority the messages go in the order
//! they became visible, as every message did before (first come, first
//! served). The range and its direction are pg-boss's (an integer, higher
//! first, 0 the default), in Oban's ten levels: a default at the bottom
//! means that a queue never given a priority behaves as before, and a
//! message sent with any priority passes every message sent without.
//!
//! Ordered groups still go in the order sent, whatever the priorities of
//! their messages (a group's head with priority 0 holds its priority-9
//! successors back); limits (CONCURRENCY, RATE) bound how many messages
//! go, priorities which; dead letters keep their priority, and REDRIVE and
//! `mwmq rebalance` carry it along.
//!
//! The `ready` index is `(queue_id, priority DESC, visible_at, id)`. A walk
//! over that index ordered as it is would step over every leased and
//! delayed message of the higher priorities (they sit after the visible
//! ones of their priority, before the next priority's), and PostgreSQL 15
//! has no skip scan; so each statement that hands messages out walks the
//! ten priorities, highest first, and in each takes the visible messages as
//! before, with `priority = p AND visible_at <= now()` as one index range
//! (a priority without a message costs a descent). The statements stop at
//! the first priorities that give them enough, so the lower ones are only
//! looked at when the higher ones run out. (Walking only the priorities
//! present, found by a loose index scan — a recursive descent to the
//! highest priority below the last — took longer to plan than the ten
//! ranges take to look at, and each descent stepped again over the index
//! entries of the messages taken since the last vacuum.)
//!
//! A queue that never held a message of another priority than 0 is served
//! by the statements of before (`recv_plain`, `recv_many`, `pop`, `peek`:
//! priority 0's one index range). Walking every queue's priorities cost a
//! plain queue's RECV+ACK pairs a third of their rate (`bench/mq-features.sh`
//! against the build before): the walking statements take twice as long to
//! plan. So a queue is marked `prioritized` when the first message of
//! another priority is stored in it, whichever way (SEND, `mwmq.send`, a
//! dead letter, REDRIVE, a tick, rebalance), by the statement that stores
//! it, in that message's transaction: a statement that sees the message
//! sees the mark. (A trigger on every insert did it first, at a quarter of
//! a SEND's time in the database.) The mark stays. The statements of before answer
//! a marked queue with a row saying so and lease nothing; the `*_ranked`
//! statements then walk its priorities, and the process remembers the
//! queue for a second ([`crate::shared::Shared::prioritized`]). Statements
//! that count (QINFO, QLIST PENDING, the poll of waiting RECVs) walk
//! through `mwmq_walk`, which is priority 0 alone for an unmarked queue.
//!
//! The mark updates the queue's row, which an application's transaction
//! that sent the queue's first message with a priority holds until it
//! ends. A RESP SEND with a priority waited for it (its statement's update),
//! holding a database connection until the statement timeout. So a SEND
//! with a priority to a queue not known to be marked marks it first, in a
//! statement of its own that waits at most 100 ms (`mwmq_prioritize`,
//! schema 19), and is refused with -TRYAGAIN when another transaction holds
//! the row longer (for a second, without asking the database again,
//! [`crate::shared::Shared::being_marked`]); once the mark is committed the
//! SEND's statement updates nothing and waits for nothing.
//!
//! **Backoff.** `QALTER q BACKOFF base_ms max_ms [JITTER pct]` makes a
//! message that was handed out and came back — its lease ran out, or it was
//! NACKed without DELAY — wait `min(max, base × 2^(deliveries−1))`, plus or
//! minus `pct` percent of that at random, before it is handed out again
//! (`mwmq_backoff`). `QALTER q NOBACKOFF` turns it off. A NACK with a
//! DELAY, even `DELAY 0`, waits that DELAY instead. With MAXDELIVERIES the
//! last delivery is followed by no backoff: once it fails, the next RECV
//! moves the message to the dead letters. Every statement that leases
//! (RECV's plain ones, and `mwmq_recv_ranked` for queues with limits or a
//! delivery limit) gives each lease its backoff at once: the row's
//! `visible_at` is the lease's end plus the backoff, and `lease_until` the
//! lease's end, so that a lease whose time
//! is over counts against CONCURRENCY and in QINFO's `leased` no longer
//! (QINFO counts it as `delayed`), TOUCH moves the lease's end and keeps
//! the backoff after it, and the database needs nothing to happen when a
//! lease runs out. An ACK after the lease's end still acknowledges, as it
//! did before.

use std::fmt;

/// The highest priority (the lowest is 0).
pub const MAX_PRIORITY: u8 = 9;

/// The longest BACKOFF base or maximum: a day, in ms.
pub const MAX_BACKOFF_MS: i64 = 24 * 3600 * 1000;

/// `PRIORITY n` checked: 0 to [`MAX_PRIORITY`].
pub fn priority(n: i64) -> Result<u8, String> {
    match u8::try_from(n) {
        Ok(p) if p <= MAX_PRIORITY => Ok(p),
        _ => Err(format!("PRIORITY must be between 0 and {MAX_PRIORITY} (higher is handed out first)")),
    }
}

/// A queue's retry backoff (`QALTER q BACKOFF base_ms max_ms [JITTER pct]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first delivery, ms.
    pub base_ms: u64,
    /// The longest wait, ms (before the jitter).
    pub max_ms: u64,
    /// Plus or minus this percent of the wait, at random.
    pub jitter_pct: u8,
}

impl Backoff {
    /// A policy checked: a base of 1 ms to a day, a maximum from the base to a
    /// day, a jitter of 0 to 100 percent.
    pub fn new(base_ms: i64, max_ms: i64, jitter_pct: i64) -> Result<Backoff, String> {
        if !(1..=MAX_BACKOFF_MS).contains(&base_ms) {
            return Err(format!("BACKOFF's base must be between 1 and {MAX_BACKOFF_MS} ms, not {base_ms}"));
        }
        if max_ms < base_ms || max_ms > MAX_BACKOFF_MS {
            return Err(format!(
                "BACKOFF's max ({max_ms} ms) must be at least its base ({base_ms} ms) and at most {MAX_BACKOFF_MS} ms"
            ));
        }
        if !(0..=100).contains(&jitter_pct) {
            return Err(format!("JITTER must be between 0 and 100 (percent), not {jitter_pct}"));
        }
        Ok(Backoff { base_ms: base_ms as u64, max_ms: max_ms as u64, jitter_pct: jitter_pct as u8 })
    }

    /// The wait after `deliveries` deliveries before the jitter, ms: what
    /// `mwmq_backoff` computes in the database.
    pub fn delay_ms(&self, deliveries: u32) -> f64 {
        let doubled = self.base_ms as f64 * 2f64.powi(deliveries.clamp(1, 63) as i32 - 1);
        doubled.min(self.max_ms as f64)
    }

    /// The bounds of the wait after `deliveries` deliveries, jitter included, ms.
    pub fn bounds_ms(&self, deliveries: u32) -> (f64, f64) {
        let d = self.delay_ms(deliveries);
        let j = f64::from(self.jitter_pct) / 100.0;
        (d * (1.0 - j), d * (1.0 + j))
    }
}

impl fmt::Display for Backoff {
    /// As QALTER takes it (`100 5000 JITTER 20`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} JITTER {}", self.base_ms, self.max_ms, self.jitter_pct)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_the_maximum() {
        let b = Backoff::new(100, 1000, 0).unwrap();
        let waits: Vec<f64> = (1..=6).map(|d| b.delay_ms(d)).collect();
        assert_eq!(waits, [100.0, 200.0, 400.0, 800.0, 1000.0, 1000.0]);
        assert_eq!(b.delay_ms(u32::MAX), 1000.0, "no overflow however often it came back");
        let j = Backoff::new(100, 1000, 20).unwrap();
        assert_eq!(j.bounds_ms(2), (160.0, 240.0));
        assert_eq!(j.to_string(), "100 1000 JITTER 20");
    }

    #[test]
    fn out_of_range_is_refused_with_the_range() {
        assert_eq!(priority(0), Ok(0));
        assert_eq!(priority(9), Ok(9));
        for bad in [-1, 10, 256, i64::MAX] {
            assert!(priority(bad).unwrap_err().contains("between 0 and 9"), "{bad}");
        }
        assert!(Backoff::new(0, 10, 0).is_err());
        assert!(Backoff::new(10, 5, 0).is_err());
        assert!(Backoff::new(10, MAX_BACKOFF_MS + 1, 0).is_err());
        assert!(Backoff::new(10, 10, -1).is_err());
        assert!(Backoff::new(10, 10, 100).is_ok());
    }
}

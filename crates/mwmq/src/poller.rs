//! The shared poll of waiting requests: one statement per database every
//! `poll_ms`, whatever the number of clients waiting, in place of every
//! waiting client running its own statement every `poll_ms`.
//!
//! Waiting requests (parked RECVs, XREADs and XREADGROUPs of the pool
//! engine, the async engine's waits) say what they look for
//! ([`Interest`]); the poller thread asks the database which of those may be
//! there now and rings the waiters of those names only ([`Waiters::wake`]):
//!
//! - a queue: a message visible now, for anyone or for one of the receivers
//!   waiting (what a lease that ran out, a DELAY that ended or a lost
//!   notification leaves), in a queue that is not paused; or no such queue
//!   any more (its waiters are answered NOQUEUE);
//! - a stream read by XREAD: a last id past the one the reader waits after;
//! - a stream read by a consumer group: the group's last delivered id behind
//!   the stream's last id, or no such group any more.
//!
//! The answer says how many: a queue's visible messages for each receiver
//! waiting, a group's entries not delivered yet (each counted up to the
//! number of its waiters), and only that many waiters are rung, the oldest
//! first ([`Waiters::ring`]); XREADs of a stream that grew, the waiters of a
//! name that is gone and waits that look at every poll are all rung.
//!
//! The question is stateless: a poll that failed (the database away) or ran
//! late misses nothing, the next one asks again. SENDs and XADDs of this
//! process wake their waiters at once (`waiters.rs`); the poll is the
//! fallback and the only way a lease's end or a DELAY's end reaches a
//! waiter. A waiter whose queue holds visible messages it cannot take
//! (addressed to others, held by a group's order, a concurrency or rate
//! limit) is rung at every poll and looks again, as every waiter did
//! before, as many of them as there are such messages.
//!
//! **Notifications are hints.** Another process's NOTIFY on mwmq's channel
//! (`events.rs`), which any role that can log in to the database can send
//! too, wakes nobody by itself: it names a queue or stream for the poller,
//! which asks the same question about the hinted names only, once for all
//! the hints that came since its last look and at most every `wake_ms`. A
//! flood of notifications costs one statement per `wake_ms` at most, rings
//! nobody when there is nothing, and never more waiters than there are
//! messages.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::db::{DbError, PgConn};
use crate::shared::Shared;
use crate::waiters::{Interest, Ring, Who};
use crate::xcommand::Sid;

/// One database's question: what the waiters of each name may find, with
/// how many of them to ring (-1: all). Kind 0: a queue (per receiver), 1: a
/// stream read after an id, 2: a consumer group. A count stops at the
/// number waiting.
const MAY_HAVE: &str = "
SELECT 0, w.n, w.me, CASE WHEN q.id IS NULL THEN -1 ELSE (
        SELECT count(*) FROM (
            SELECT 1 FROM mwmq_walk(q.id, q.prioritized) AS v(pr)
            JOIN mwmq_messages m ON m.queue_id = q.id AND m.priority = v.pr
            WHERE m.visible_at <= now() AND (m.receiver IS NULL OR m.receiver = w.me)
            LIMIT w.k) AS x) END
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS w(n, me, k)
LEFT JOIN mwmq_queues q ON q.name = w.n AND q.dropped_at IS NULL
WHERE q.id IS NULL
   OR (NOT q.paused AND EXISTS (
        SELECT 1 FROM mwmq_walk(q.id, q.prioritized) AS v(pr)
        JOIN mwmq_messages m ON m.queue_id = q.id AND m.priority = v.pr
        WHERE m.visible_at <= now() AND (m.receiver IS NULL OR m.receiver = w.me)))
UNION ALL
SELECT 1, a.n, NULL, -1 FROM unnest($4::text[], $5::bigint[], $6::bigint[]) AS a(n, ms, seq)
JOIN mwmq_streams s ON s.name = a.n
WHERE (s.last_ms, s.last_seq) > (a.ms, a.seq)
UNION ALL
SELECT 2, g.n, g.grp, CASE WHEN sg.stream_id IS NULL THEN -1 ELSE (
        SELECT count(*) FROM (
            SELECT 1 FROM mwmq_stream_entries e
            WHERE e.stream_id = s.id AND (e.ms, e.seq) > (sg.last_ms, sg.last_seq)
            LIMIT g.k) AS x) END
FROM unnest($7::text[], $8::text[], $9::bigint[]) AS g(n, grp, k)
LEFT JOIN mwmq_streams s ON s.name = g.n
LEFT JOIN mwmq_stream_groups sg ON sg.stream_id = s.id AND sg.name = g.grp
WHERE sg.stream_id IS NULL OR (sg.last_ms, sg.last_seq) < (s.last_ms, s.last_seq)";

/// What one database is asked, each name once (an XREAD stream with the
/// earliest id waited after), with how many wait for it.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Question {
    queues: BTreeMap<(String, Option<String>), usize>,
    after: BTreeMap<String, Sid>,
    groups: BTreeMap<(String, String), usize>,
    /// Rung at every poll without asking.
    any: BTreeSet<String>,
}

impl Question {
    /// Adds what `waiting` requests look for.
    pub fn add(&mut self, i: Interest, waiting: usize) {
        match i {
            Interest::Queue { name, me } => {
                *self.queues.entry((name, me)).or_default() += waiting;
            }
            Interest::After(name, id) => {
                let at = self.after.entry(name).or_insert(id);
                *at = (*at).min(id);
            }
            Interest::Group(name, group) => {
                *self.groups.entry((name, group)).or_default() += waiting;
            }
            Interest::Any(name) => {
                self.any.insert(name);
            }
        }
    }

    /// Whether the database need not be asked.
    fn nothing_to_ask(&self) -> bool {
        self.queues.is_empty() && self.after.is_empty() && self.groups.is_empty()
    }

    /// What rings without asking.
    fn rings_anyway(&self) -> Vec<Ring> {
        self.any.iter().map(|n| Ring { name: n.clone(), who: Who::Any, n: usize::MAX }).collect()
    }

    /// The waiters to ring, asking the database on `pg`.
    async fn ask(&self, pg: &PgConn) -> Result<Vec<Ring>, DbError> {
        let mut ring = self.rings_anyway();
        if self.nothing_to_ask() {
            return Ok(ring);
        }
        let count = |n: &usize| i64::try_from(*n).unwrap_or(i64::MAX);
        let qn: Vec<&str> = self.queues.keys().map(|(n, _)| n.as_str()).collect();
        let qme: Vec<Option<&str>> = self.queues.keys().map(|(_, me)| me.as_deref()).collect();
        let qk: Vec<i64> = self.queues.values().map(count).collect();
        let an: Vec<&str> = self.after.keys().map(String::as_str).collect();
        let ams: Vec<i64> = self.after.values().map(|s| s.ms).collect();
        let aseq: Vec<i64> = self.after.values().map(|s| s.seq).collect();
        let gn: Vec<&str> = self.groups.keys().map(|(n, _)| n.as_str()).collect();
        let gg: Vec<&str> = self.groups.keys().map(|(_, g)| g.as_str()).collect();
        let gk: Vec<i64> = self.groups.values().map(count).collect();
        let rows = pg.checked(pg.client().query(MAY_HAVE, &[&qn, &qme, &qk, &an, &ams, &aseq, &gn, &gg, &gk]).await)?;
        for r in rows {
            let (kind, name, who, n): (i32, String, Option<String>, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
            let (who, n) = match (kind, n) {
                (_, -1) => (Who::Everyone, usize::MAX),
                (0, n) => (Who::Queue(who), usize::try_from(n).unwrap_or(0)),
                (2, n) => (Who::Group(who.unwrap_or_default()), usize::try_from(n).unwrap_or(0)),
                _ => (Who::Readers, usize::MAX),
            };
            if n > 0 {
                ring.push(Ring { name, who, n });
            }
        }
        Ok(ring)
    }
}

/// What the poller looks at next: everything (the poll), or the names hinted.
enum Look {
    All,
    Hinted(HashSet<String>),
}

/// Waits for the next look: the poll every `poll_ms` (or at once when the
/// listener reconnected), or hints, at most every `wake_ms`; `None` when
/// mwmq stops.
fn next_look(shared: &Shared, next_poll: &mut Instant, next_hint: &mut Instant) -> Option<Look> {
    let w = &shared.waiters;
    let every = Duration::from_millis(shared.config.queues.poll_ms.max(1));
    let gap = Duration::from_millis(shared.config.queues.wake_ms);
    let mut s = w.lock();
    let look = loop {
        if s.stopping {
            return None;
        }
        let now = Instant::now();
        if std::mem::take(&mut s.poll_now) || now >= *next_poll {
            s.hinted.clear();
            *next_poll = now + every;
            break Look::All;
        }
        if !s.hinted.is_empty() && now >= *next_hint {
            break Look::Hinted(std::mem::take(&mut s.hinted));
        }
        let until = if s.hinted.is_empty() { *next_poll } else { (*next_poll).min(*next_hint) };
        s = w.look.wait_timeout(s, until - now).unwrap_or_else(|p| p.into_inner()).0;
    };
    *next_hint = Instant::now() + gap;
    Some(look)
}

/// The poller thread: every `poll_ms` (and at once when the listener
/// reconnected), while requests wait, asks each database that holds what
/// they wait for, on a connection borrowed from the pool (under the
/// statement deadline, as the workers' statements), and rings the waiters
/// that may find something; between polls, the same for the names that
/// notifications hinted. Runs until mwmq stops.
pub fn run_poller_thread(shared: Arc<Shared>) {
    let w = &shared.waiters;
    let mut next_poll = Instant::now() + Duration::from_millis(shared.config.queues.poll_ms.max(1));
    let mut next_hint = Instant::now();
    while let Some(look) = next_look(&shared, &mut next_poll, &mut next_hint) {
        let mut questions: Vec<Question> = (0..shared.pool.len()).map(|_| Question::default()).collect();
        for (i, waiting) in w.wanted() {
            if let Look::Hinted(names) = &look {
                if !names.contains(i.name()) {
                    continue;
                }
            }
            questions[shared.pool.home(i.name())].add(i, waiting);
        }
        for (d, question) in questions.iter().enumerate() {
            let rings = if question.nothing_to_ask() {
                Ok(question.rings_anyway())
            } else {
                w.polls.fetch_add(1, Ordering::Relaxed);
                shared.pool[d].with(async |pg| question.ask(pg).await).and_then(|r| r)
            };
            match rings {
                Ok(rings) => {
                    for r in rings {
                        w.ring(&shared.queue, &r);
                    }
                }
                // The next poll asks again; SENDs here still wake.
                Err(e) => tracing::debug!("shared poll: {e:?}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_is_asked_once_with_the_earliest_id() {
        let mut q = Question::default();
        let id = |ms, seq| Sid { ms, seq };
        q.add(Interest::After("s".into(), id(5, 1)), 1);
        q.add(Interest::After("s".into(), id(3, 9)), 1);
        q.add(Interest::After("s".into(), id(4, 0)), 1);
        for _ in 0..3 {
            q.add(Interest::Queue { name: "q".into(), me: None }, 2);
            q.add(Interest::Group("s".into(), "g".into()), 1);
        }
        assert_eq!(q.after.get("s"), Some(&id(3, 9)));
        assert_eq!(q.queues.get(&("q".to_string(), None)), Some(&6));
        assert_eq!(q.groups.get(&("s".to_string(), "g".to_string())), Some(&3));
        assert!(!q.nothing_to_ask());
        let mut only_any = Question::default();
        only_any.add(Interest::Any("s".into()), 1);
        assert!(only_any.nothing_to_ask());
    }
}

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
//! The question is stateless: a poll that failed (the database away) or ran
//! late misses nothing, the next one asks again. SENDs, XADDs and other
//! processes' notifications wake waiters at once, as before (`events.rs`);
//! the poll is the fallback and the only way a lease's end or a DELAY's
//! end reaches a waiter. A waiter whose queue holds visible messages it
//! cannot take (addressed to others, held by a group's order, a
//! concurrency or rate limit) is rung at every poll and looks again, as
//! every waiter did before.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::db::{DbError, PgConn};
use crate::shared::Shared;
use crate::waiters::Interest;
use crate::xcommand::Sid;

/// One database's question: the names whose waiters may find something.
const MAY_HAVE: &str = "
SELECT w.n FROM unnest($1::text[], $2::text[]) AS w(n, me)
LEFT JOIN mwmq_queues q ON q.name = w.n AND q.dropped_at IS NULL
WHERE q.id IS NULL
   OR (NOT q.paused AND EXISTS (
        SELECT 1 FROM mwmq_messages m
        WHERE m.queue_id = q.id AND m.visible_at <= now() AND (m.receiver IS NULL OR m.receiver = w.me)))
UNION
SELECT a.n FROM unnest($3::text[], $4::bigint[], $5::bigint[]) AS a(n, ms, seq)
JOIN mwmq_streams s ON s.name = a.n
WHERE (s.last_ms, s.last_seq) > (a.ms, a.seq)
UNION
SELECT g.n FROM unnest($6::text[], $7::text[]) AS g(n, grp)
LEFT JOIN mwmq_streams s ON s.name = g.n
LEFT JOIN mwmq_stream_groups sg ON sg.stream_id = s.id AND sg.name = g.grp
WHERE sg.stream_id IS NULL OR (sg.last_ms, sg.last_seq) < (s.last_ms, s.last_seq)";

/// What one database is asked, each name once (an XREAD stream with the
/// earliest id waited after).
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Question {
    queues: BTreeSet<(String, Option<String>)>,
    after: BTreeMap<String, Sid>,
    groups: BTreeSet<(String, String)>,
    /// Rung at every poll without asking.
    any: BTreeSet<String>,
}

impl Question {
    /// Adds what one waiting request looks for.
    pub fn add(&mut self, i: Interest) {
        match i {
            Interest::Queue { name, me } => {
                self.queues.insert((name, me));
            }
            Interest::After(name, id) => {
                let at = self.after.entry(name).or_insert(id);
                *at = (*at).min(id);
            }
            Interest::Group(name, group) => {
                self.groups.insert((name, group));
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

    /// The names to ring, asking the database on `pg`.
    async fn ask(&self, pg: &PgConn) -> Result<BTreeSet<String>, DbError> {
        let mut ring = self.any.clone();
        if self.nothing_to_ask() {
            return Ok(ring);
        }
        let (qn, qme): (Vec<&str>, Vec<Option<&str>>) =
            self.queues.iter().map(|(n, me)| (n.as_str(), me.as_deref())).unzip();
        let an: Vec<&str> = self.after.keys().map(String::as_str).collect();
        let ams: Vec<i64> = self.after.values().map(|s| s.ms).collect();
        let aseq: Vec<i64> = self.after.values().map(|s| s.seq).collect();
        let (gn, gg): (Vec<&str>, Vec<&str>) = self.groups.iter().map(|(n, g)| (n.as_str(), g.as_str())).unzip();
        let rows = pg.checked(pg.client().query(MAY_HAVE, &[&qn, &qme, &an, &ams, &aseq, &gn, &gg]).await)?;
        ring.extend(rows.iter().map(|r| r.get::<_, String>(0)));
        Ok(ring)
    }
}

/// The poller thread: every `poll_ms` (and at once when the listener
/// reconnected), while requests wait, asks each database that holds what
/// they wait for, on a connection borrowed from the pool (under the
/// statement deadline, as the workers' statements), and rings the names
/// that may have something. Runs until mwmq stops.
pub fn run_poller_thread(shared: Arc<Shared>) {
    let w = &shared.waiters;
    let every = Duration::from_millis(shared.config.queues.poll_ms.max(1));
    let mut next = Instant::now() + every;
    loop {
        {
            let mut s = w.lock();
            loop {
                if s.stopping {
                    return;
                }
                if std::mem::take(&mut s.poll_now) {
                    break;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                s = w.changed.wait_timeout(s, next - now).unwrap_or_else(|p| p.into_inner()).0;
            }
        }
        next = Instant::now() + every;
        let mut questions: Vec<Question> = (0..shared.pool.len()).map(|_| Question::default()).collect();
        for i in w.wanted() {
            questions[shared.pool.home(i.name())].add(i);
        }
        for (d, question) in questions.iter().enumerate() {
            let ring = if question.nothing_to_ask() {
                Ok(question.any.clone())
            } else {
                w.polls.fetch_add(1, Ordering::Relaxed);
                shared.pool[d].with(async |pg| question.ask(pg).await).and_then(|r| r)
            };
            match ring {
                Ok(names) => {
                    for name in names {
                        w.wake(&shared.queue, &name);
                    }
                }
                // The next poll asks again; SENDs and notifications still wake.
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
        q.add(Interest::After("s".into(), id(5, 1)));
        q.add(Interest::After("s".into(), id(3, 9)));
        q.add(Interest::After("s".into(), id(4, 0)));
        for _ in 0..3 {
            q.add(Interest::Queue { name: "q".into(), me: None });
            q.add(Interest::Group("s".into(), "g".into()));
        }
        assert_eq!(q.after.get("s"), Some(&id(3, 9)));
        assert_eq!(q.queues.len(), 1);
        assert_eq!(q.groups.len(), 1);
        assert!(!q.nothing_to_ask());
        let mut only_any = Question::default();
        only_any.add(Interest::Any("s".into()));
        assert!(only_any.nothing_to_ask());
    }
}

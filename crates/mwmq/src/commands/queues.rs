//! QCREATE, QALTER, QDROP, QLEN, QINFO, QLIST, REDRIVE, QPAUSE, QRESUME, QARCHIVE, QDEAD.

use super::{Core, Outcome, Session};
use crate::command::QueueOptions;
use crate::db::{DbError, PgConn, QueueState};
use crate::queues::Counts;
use crate::resp::Reply;
use crate::users::Right;

/// What a name weighs in QLIST's reply, at most (200 bytes and RESP's framing).
pub const LISTED_NAME: usize = 256;

/// QINFO's answer: what the queue holds now (from the database) and what
/// this process has seen happen to it since start.
pub fn queue_info(state: &QueueState, counts: &Counts) -> Reply {
    let t = Reply::text;
    let mut fields = vec![
        (t("ready"), Reply::Int(state.ready)),
        (t("delayed"), Reply::Int(state.delayed)),
        (t("leased"), Reply::Int(state.leased)),
        (t("oldest_ready_ms"), Reply::Int(state.oldest_ready_ms)),
        (t("max_deliveries"), Reply::Int(i64::from(state.max_deliveries))),
        (t("dead_letter"), state.dead_letter.clone().map(Reply::text).unwrap_or(Reply::Nil)),
        (t("dead_letters_held"), Reply::Int(state.dead_letters_held)),
        (t("max_messages"), Reply::Int(state.max_messages)),
        (t("max_bytes"), Reply::Int(state.max_bytes)),
        (t("counted_messages"), Reply::Int(state.counted_messages)),
        (t("counted_bytes"), Reply::Int(state.counted_bytes)),
        (t("paused"), Reply::Int(i64::from(state.paused))),
        (t("concurrency"), Reply::Int(state.concurrency)),
        (t("rate_per_sec"), Reply::text(format_rate(state.rate))),
        (t("held_by_concurrency"), Reply::Int(state.held_by_concurrency)),
        (t("held_by_rate"), Reply::Int(state.held_by_rate)),
        (t("retain_ms"), Reply::Int(state.retain_ms)),
        (t("archived"), Reply::Int(state.archived)),
        (
            t("ready_by_priority"),
            Reply::Map(
                state.ready_by_priority.iter().map(|(p, n)| (Reply::text(p.to_string()), Reply::Int(*n))).collect(),
            ),
        ),
        (t("backoff_base_ms"), Reply::Int(state.backoff.map_or(0, |b| b.base_ms as i64))),
        (t("backoff_max_ms"), Reply::Int(state.backoff.map_or(0, |b| b.max_ms as i64))),
        (t("backoff_jitter_pct"), Reply::Int(state.backoff.map_or(0, |b| i64::from(b.jitter_pct)))),
    ];
    fields.extend(counts.fields().into_iter().map(|(k, v)| (t(k), Reply::Int(v as i64))));
    Reply::Map(fields)
}

/// A rate as QINFO shows it: deliveries per second, without trailing zeros (0: no limit).
fn format_rate(r: f64) -> String {
    let t = format!("{r:.3}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Whether QCREATE or QALTER names a dead-letter queue that does not exist.
async fn dead_letter_missing(pg: &PgConn, options: &QueueOptions) -> Result<bool, DbError> {
    match &options.dead_letter {
        Some(Some(target)) => Ok(!pg.queue_exists(target).await?),
        _ => Ok(false),
    }
}

fn no_dead_letter(options: &QueueOptions) -> DbError {
    DbError::NoQueue(options.dead_letter.clone().flatten().unwrap_or_default())
}

impl Core<'_> {
    /// How long QINFO's database figures are kept.
    pub fn info_ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.shared.config.queues.info_cache_ms)
    }

    /// QINFO from its recent database figures, if it was asked lately: no database needed.
    pub fn cached_info(&self, q: &str) -> Option<Reply> {
        let state = self.shared.info_cache.get(q, self.info_ttl())?;
        Some(queue_info(&state, &self.shared.queues.get(q)))
    }

    pub(super) async fn create<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        q: &str,
        options: &QueueOptions,
        s: &S,
    ) -> Result<Outcome, DbError> {
        if let Some(refused) = self.dead_letter_apart(q, options) {
            return Ok(refused);
        }
        if dead_letter_missing(pg, options).await? {
            return Err(no_dead_letter(options));
        }
        let (who, cap) = self.creator(s);
        pg.create(q, options, who.as_deref(), cap.map(|c| c.max(0) as u64)).await?;
        Ok(Outcome::ok(Reply::Simple("OK")))
    }

    pub(super) async fn alter(&self, pg: &PgConn, q: &str, options: &QueueOptions) -> Result<Outcome, DbError> {
        if let Some(refused) = self.dead_letter_apart(q, options) {
            return Ok(refused);
        }
        if dead_letter_missing(pg, options).await? {
            return Err(no_dead_letter(options));
        }
        match pg.alter(q, options).await {
            // Not a queue: maybe a stream (its MAXMESSAGES, MAXBYTES).
            Err(DbError::NoQueue(_)) => return self.alter_stream(pg, q, options).await,
            r => r?,
        }
        self.shared.info_cache.forget(q);
        if options.concurrency.is_some() || options.rate_milli.is_some() {
            // A limit raised or lifted may let parked RECVs have messages.
            self.sent(q);
        }
        Ok(Outcome::ok(Reply::Simple("OK")))
    }

    /// QARCHIVE: `[id, sender, body, deliveries, acked_at_ms, acked_by]` each, newest first.
    pub(super) async fn archive(&self, pg: &PgConn, q: &str, count: u32) -> Result<Outcome, DbError> {
        let kept = pg.archived(q, count, self.max_reply()).await?;
        let rows = kept
            .into_iter()
            .map(|a| {
                Reply::Array(vec![
                    Reply::Int(a.id),
                    Reply::text(a.sender),
                    Reply::Bulk(a.body),
                    Reply::Int(a.deliveries),
                    Reply::Int(a.acked_at_ms),
                    a.acked_by.map(Reply::text).unwrap_or(Reply::Nil),
                ])
            })
            .collect();
        Ok(Outcome::ok(Reply::Array(rows)))
    }

    /// QDEAD: `[id, queue, from, reason, deliveries, sender, sent_at_ms, body]`
    /// each, last dead-lettered first.
    pub(super) async fn dead_letters(&self, pg: &PgConn, q: &str, count: u32) -> Result<Outcome, DbError> {
        let dead = pg.dead_letters(q, count, self.max_reply()).await?;
        let rows = dead
            .into_iter()
            .map(|d| {
                Reply::Array(vec![
                    Reply::Int(d.id),
                    Reply::text(d.queue),
                    Reply::text(d.from),
                    d.reason.map(Reply::text).unwrap_or(Reply::Nil),
                    Reply::Int(d.deliveries),
                    Reply::text(d.sender),
                    Reply::Int(d.sent_at_ms),
                    Reply::Bulk(d.body),
                ])
            })
            .collect();
        Ok(Outcome::ok(Reply::Array(rows)))
    }

    /// QPAUSE (`on`) or QRESUME: a resumed queue's parked RECVs look again at once.
    pub(super) async fn pause(&self, pg: &PgConn, q: &str, on: bool) -> Result<Outcome, DbError> {
        pg.pause(q, on).await?;
        self.shared.info_cache.forget(q);
        self.shared.paused.set(pg.db, q, on);
        if !on {
            self.sent(q);
        }
        Ok(Outcome::ok(Reply::Simple("OK")))
    }

    pub(super) async fn redrive(
        &self,
        pg: &PgConn,
        queue: &str,
        to: Option<&str>,
        count: u32,
    ) -> Result<Outcome, DbError> {
        if let Some(refused) = to.and_then(|t| self.apart(queue, t, "REDRIVE's target")) {
            return Ok(refused);
        }
        let moved = pg.redrive(queue, to, count).await?;
        if let Some(t) = to {
            self.sent(t);
        }
        Ok(Outcome::ok(Reply::Int(moved)))
    }

    /// A DEADLETTER target on another database than its queue, refused.
    fn dead_letter_apart(&self, q: &str, options: &QueueOptions) -> Option<Outcome> {
        match &options.dead_letter {
            Some(Some(target)) => self.apart(q, target, "the dead-letter queue"),
            _ => None,
        }
    }

    pub(super) async fn queue_info(&self, pg: &PgConn, q: &str) -> Result<Outcome, DbError> {
        let state = match pg.info(q).await {
            // Not a queue: maybe a stream (its counts and limits).
            Err(DbError::NoQueue(_)) => return self.stream_info(pg, q).await,
            r => r?,
        };
        self.shared.info_cache.put(q, state.clone(), self.info_ttl());
        Ok(Outcome::ok(queue_info(&state, &self.shared.queues.get(q))))
    }

    pub(super) async fn drop_queue(&self, pg: &PgConn, q: &str) -> Result<Outcome, DbError> {
        pg.drop_queue(q).await?;
        self.shared.waiters.dropped(&self.shared.queue, q);
        self.shared.queues.forget(q);
        self.shared.info_cache.forget(q);
        Ok(Outcome::ok(Reply::Simple("OK")))
    }

    /// The most names QLIST answers: a name weighs at most
    /// [`LISTED_NAME`] bytes, and the reply at most `max_reply_bytes`.
    pub(super) fn most_listed(&self) -> usize {
        self.shared.config.server.max_reply_bytes / LISTED_NAME
    }

    /// QLIST's refusal when there are more queues than a reply may hold.
    pub(super) fn too_many_listed(&self) -> Outcome {
        Outcome::Reply(
            Reply::err(format!(
                "QLIST would list more than {} queues, more than a reply may hold (max_reply_bytes / {LISTED_NAME})",
                self.most_listed()
            )),
            Vec::new(),
            "client_error",
        )
    }

    pub(super) async fn list<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        pending: bool,
        s: &S,
    ) -> Result<Outcome, DbError> {
        let me = s.identity();
        let most = self.most_listed();
        let user = s.user();
        // PENDING: what this connection may take now, so the receive right;
        // otherwise any right lets a user see a queue. The database leaves
        // the others out, so that the bound counts only what is shown.
        let right = if pending { Right::Receive } else { Right::See };
        let like: Option<Vec<String>> =
            user.as_ref().map(|u| u.patterns(right).iter().map(|p| crate::sqlguard::like_pattern(p)).collect());
        let mut names = pg.list(pending.then_some(me.as_deref()), most as i64 + 1, like.as_deref()).await?;
        if names.len() > most {
            return Ok(self.too_many_listed());
        }
        if let Some(user) = user {
            // (The database matched the same patterns; this is a second look.)
            names.retain(|q| user.may(right, q));
        }
        Ok(Outcome::ok(Reply::Array(names.into_iter().map(Reply::text).collect())))
    }
}

//! QSCHEDULE, QUNSCHEDULE, QSCHEDULES: periodic jobs (the ticker that
//! sends their messages is `ticker.rs`, their time `schedule.rs`).
//!
//! A schedule lives on its queue's database (QSCHEDULE runs there, its
//! name unique there); QUNSCHEDULE and QSCHEDULES ask every database, as
//! QLIST does. Rights: QSCHEDULE needs the admin right on the queue (and,
//! replacing a schedule, on the queue it sent to); QUNSCHEDULE the admin
//! right on the schedule's queue, checked in its statement, which knows the
//! queue; QSCHEDULES lists the schedules of the queues the user may see,
//! filtered by the database so that its bound on the reply
//! (`max_reply_bytes` / [`LISTED_SCHEDULE`], refused past it as QLIST is)
//! counts only what it would show. A schedule whose owner lost the right
//! is listed as `suspended`, with why (`ticker.rs`).
//! A user has at most `max_schedules` schedules (default 100), counted on
//! every database: with several, a creation first counts the user's
//! schedules on the others (one statement each; creations are rare), with
//! the race `owned.rs` describes for `max_queues`.

use super::carry::Databases;
use super::{Core, DbFacts, Outcome, Session};
use crate::command::{Command, Schedule};
use crate::db::schedules::{NewSchedule, ScheduleRow};
use crate::db::{DbError, PgConn};
use crate::resp::Reply;
use crate::users::Right;

/// What one schedule weighs in QSCHEDULES' reply, at most (its names,
/// expression, zone, prefix and group of at most 200 bytes each, why it is
/// suspended of at most [`crate::ticker::MAX_REASON`], the field names and
/// numbers: a test encodes the heaviest).
pub const LISTED_SCHEDULE: usize = 3072;

fn client_error(message: String) -> Outcome {
    Outcome::Reply(Reply::err(message), Vec::new(), "client_error")
}

/// A schedule as QSCHEDULES shows it.
fn listed(r: ScheduleRow) -> Reply {
    let t = |s: &str| Reply::text(s);
    let ms = |v: Option<i64>| v.map(Reply::Int).unwrap_or(Reply::Nil);
    Reply::Map(vec![
        (t("name"), Reply::text(r.name)),
        (t("queue"), Reply::text(r.queue)),
        (t("cron"), Reply::text(r.cron)),
        (t("tz"), Reply::text(r.tz)),
        (t("catchup"), Reply::text(r.catchup)),
        (t("key_prefix"), Reply::text(r.key_prefix)),
        (t("body_bytes"), Reply::Int(r.body_bytes)),
        (t("created_by"), r.created_by.map(Reply::text).unwrap_or(Reply::Nil)),
        (t("next_run_ms"), ms(r.next_ms)),
        (t("last_tick_ms"), ms(r.last_tick_ms)),
        (t("last_run_ms"), ms(r.last_run_ms)),
        (t("last_id"), ms(r.last_id)),
        (t("priority"), Reply::Int(r.priority)),
        (t("group"), r.group.map(Reply::text).unwrap_or(Reply::Nil)),
        (t("delay_ms"), Reply::Int(r.delay_ms)),
        (t("sent"), Reply::Int(r.sent)),
        (t("missed"), Reply::Int(r.missed)),
        (t("refused"), Reply::Int(r.refused)),
        (t("skipped"), Reply::Int(r.skipped)),
        (t("state"), Reply::text(if r.suspended.is_some() { "suspended" } else { "active" })),
        (t("reason"), r.suspended.map(Reply::text).unwrap_or(Reply::Nil)),
    ])
}

/// The name of a listed schedule (to merge the databases' lists).
fn name_of(r: &Reply) -> Option<&[u8]> {
    match r {
        Reply::Map(fields) => match fields.first() {
            Some((_, Reply::Bulk(b))) => Some(b),
            _ => None,
        },
        _ => None,
    }
}

impl<'a> Core<'a> {
    /// The same commands, knowing that the user creating a schedule has
    /// `n` schedules on the other databases.
    fn with_schedules_elsewhere(self, n: i64) -> Core<'a> {
        Core { schedules_elsewhere: n, ..self }
    }

    /// With several databases, before a QSCHEDULE on `home`: the user's
    /// schedules on the others, or the refusal of a name one of them holds.
    pub(super) async fn before_schedule<S: Session + ?Sized, D: Databases>(
        &self,
        dbs: &D,
        x: &Schedule,
        s: &S,
        home: usize,
    ) -> Result<Result<Core<'a>, Outcome>, DbError> {
        let user = s.user().map(|u| u.name.clone());
        let mut n = 0;
        for d in (0..dbs.count()).filter(|d| *d != home) {
            let mut facts = DbFacts::default();
            let (mine, taken) =
                dbs.on(d, &mut facts, async |pg, _| pg.schedules_here(user.as_deref(), &x.name).await).await?;
            if taken {
                let there = self.shared.pool.placement.name(d);
                return Ok(Err(client_error(format!(
                    "schedule '{}' exists on database '{there}' (with its queue); QUNSCHEDULE it first to make it send to \
                     '{}'",
                    x.name, x.queue
                ))));
            }
            n += mine;
        }
        Ok(Ok(self.with_schedules_elsewhere(n)))
    }

    /// QSCHEDULE: `OK`, once the schedule is stored with its first tick.
    pub(super) async fn schedule<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        x: &Schedule,
        s: &S,
    ) -> Result<Outcome, DbError> {
        let max = self.shared.config.server.max_body;
        if x.sent_len() > max {
            return Ok(client_error(format!(
                "a body of {} bytes (with {{tick}} replaced) is over the limit of {max} bytes (max_body)",
                x.sent_len()
            )));
        }
        let timetable = match x.timetable() {
            Ok(t) => t,
            Err(e) => return Ok(client_error(e)),
        };
        let now = pg.clock_us().await?;
        let now = chrono::DateTime::from_timestamp_micros(now).unwrap_or_default();
        let first = match timetable.first_after(now) {
            Ok(t) => t,
            Err(e) => return Ok(client_error(e)),
        };
        let user = s.user();
        let sender = user.as_ref().map_or_else(|| x.name.clone(), |u| u.name.clone());
        let admin_like: Option<Vec<String>> =
            user.as_ref().map(|u| u.admin_patterns().iter().map(|p| crate::sqlguard::like_pattern(p)).collect());
        let row = NewSchedule {
            name: &x.name,
            queue: &x.queue,
            cron: &x.cron,
            tz: &x.tz,
            body: &x.body,
            key_prefix: &x.key_prefix,
            catchup: x.catchup.name(),
            sender: &sender,
            who: user.as_ref().map(|u| u.name.as_str()),
            admin_like,
            cap: user.as_ref().map(|u| i64::try_from(u.max_schedules).unwrap_or(i64::MAX)),
            elsewhere: self.schedules_elsewhere,
            next_us: first.timestamp_micros(),
            priority: i16::from(x.priority),
            group: x.group.as_deref(),
            delay_ms: i64::try_from(x.delay_ms).unwrap_or(i64::MAX),
        };
        pg.schedule_put(&row).await?;
        Ok(Outcome::ok(Reply::Simple("OK")))
    }

    /// QUNSCHEDULE on one database: 1 if it removed the schedule, 0 if it has none so named.
    pub(super) async fn unschedule<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        name: &str,
        s: &S,
    ) -> Result<Outcome, DbError> {
        let user = s.user();
        let admin_like: Option<Vec<String>> =
            user.as_ref().map(|u| u.admin_patterns().iter().map(|p| crate::sqlguard::like_pattern(p)).collect());
        match pg.unschedule(name, admin_like.as_deref()).await? {
            None => Ok(Outcome::ok(Reply::Int(0))),
            Some((_, true)) => Ok(Outcome::ok(Reply::Int(1))),
            Some((_queue, false)) => {
                // (Not the queue's name: it may be one the user may not even see.)
                let u = user.expect("only a user's patterns refuse");
                Err(DbError::Redis(format!(
                    "NOPERM User {} has no permissions to administer the queue schedule '{name}' sends to",
                    u.name
                )))
            }
        }
    }

    /// The most schedules QSCHEDULES answers (each at most [`LISTED_SCHEDULE`] bytes).
    fn most_schedules(&self) -> usize {
        self.shared.config.server.max_reply_bytes / LISTED_SCHEDULE
    }

    fn too_many_schedules(&self) -> Outcome {
        client_error(format!(
            "QSCHEDULES would list more than {} schedules, more than a reply may hold (max_reply_bytes / \
             {LISTED_SCHEDULE})",
            self.most_schedules()
        ))
    }

    /// QSCHEDULES on one database: those of the queues the user may see
    /// (chosen by the database, so that only they count), by name.
    pub(super) async fn schedules<S: Session + ?Sized>(&self, pg: &PgConn, s: &S) -> Result<Outcome, DbError> {
        let most = self.most_schedules();
        let user = s.user();
        let see_like: Option<Vec<String>> =
            user.as_ref().map(|u| u.see_patterns().iter().map(|p| crate::sqlguard::like_pattern(p)).collect());
        let mut rows = pg.schedules(see_like.as_deref(), most as i64 + 1).await?;
        if rows.len() > most {
            return Ok(self.too_many_schedules());
        }
        if let Some(user) = user {
            // (The database matched the same patterns; this is a second look.)
            rows.retain(|r| user.may(Right::See, &r.queue));
        }
        Ok(Outcome::ok(Reply::Array(rows.into_iter().map(listed).collect())))
    }

    /// QUNSCHEDULE's answers from every database as one: how many removed
    /// (a name is on one database), or the first refusal.
    pub(super) fn merge_unscheduled(&self, answers: Vec<Result<Outcome, DbError>>) -> Result<Outcome, DbError> {
        let mut removed = 0;
        for a in answers {
            match a? {
                Outcome::Reply(Reply::Int(n), _, _) => removed += n,
                other => return Ok(other),
            }
        }
        Ok(Outcome::ok(Reply::Int(removed)))
    }

    /// QSCHEDULES' answers from every database as one, by name.
    pub(super) fn merge_schedules(&self, answers: Vec<Result<Outcome, DbError>>) -> Result<Outcome, DbError> {
        let mut all = Vec::new();
        for a in answers {
            match a? {
                Outcome::Reply(Reply::Array(items), _, _) => all.extend(items),
                other => return Ok(other),
            }
        }
        if all.len() > self.most_schedules() {
            return Ok(self.too_many_schedules());
        }
        all.sort_by(|a, b| name_of(a).cmp(&name_of(b)));
        Ok(Outcome::ok(Reply::Array(all)))
    }

    /// Merges the answers of a command that ran on every database.
    pub(super) fn merge(&self, c: &Command, answers: Vec<Result<Outcome, DbError>>) -> Result<Outcome, DbError> {
        match c {
            Command::Unschedule(_) => self.merge_unscheduled(answers),
            Command::Schedules => self.merge_schedules(answers),
            _ => self.merge_lists(answers),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heaviest_schedule_fits_its_weight() {
        let long = |n: usize| "x".repeat(n);
        let row = ScheduleRow {
            name: long(crate::schedule::MAX_SCHEDULE_NAME),
            queue: long(crate::words::MAX_NAME),
            cron: long(crate::schedule::MAX_EXPRESSION),
            tz: long(64),
            catchup: "none".into(),
            key_prefix: long(crate::schedule::MAX_KEY_PREFIX),
            body_bytes: i64::MAX,
            created_by: Some(long(crate::words::MAX_NAME)),
            next_ms: Some(i64::MIN),
            last_tick_ms: Some(i64::MIN),
            last_run_ms: Some(i64::MIN),
            last_id: Some(i64::MIN),
            sent: i64::MIN,
            missed: i64::MIN,
            refused: i64::MIN,
            priority: i64::MIN,
            group: Some(long(crate::words::MAX_NAME)),
            delay_ms: i64::MIN,
            skipped: i64::MIN,
            suspended: Some(long(crate::ticker::MAX_REASON)),
        };
        let reply = listed(row);
        for resp3 in [false, true] {
            let n = reply.to_bytes_as(resp3).len();
            assert!(n <= LISTED_SCHEDULE, "{n} bytes (resp3 {resp3})");
        }
    }
}
